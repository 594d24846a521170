output "node_addresses" {
  description = "The pods' ids (RunPod addresses pods by id; Ray sees them by their own IPs)"
  value       = runpod_pod.node[*].id
}
