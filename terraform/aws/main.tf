# GPU nodes that join a running Ray head as members of one pool. Each boots, installs the
# project with the gpu extra and runs `ray start --address=HEAD --resources='{"pool_<pool>": 1}'`,
# so Serve can place the pool's replicas there as soon as it joins.
locals {
  resources = jsonencode({ "pool_${var.pool}" = 1 })
  # The install step every node and image shares, carried in the user data: the node has no
  # checkout, so it installs `project_source` (--source).
  install_node = filebase64("${path.module}/../../deploy/install-node.sh")
}

resource "aws_instance" "node" {
  count                  = var.node_count
  ami                    = var.ami
  instance_type          = var.instance_type
  key_name               = var.key_name
  subnet_id              = var.subnet_id
  vpc_security_group_ids = var.security_group_ids

  root_block_device {
    volume_size = var.disk_gb
  }

  user_data = <<-EOT
    #!/bin/bash
    set -euo pipefail
    echo '${local.install_node}' | base64 -d > /usr/local/sbin/gps-install-node
    GPS_INSTALL_OLLAMA=${var.install_ollama ? 1 : 0} \
      bash /usr/local/sbin/gps-install-node gpu --source '${var.project_source}'
    ray start --address='${var.head_address}' --num-gpus=${var.gpus_per_node} \
      --resources='${local.resources}'
  EOT

  tags = {
    Name                  = "gpu-pool-serve-${var.pool}-${count.index}"
    "gpu-pool-serve"      = "true"
    "gpu-pool-serve/pool" = var.pool
  }
}
