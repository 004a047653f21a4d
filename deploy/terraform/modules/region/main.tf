# Installs the Meridian chart (deploy/helm/meridian) into one region's cluster. The helm
# provider passed in decides which cluster: the example root gives each region its own.

locals {
  chart = coalesce(var.chart_path, "${path.module}/../../../helm/meridian")
  values = merge({
    region = var.region
    image = {
      repository = var.image.repository
      tag        = var.image.tag
      digest     = var.image.digest
    }
    etcd    = { endpoints = join(",", var.etcd_endpoints) }
    kafka   = { bootstrap = join(",", var.kafka_bootstrap) }
    catalog = { existingSecret = var.catalog_secret_name, key = var.catalog_secret_key }
    agent = {
      replicas = var.agents.replicas
      persistence = {
        size             = var.agents.volume_size
        storageClassName = var.agents.storage_class
      }
    }
    metrics = { serviceMonitor = { enabled = var.service_monitor } }
  }, var.values)
}

resource "helm_release" "meridian" {
  name             = "meridian"
  namespace        = var.namespace
  create_namespace = true
  chart            = local.chart
  values           = [yamlencode(local.values)]
  atomic           = true
  cleanup_on_fail  = true
  wait             = true
  timeout          = 600
}
