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
  description = "An image with CUDA, Python 3.11 and gpu-pool-serve[gpu] installed"
  type        = string
}

variable "cloud_type" {
  type    = string
  default = "SECURE"
}

variable "disk_gb" {
  type    = number
  default = 200
}
