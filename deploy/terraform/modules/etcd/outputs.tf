output "client_endpoints" {
  description = "Every member's client endpoint (host:port), for MERIDIAN_ETCD."
  value       = local.client_endpoints
}

output "initial_cluster" {
  description = "The --initial-cluster every member was given."
  value       = local.initial_cluster
}

output "local_members" {
  description = "Names of the members created in this region."
  value       = local.local_members
}

output "values" {
  description = "The chart values of this region's release (for review in a plan)."
  value       = local.values
}
