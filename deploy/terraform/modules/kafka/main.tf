# Kafka for Meridian's change log, run by Strimzi's operator (a well-kept CNCF project,
# installed from its own chart by reference). The cluster itself is the operator's custom
# resources, rendered by deploy/helm/meridian-kafka with Meridian's settings: KRaft,
# replication 3, min.insync.replicas 2, no unclean leader election, topics created here
# (the brokers' auto-create is off).

locals {
  cluster_chart = "${path.module}/../../../helm/meridian-kafka"
  replication   = min(3, var.nodes)
}

resource "helm_release" "strimzi" {
  name             = "strimzi"
  namespace        = var.namespace
  create_namespace = true
  repository       = var.strimzi_repository
  chart            = "strimzi-kafka-operator"
  version          = var.strimzi_version
  values = [yamlencode({
    watchNamespaces = []
  })]
  atomic  = true
  wait    = true
  timeout = 600
}

resource "helm_release" "cluster" {
  name      = "${var.cluster_name}-kafka"
  namespace = var.namespace
  chart     = local.cluster_chart
  values = [yamlencode({
    clusterName       = var.cluster_name
    kafkaVersion      = var.kafka_version
    nodes             = var.nodes
    storageSize       = var.storage_size
    replication       = local.replication
    minInsyncReplicas = local.replication - 1
    changesPartitions = var.changes_partitions
    externalListener  = var.external_listener
  })]
  wait    = true
  timeout = 900
  # The custom resources need the operator's CRDs.
  depends_on = [helm_release.strimzi]
}
