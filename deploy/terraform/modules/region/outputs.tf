output "release" {
  description = "Name, namespace and status of the release."
  value = {
    name      = helm_release.meridian.name
    namespace = helm_release.meridian.namespace
    status    = helm_release.meridian.status
  }
}

output "agent_endpoint" {
  description = "The region's agent API inside its cluster (host:port)."
  value       = "meridian-agent.${var.namespace}.svc:7070"
}

output "values" {
  description = "The chart values this module set (for review in a plan)."
  value       = local.values
}
