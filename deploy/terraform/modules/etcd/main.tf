# The members of one region of an etcd cluster that spans three or more regions. Each
# region's call creates its own members (one StatefulSet of one pod and one Service per
# member, so each has a stable address of its own) and names all of them in
# --initial-cluster.

locals {
  local_members = { for m in var.members : m.name => m if m.region == var.region }
  peer_scheme   = var.peer_tls_secret_name == null ? "http" : "https"
  initial_cluster = join(",", [
    for m in var.members : "${m.name}=${local.peer_scheme}://${m.peer_host}:2380"
  ])
  client_endpoints = [for m in var.members : "${m.client_host}:2379"]
  peer_tls_flags = var.peer_tls_secret_name == null ? [] : [
    "--peer-client-cert-auth",
    "--peer-trusted-ca-file=/etc/etcd/peer/ca.crt",
    "--peer-cert-file=/etc/etcd/peer/tls.crt",
    "--peer-key-file=/etc/etcd/peer/tls.key",
  ]
}

resource "kubernetes_namespace" "etcd" {
  # Checked here, on the one resource every call creates.
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

resource "kubernetes_service" "member" {
  for_each = local.local_members
  metadata {
    name      = each.key
    namespace = kubernetes_namespace.etcd.metadata[0].name
    labels    = { "app.kubernetes.io/name" = "etcd", "meridian.io/etcd-member" = each.key }
  }
  spec {
    type = var.service_type
    # A member must be reachable by its peers before it is ready, or no quorum forms.
    publish_not_ready_addresses = true
    selector                    = { "meridian.io/etcd-member" = each.key }
    port {
      name        = "client"
      port        = 2379
      target_port = 2379
    }
    port {
      name        = "peer"
      port        = 2380
      target_port = 2380
    }
  }
}

resource "kubernetes_stateful_set" "member" {
  for_each = local.local_members

  metadata {
    name      = each.key
    namespace = kubernetes_namespace.etcd.metadata[0].name
    labels    = { "app.kubernetes.io/name" = "etcd", "meridian.io/etcd-member" = each.key }
  }

  spec {
    service_name = kubernetes_service.member[each.key].metadata[0].name
    replicas     = 1
    selector {
      match_labels = { "meridian.io/etcd-member" = each.key }
    }

    template {
      metadata {
        labels = { "app.kubernetes.io/name" = "etcd", "meridian.io/etcd-member" = each.key }
      }
      spec {
        automount_service_account_token = false
        security_context {
          run_as_non_root = true
          run_as_user     = 10001
          fs_group        = 10001
        }

        container {
          name              = "etcd"
          image             = var.image
          image_pull_policy = "IfNotPresent"
          command = concat([
            "etcd",
            "--name=${each.key}",
            "--data-dir=/var/lib/etcd/data",
            "--listen-peer-urls=${local.peer_scheme}://0.0.0.0:2380",
            "--listen-client-urls=http://0.0.0.0:2379",
            "--listen-metrics-urls=http://0.0.0.0:2381",
            "--advertise-client-urls=http://${each.value.client_host}:2379",
            "--initial-advertise-peer-urls=${local.peer_scheme}://${each.value.peer_host}:2380",
            "--initial-cluster=${local.initial_cluster}",
            "--initial-cluster-state=${var.initial_cluster_state}",
            "--initial-cluster-token=${var.cluster_token}",
            "--heartbeat-interval=${var.heartbeat_interval_ms}",
            "--election-timeout=${var.election_timeout_ms}",
            # Meridian's keys are small and change often: compact history hourly.
            "--auto-compaction-mode=periodic",
            "--auto-compaction-retention=1h",
          ], local.peer_tls_flags)

          port {
            name           = "client"
            container_port = 2379
          }
          port {
            name           = "peer"
            container_port = 2380
          }
          port {
            name           = "metrics"
            container_port = 2381
          }

          readiness_probe {
            http_get {
              path = "/health"
              port = 2381
            }
            period_seconds  = 10
            timeout_seconds = 5
          }
          liveness_probe {
            http_get {
              path = "/health?exclude=NOSPACE&serializable=true"
              port = 2381
            }
            initial_delay_seconds = 30
            period_seconds        = 20
            timeout_seconds       = 5
            failure_threshold     = 5
          }

          resources {
            requests = var.resources.requests
            limits   = var.resources.limits
          }

          security_context {
            allow_privilege_escalation = false
            read_only_root_filesystem  = true
            run_as_non_root            = true
            capabilities {
              drop = ["ALL"]
            }
          }

          volume_mount {
            name       = "data"
            mount_path = "/var/lib/etcd"
          }
          dynamic "volume_mount" {
            for_each = var.peer_tls_secret_name == null ? [] : [1]
            content {
              name       = "peer-tls"
              mount_path = "/etc/etcd/peer"
              read_only  = true
            }
          }
        }

        dynamic "volume" {
          for_each = var.peer_tls_secret_name == null ? [] : [var.peer_tls_secret_name]
          content {
            name = "peer-tls"
            secret {
              secret_name = volume.value
            }
          }
        }
      }
    }

    volume_claim_template {
      metadata {
        name = "data"
      }
      spec {
        access_modes       = ["ReadWriteOnce"]
        storage_class_name = var.storage.storage_class
        resources {
          requests = { storage = var.storage.size }
        }
      }
    }
  }
}
