variable "node_count" {
  description = "GPU nodes in the pool (the terraform provisioner passes -var node_count=N)"
  type        = number
  default     = 1
}

variable "pool" {
  description = "The pool the nodes join: they carry the Ray resource pool_<pool>"
  type        = string
  default     = "cloud"
}

variable "head_address" {
  description = "The Ray head's GCS address, host:port, reachable from the new nodes"
  type        = string
}

variable "region" {
  type    = string
  default = "us-west-2"
}

variable "instance_type" {
  description = "A GPU instance type, e.g. g6e.xlarge (1 x L40S)"
  type        = string
  default     = "g6e.xlarge"
}

variable "gpus_per_node" {
  type    = number
  default = 1
}

variable "ami" {
  description = "An image with the NVIDIA driver and Python 3.11 (e.g. a Deep Learning AMI)"
  type        = string
}

variable "project_source" {
  description = "What the node installs (deploy/install-node.sh --source): a git+https:// URL, or a wheel's https:// or file:// URL"
  type        = string
  default     = "git+https://github.com/your-org/gpu-pool-serve.git"
}

variable "install_ollama" {
  description = "Install Ollama too (deploy/install-node.sh), for a CPU fallback run on these nodes"
  type        = bool
  default     = false
}

variable "key_name" {
  type    = string
  default = null
}

variable "subnet_id" {
  description = "A subnet from which the head's port 6379 (and Ray's node ports) is reachable"
  type        = string
}

variable "security_group_ids" {
  type = list(string)
}

variable "disk_gb" {
  type    = number
  default = 300
}
