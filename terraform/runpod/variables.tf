variable "node_count" {
  description = "GPU pods in the pool (the terraform provisioner passes -var node_count=N)"
  type        = number
  default     = 1
}

variable "pool" {
  type    = string
  default = "cloud"
}

variable "head_address" {
  description = "The Ray head's GCS address, host:port, reachable from the pods (e.g. over a VPN)"
  type        = string
}

variable "gpu_type" {
  description = "A RunPod GPU type id, e.g. \"NVIDIA L40S\""
  type        = string
  default     = "NVIDIA L40S"
}

variable "gpus_per_node" {
  type    = number
  default = 1
}

variable "image" {
  description = "An image built from deploy/docker/Dockerfile.gpu, or a stock one with CUDA, Python 3.11 and Ray (with project_source)"
  type        = string
}

variable "project_source" {
  description = "Empty: the image has the project. Else what the pod installs at its start (deploy/install-node.sh --source): a git+https:// URL or a wheel's URL"
  type        = string
  default     = ""
}

variable "install_ollama" {
  description = "With project_source: install Ollama too at the pod's start"
  type        = bool
  default     = false
}

variable "cloud_type" {
  type    = string
  default = "SECURE"
}

variable "disk_gb" {
  type    = number
  default = 200
}
