variable "region" {
  description = "The region whose members this call creates (one call per region's cluster)."
  type        = string
}

variable "members" {
  description = <<-EOT
    Every member of the cluster, in every region (each call gets the same list): its
    name, region, and the addresses the other members and the clients reach it at.
  EOT
  type = list(object({
    name        = string
    region      = string
    peer_host   = string
    client_host = string
  }))

  validation {
    condition     = length(var.members) >= 3 && length(var.members) % 2 == 1
    error_message = "etcd needs an odd number of members, at least 3: an even count adds one to the quorum without tolerating one more failure."
  }
  validation {
    condition     = length(distinct([for m in var.members : m.name])) == length(var.members)
    error_message = "every member needs a name of its own."
  }
  validation {
    condition     = length(distinct([for m in var.members : m.region])) >= 3
    error_message = "the members must span at least three regions, so that losing a region keeps a quorum."
  }
  validation {
    # A region holding a quorum would take the cluster down with it.
    condition = alltrue([
      for r in distinct([for m in var.members : m.region]) :
      length([for m in var.members : m if m.region == r]) < floor(length(var.members) / 2) + 1
    ])
    error_message = "no region may hold a quorum (a majority) of the members."
  }
}

variable "namespace" {
  description = "Namespace of this region's members (created by this module)."
  type        = string
  default     = "meridian-etcd"
}

variable "image" {
  description = "The etcd image, pinned."
  type        = string
  default     = "gcr.io/etcd-development/etcd:v3.5.17"
  validation {
    condition     = !endswith(var.image, ":latest") && length(regexall(":[^/]+$|@sha256:", var.image)) > 0
    error_message = "pin the etcd image to a version tag or a digest."
  }
}

# WAN tuning (etcd's tuning guide): the heartbeat near the largest round trip between
# members, the election timeout ten heartbeats or more. The defaults suit ~80-150 ms
# transatlantic round trips; etcd's own defaults (100 ms / 1000 ms) suit one data centre.
variable "heartbeat_interval_ms" {
  description = "etcd --heartbeat-interval, about the largest round trip between members."
  type        = number
  default     = 250
  validation {
    condition     = var.heartbeat_interval_ms >= 50 && var.heartbeat_interval_ms <= 5000
    error_message = "heartbeat_interval_ms must be within 50..5000."
  }
}

variable "election_timeout_ms" {
  description = "etcd --election-timeout: at least 10 heartbeats, at most 50 s (etcd's limit)."
  type        = number
  default     = 2500
  validation {
    condition     = var.election_timeout_ms >= 500 && var.election_timeout_ms <= 50000
    error_message = "election_timeout_ms must be within 500..50000."
  }
}

variable "initial_cluster_state" {
  description = "new for a first install; existing when adding a member to a running cluster."
  type        = string
  default     = "new"
  validation {
    condition     = contains(["new", "existing"], var.initial_cluster_state)
    error_message = "initial_cluster_state must be new or existing."
  }
}

variable "cluster_token" {
  description = "--initial-cluster-token: unique per cluster, so members of two clusters never join."
  type        = string
  default     = "meridian-etcd"
}

variable "peer_tls_secret_name" {
  description = <<-EOT
    A Secret in the namespace with ca.crt, tls.crt and tls.key for member-to-member
    traffic, which crosses regions (strongly advised). null: plain peer traffic, for a
    private network only. Clients connect in plain (Meridian has no TLS client yet).
  EOT
  type        = string
  default     = null
}

variable "service_type" {
  description = "Service type of each member (LoadBalancer reaches it from other regions)."
  type        = string
  default     = "LoadBalancer"
}

variable "storage" {
  description = "Volume of each member."
  type = object({
    size          = optional(string, "20Gi")
    storage_class = optional(string, null)
  })
  default = {}
}

variable "resources" {
  description = "Requests and limits of each member."
  type = object({
    requests = optional(map(string), { cpu = "500m", memory = "1Gi" })
    limits   = optional(map(string), { cpu = "2", memory = "4Gi" })
  })
  default = {}
  validation {
    condition     = contains(keys(var.resources.requests), "cpu") && contains(keys(var.resources.requests), "memory")
    error_message = "resources.requests needs cpu and memory."
  }
}
