# The members of one region of an etcd cluster that spans three or more regions. Each
# region's call installs deploy/helm/meridian-etcd into its cluster with the full member
# list; the chart runs this region's members (one StatefulSet of one pod and one Service
# each, so each has a stable address) and names all of them in --initial-cluster.

locals {
  chart         = "${path.module}/../../../helm/meridian-etcd"
  local_members = sort([for m in var.members : m.name if m.region == var.region])
  peer_scheme   = var.peer_tls_secret_name == null ? "http" : "https"
  initial_cluster = join(",", [
    for m in var.members : "${m.name}=${local.peer_scheme}://${m.peer_host}:2380"
  ])
  client_endpoints = [for m in var.members : "${m.client_host}:2379"]
  values = {
    region  = var.region
    members = [for m in var.members : { name = m.name, region = m.region, peerHost = m.peer_host, clientHost = m.client_host }]
    image   = var.image
    # The chart refuses a short election timeout too; checking here fails the plan.
    heartbeatIntervalMs = var.heartbeat_interval_ms
    electionTimeoutMs   = var.election_timeout_ms
    initialClusterState = var.initial_cluster_state
    clusterToken        = var.cluster_token
    peerTlsSecret       = var.peer_tls_secret_name == null ? "" : var.peer_tls_secret_name
    serviceType         = var.service_type
    storage             = { size = var.storage.size, storageClassName = var.storage.storage_class == null ? "" : var.storage.storage_class }
    resources           = { requests = var.resources.requests, limits = var.resources.limits }
  }
}

resource "kubernetes_namespace" "etcd" {
  # Checked here, on a resource every call creates, so a bad combination fails the plan.
  lifecycle {
    precondition {
      condition     = var.election_timeout_ms >= 10 * var.heartbeat_interval_ms
      error_message = "election_timeout_ms must be at least 10 x heartbeat_interval_ms (etcd's tuning guide), or members call elections on every slow round trip."
    }
    precondition {
      condition     = length(local.local_members) > 0
      error_message = "no member of the list is in region ${var.region}."
    }
  }

  metadata {
    name   = var.namespace
    labels = { "app.kubernetes.io/part-of" = "meridian" }
  }
}

resource "helm_release" "etcd" {
  name      = "etcd"
  namespace = kubernetes_namespace.etcd.metadata[0].name
  chart     = local.chart
  values    = [yamlencode(local.values)]
  # Not atomic/wait: a member is ready only once a quorum of all regions is up, which
  # one region's apply cannot wait for.
  wait    = false
  timeout = 600
}
