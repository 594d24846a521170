# GPU pods that join a running Ray head as members of one pool: the container's start command
# is `ray start --block` against the head, with the pool's resource.
locals {
  resources = jsonencode({ "pool_${var.pool}" = 1 })
}

resource "runpod_pod" "node" {
  count                = var.node_count
  name                 = "gpu-pool-serve-${var.pool}-${count.index}"
  image_name           = var.image
  gpu_type_id          = var.gpu_type
  gpu_count            = var.gpus_per_node
  cloud_type           = var.cloud_type
  container_disk_in_gb = var.disk_gb
  docker_start_cmd = [
    "ray", "start", "--block",
    "--address=${var.head_address}",
    "--num-gpus=${var.gpus_per_node}",
    "--resources=${local.resources}",
  ]
}
