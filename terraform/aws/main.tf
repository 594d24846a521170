# GPU nodes that join a running Ray head as members of one pool. Each boots, installs the
# project with the gpu extra and runs `ray start --address=HEAD --resources='{"pool_<pool>": 1}'`,
# so Serve can place the pool's replicas there as soon as it joins.
locals {
  resources = jsonencode({ "pool_${var.pool}" = 1 })
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
    python3 -m pip install '${var.project_source}#egg=gpu-pool-serve[gpu]'
    ray start --address='${var.head_address}' --num-gpus=${var.gpus_per_node} \
      --resources='${local.resources}'
  EOT

  tags = {
    Name                  = "gpu-pool-serve-${var.pool}-${count.index}"
    "gpu-pool-serve"      = "true"
    "gpu-pool-serve/pool" = var.pool
  }
}
