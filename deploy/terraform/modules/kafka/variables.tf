variable "namespace" {
  description = "Namespace of the operator and the Kafka cluster (created if missing)."
  type        = string
  default     = "meridian-kafka"
}

variable "strimzi_version" {
  description = "Version of Strimzi's operator chart (0.48 runs Kafka 4.1 in KRaft mode)."
  type        = string
  default     = "0.48.0"
}

variable "strimzi_repository" {
  description = "Helm repository of Strimzi's chart (a mirror of it, in an air-gapped cluster)."
  type        = string
  default     = "https://strimzi.io/charts/"
}

variable "cluster_name" {
  description = "Name of the Kafka cluster resource."
  type        = string
  default     = "meridian"
}

variable "kafka_version" {
  description = "Kafka version the operator runs (one Strimzi supports)."
  type        = string
  default     = "4.1.0"
}

variable "nodes" {
  description = "Kafka nodes (each both KRaft controller and broker): 3 or more, odd, for a KRaft quorum."
  type        = number
  default     = 3
  validation {
    condition     = var.nodes >= 3 && var.nodes % 2 == 1
    error_message = "nodes must be odd and at least 3 (the KRaft controller quorum)."
  }
}

variable "storage_size" {
  description = "Volume of each node."
  type        = string
  default     = "100Gi"
}

variable "changes_partitions" {
  description = "Partitions of meridian.changes (the change log; ordering is per dataset key)."
  type        = number
  default     = 12
}

variable "external_listener" {
  description = "Expose Kafka to the other regions' clusters with a LoadBalancer per broker."
  type        = bool
  default     = true
}
