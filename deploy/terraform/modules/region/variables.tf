variable "region" {
  description = "This cluster's region, as named in the replication policy."
  type        = string
  validation {
    condition     = can(regex("^[a-z0-9]([a-z0-9-]*[a-z0-9])?$", var.region))
    error_message = "region must be a DNS label (lower-case letters, digits and dashes), e.g. eu-west."
  }
}

variable "namespace" {
  description = "Namespace of the release (created if missing)."
  type        = string
  default     = "meridian"
}

variable "chart_path" {
  description = "Path (or repository reference) of the Meridian chart."
  type        = string
  default     = null
}

variable "image" {
  description = "The Meridian image: repository and a pinned tag or digest."
  type = object({
    repository = string
    tag        = optional(string, "")
    digest     = optional(string, "")
  })
  validation {
    condition     = var.image.tag != "latest" && (var.image.tag != "" || var.image.digest != "")
    error_message = "image needs a pinned tag (not latest) or a digest."
  }
}

variable "etcd_endpoints" {
  description = "The global etcd's client endpoints (host:port), shared by every region."
  type        = list(string)
  validation {
    condition     = length(var.etcd_endpoints) > 0 && alltrue([for e in var.etcd_endpoints : can(regex("^[A-Za-z0-9_.-]+:[0-9]{1,5}$", e))])
    error_message = "etcd_endpoints must be a non-empty list of host:port (no scheme)."
  }
}

variable "kafka_bootstrap" {
  description = "Kafka bootstrap servers (host:port)."
  type        = list(string)
  validation {
    condition     = length(var.kafka_bootstrap) > 0 && alltrue([for e in var.kafka_bootstrap : can(regex("^[A-Za-z0-9_.-]+:[0-9]{1,5}$", e))])
    error_message = "kafka_bootstrap must be a non-empty list of host:port (no scheme)."
  }
}

variable "catalog_secret_name" {
  description = "An existing Secret in the namespace holding the catalog's SQLAlchemy URL."
  type        = string
}

variable "catalog_secret_key" {
  description = "The key of the catalog URL in that Secret."
  type        = string
  default     = "url"
}

variable "agents" {
  description = "Node agents of the region and each one's volume."
  type = object({
    replicas      = optional(number, 3)
    volume_size   = optional(string, "100Gi")
    storage_class = optional(string, "")
  })
  default = {}
  validation {
    condition     = var.agents.replicas >= 1
    error_message = "a region needs at least one agent."
  }
}

variable "service_monitor" {
  description = "Create a ServiceMonitor (needs the Prometheus Operator's CRDs)."
  type        = bool
  default     = false
}

variable "values" {
  description = "More chart values, merged over the ones this module sets."
  type        = any
  default     = {}
}
