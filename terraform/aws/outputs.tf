output "node_addresses" {
  description = "Private IPs of the pool's nodes"
  value       = aws_instance.node[*].private_ip
}

output "node_ids" {
  value = aws_instance.node[*].id
}
