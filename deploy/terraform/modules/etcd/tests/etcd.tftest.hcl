# Offline: the kubernetes provider is mocked; plans and applies check what would be made.

mock_provider "kubernetes" {}
mock_provider "helm" {}

variables {
  region = "eu-west"
  members = [
    { name = "m-euw", region = "eu-west", peer_host = "m-euw.example", client_host = "m-euw.example" },
    { name = "m-euc", region = "eu-central", peer_host = "m-euc.example", client_host = "m-euc.example" },
    { name = "m-use", region = "us-east", peer_host = "m-use.example", client_host = "m-use.example" },
  ]
}

run "one_member_per_region_with_wan_timeouts" {
  command = apply

  assert {
    condition     = output.local_members == tolist(["m-euw"])
    error_message = "eu-west's call must create only eu-west's member"
  }
  assert {
    condition     = yamldecode(helm_release.etcd.values[0]).heartbeatIntervalMs == 250 && yamldecode(helm_release.etcd.values[0]).electionTimeoutMs == 2500
    error_message = "the WAN heartbeat interval and election timeout must reach the chart"
  }
  assert {
    condition     = length(yamldecode(helm_release.etcd.values[0]).members) == 3 && yamldecode(helm_release.etcd.values[0]).region == "eu-west"
    error_message = "the chart needs every member and this region's name"
  }
  assert {
    condition     = helm_release.etcd.namespace == "meridian-etcd"
    error_message = "the members go to their own namespace"
  }
  assert {
    condition     = output.initial_cluster == "m-euw=http://m-euw.example:2380,m-euc=http://m-euc.example:2380,m-use=http://m-use.example:2380"
    error_message = "every member must be named in --initial-cluster: ${output.initial_cluster}"
  }
  assert {
    condition     = length(output.client_endpoints) == 3
    error_message = "every member's client endpoint must be listed"
  }
}

run "peer_tls_switches_the_peer_urls" {
  command = plan
  variables {
    peer_tls_secret_name = "etcd-peer-tls"
  }
  assert {
    condition     = startswith(output.initial_cluster, "m-euw=https://")
    error_message = "peer URLs must be https when peer TLS is on"
  }
  assert {
    condition     = yamldecode(helm_release.etcd.values[0]).peerTlsSecret == "etcd-peer-tls"
    error_message = "the peer TLS Secret must reach the chart"
  }
}

run "even_member_count_refused" {
  command = plan
  variables {
    members = [
      { name = "a", region = "eu-west", peer_host = "a", client_host = "a" },
      { name = "b", region = "eu-central", peer_host = "b", client_host = "b" },
      { name = "c", region = "us-east", peer_host = "c", client_host = "c" },
      { name = "d", region = "us-east", peer_host = "d", client_host = "d" },
    ]
  }
  expect_failures = [var.members]
}

run "a_region_holding_a_quorum_refused" {
  command = plan
  variables {
    members = [
      { name = "a", region = "eu-west", peer_host = "a", client_host = "a" },
      { name = "b", region = "eu-west", peer_host = "b", client_host = "b" },
      { name = "c", region = "eu-west", peer_host = "c", client_host = "c" },
      { name = "d", region = "eu-central", peer_host = "d", client_host = "d" },
      { name = "e", region = "us-east", peer_host = "e", client_host = "e" },
    ]
  }
  expect_failures = [var.members]
}

run "two_regions_refused" {
  command = plan
  variables {
    members = [
      { name = "a", region = "eu-west", peer_host = "a", client_host = "a" },
      { name = "b", region = "eu-central", peer_host = "b", client_host = "b" },
      { name = "c", region = "eu-central", peer_host = "c", client_host = "c" },
    ]
  }
  expect_failures = [var.members]
}

run "election_timeout_under_ten_heartbeats_refused" {
  command = plan
  variables {
    heartbeat_interval_ms = 250
    election_timeout_ms   = 1000
  }
  expect_failures = [kubernetes_namespace.etcd]
}
