# Meridian in three regions: eu-west and eu-central (EU), us-east (US). One global etcd
# spans the three; Kafka runs in eu-central and is reached from the others through its
# external listener; each region's cluster gets the Meridian chart.

locals {
  etcd_members = [for m in var.etcd_members : {
    name        = m.name
    region      = m.region
    peer_host   = "${m.name}.etcd.${var.domain}"
    client_host = "${m.name}.etcd.${var.domain}"
  }]
  etcd_endpoints  = [for m in local.etcd_members : "${m.client_host}:2379"]
  kafka_bootstrap = ["kafka.${var.domain}:9094"]
}

module "etcd_eu_west" {
  source    = "../../modules/etcd"
  providers = { kubernetes = kubernetes.eu_west, helm = helm.eu_west }
  region    = "eu-west"
  members   = local.etcd_members
}

module "etcd_eu_central" {
  source    = "../../modules/etcd"
  providers = { kubernetes = kubernetes.eu_central, helm = helm.eu_central }
  region    = "eu-central"
  members   = local.etcd_members
}

module "etcd_us_east" {
  source    = "../../modules/etcd"
  providers = { kubernetes = kubernetes.us_east, helm = helm.us_east }
  region    = "us-east"
  members   = local.etcd_members
}

module "kafka" {
  source    = "../../modules/kafka"
  providers = { helm = helm.eu_central }
}

module "region_eu_west" {
  source              = "../../modules/region"
  providers           = { helm = helm.eu_west }
  region              = "eu-west"
  image               = var.image
  etcd_endpoints      = local.etcd_endpoints
  kafka_bootstrap     = local.kafka_bootstrap
  catalog_secret_name = var.catalog_secret_name
  depends_on          = [module.etcd_eu_west, module.kafka]
}

module "region_eu_central" {
  source              = "../../modules/region"
  providers           = { helm = helm.eu_central }
  region              = "eu-central"
  image               = var.image
  etcd_endpoints      = local.etcd_endpoints
  kafka_bootstrap     = local.kafka_bootstrap
  catalog_secret_name = var.catalog_secret_name
  depends_on          = [module.etcd_eu_central, module.kafka]
}

module "region_us_east" {
  source              = "../../modules/region"
  providers           = { helm = helm.us_east }
  region              = "us-east"
  image               = var.image
  etcd_endpoints      = local.etcd_endpoints
  kafka_bootstrap     = local.kafka_bootstrap
  catalog_secret_name = var.catalog_secret_name
  depends_on          = [module.etcd_us_east, module.kafka]
}
