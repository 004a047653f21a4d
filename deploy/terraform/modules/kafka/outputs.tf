output "bootstrap_internal" {
  description = "Bootstrap address inside the Kafka cluster's own Kubernetes cluster."
  value       = "${var.cluster_name}-kafka-bootstrap.${var.namespace}.svc:9092"
}

output "topics" {
  description = "Topics the cluster chart creates."
  value       = ["meridian.changes", "meridian.dlq"]
}
