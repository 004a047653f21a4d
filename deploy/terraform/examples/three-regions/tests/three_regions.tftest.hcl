# The example root, planned and applied offline: every region's providers are mocked.

mock_provider "kubernetes" {
  alias = "eu_west"
}
mock_provider "kubernetes" {
  alias = "eu_central"
}
mock_provider "kubernetes" {
  alias = "us_east"
}
mock_provider "helm" {
  alias = "eu_west"
}
mock_provider "helm" {
  alias = "eu_central"
}
mock_provider "helm" {
  alias = "us_east"
}

variables {
  image = { repository = "registry.example/meridian", tag = "0.1.0" }
}

run "plan_three_regions" {
  command = plan

  assert {
    condition     = output.etcd_members_by_region["eu-west"] == tolist(["etcd-euw-0", "etcd-euw-1"]) && output.etcd_members_by_region["us-east"] == tolist(["etcd-use-0"])
    error_message = "each region's cluster must get its own etcd members"
  }
  assert {
    condition     = length(split(",", output.etcd_endpoints)) == 5
    error_message = "every region must be given all five etcd endpoints"
  }
  assert {
    condition     = module.region_us_east.values.region == "us-east" && module.region_eu_central.values.region == "eu-central"
    error_message = "each region's release must be given its own region"
  }
}

run "apply_three_regions" {
  command = apply

  assert {
    condition     = length(output.releases) == 3 && output.releases["eu-west"].namespace == "meridian"
    error_message = "a Meridian release in each of the three regions"
  }
  assert {
    condition     = module.region_eu_west.values.kafka.bootstrap == "kafka.meridian.example.internal:9094"
    error_message = "every region reaches the one Kafka through its external listener"
  }
}

run "even_etcd_member_count_refused" {
  command = plan
  variables {
    etcd_members = [
      { name = "a", region = "eu-west" },
      { name = "b", region = "eu-central" },
      { name = "c", region = "us-east" },
      { name = "d", region = "us-east" },
    ]
  }
  expect_failures = [var.etcd_members]
}
