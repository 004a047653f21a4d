mock_provider "helm" {}

run "strimzi_by_reference_then_the_cluster" {
  command = apply

  assert {
    condition     = helm_release.strimzi.chart == "strimzi-kafka-operator" && helm_release.strimzi.repository == "https://strimzi.io/charts/" && helm_release.strimzi.version == "0.48.0"
    error_message = "Kafka's operator must come from Strimzi's own chart, pinned"
  }
  assert {
    condition     = yamldecode(helm_release.cluster.values[0]).minInsyncReplicas == 2 && yamldecode(helm_release.cluster.values[0]).replication == 3
    error_message = "three replicas and min.insync.replicas 2, so an acknowledged event survives a broker"
  }
}

run "even_node_count_refused" {
  command = plan
  variables {
    nodes = 4
  }
  expect_failures = [var.nodes]
}
