mock_provider "helm" {}

variables {
  region              = "eu-west"
  image               = { repository = "registry.example/meridian", tag = "0.1.0" }
  etcd_endpoints      = ["etcd-0.example:2379", "etcd-1.example:2379", "etcd-2.example:2379"]
  kafka_bootstrap     = ["kafka.example:9094"]
  catalog_secret_name = "meridian-catalog"
}

run "chart_values_from_variables" {
  command = apply

  assert {
    condition     = yamldecode(helm_release.meridian.values[0]).region == "eu-west"
    error_message = "the release must be given its region"
  }
  assert {
    condition     = yamldecode(helm_release.meridian.values[0]).etcd.endpoints == "etcd-0.example:2379,etcd-1.example:2379,etcd-2.example:2379"
    error_message = "the release must be given every etcd endpoint"
  }
  assert {
    condition     = yamldecode(helm_release.meridian.values[0]).catalog.existingSecret == "meridian-catalog"
    error_message = "the catalog URL must come from the named Secret"
  }
  assert {
    condition     = helm_release.meridian.namespace == "meridian" && helm_release.meridian.atomic
    error_message = "the release goes to the meridian namespace, atomically"
  }
}

run "unpinned_image_refused" {
  command = plan
  variables {
    image = { repository = "registry.example/meridian", tag = "latest" }
  }
  expect_failures = [var.image]
}

run "endpoint_with_a_scheme_refused" {
  command = plan
  variables {
    etcd_endpoints = ["https://etcd-0.example:2379"]
  }
  expect_failures = [var.etcd_endpoints]
}
