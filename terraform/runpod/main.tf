# GPU pods that join a running Ray head as members of one pool: the container's start command
# is `ray start --block` against the head, with the pool's resource.
locals {
  resources = jsonencode({ "pool_${var.pool}" = 1 })
  ray_start = [
    "ray", "start", "--block",
    "--address=${var.head_address}",
    "--num-gpus=${var.gpus_per_node}",
    "--resources=${local.resources}",
  ]
  # An image built from deploy/docker/Dockerfile.gpu ran the install step every node and image
  # shares (deploy/install-node.sh) when it was built. On a stock image (project_source set) the
  # pod runs it at its start, carried in the command: the pod has no checkout.
  install_node = filebase64("${path.module}/../../deploy/install-node.sh")
  install_then_start = [
    "bash", "-c", join(" && ", [
      "echo ${local.install_node} | base64 -d > /tmp/gps-install-node",
      "GPS_INSTALL_OLLAMA=${var.install_ollama ? 1 : 0} bash /tmp/gps-install-node gpu --source '${var.project_source}'",
      "exec ${join(" ", [for word in local.ray_start : "'${word}'"])}",
    ]),
  ]
}

resource "runpod_pod" "node" {
  count                = var.node_count
  name                 = "gpu-pool-serve-${var.pool}-${count.index}"
  image_name           = var.image
  gpu_type_id          = var.gpu_type
  gpu_count            = var.gpus_per_node
  cloud_type           = var.cloud_type
  container_disk_in_gb = var.disk_gb
  docker_start_cmd     = var.project_source == "" ? local.ray_start : local.install_then_start
}
