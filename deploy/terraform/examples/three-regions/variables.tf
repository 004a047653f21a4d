variable "kubeconfig_path" {
  description = "A kubeconfig holding a context for each region's cluster."
  type        = string
  default     = "~/.kube/config"
}

variable "contexts" {
  description = "The kubeconfig context of each region's cluster."
  type        = map(string)
  default = {
    "eu-west"    = "eu-west"
    "eu-central" = "eu-central"
    "us-east"    = "us-east"
  }
  validation {
    condition     = length(setsubtract(["eu-west", "eu-central", "us-east"], keys(var.contexts))) == 0
    error_message = "contexts needs an entry for eu-west, eu-central and us-east."
  }
}

variable "image" {
  description = "The Meridian image you built and pushed, pinned."
  type = object({
    repository = string
    tag        = optional(string, "")
    digest     = optional(string, "")
  })
}

variable "domain" {
  description = "DNS zone under which each etcd member and Kafka are reachable from every region."
  type        = string
  default     = "meridian.example.internal"
}

variable "etcd_members" {
  description = "etcd members: an odd count spread so that no region holds a quorum."
  type = list(object({
    name   = string
    region = string
  }))
  # Five members, two in each EU region and one in us-east: a commit needs three, so EU
  # writes commit without a transatlantic round trip, and any one region can be lost.
  default = [
    { name = "etcd-euw-0", region = "eu-west" },
    { name = "etcd-euw-1", region = "eu-west" },
    { name = "etcd-euc-0", region = "eu-central" },
    { name = "etcd-euc-1", region = "eu-central" },
    { name = "etcd-use-0", region = "us-east" },
  ]
  validation {
    condition     = length(var.etcd_members) >= 3 && length(var.etcd_members) % 2 == 1
    error_message = "etcd_members must be an odd count, at least 3 (the etcd module checks the spread)."
  }
}

variable "catalog_secret_name" {
  description = "The Secret (same name in each region's meridian namespace) with the catalog URL."
  type        = string
  default     = "meridian-catalog"
}
