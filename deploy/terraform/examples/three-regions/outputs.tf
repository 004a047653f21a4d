output "etcd_endpoints" {
  description = "MERIDIAN_ETCD for every region and for operators' CLIs."
  value       = join(",", local.etcd_endpoints)
}

output "etcd_members_by_region" {
  description = "Members created in each region."
  value = {
    "eu-west"    = module.etcd_eu_west.local_members
    "eu-central" = module.etcd_eu_central.local_members
    "us-east"    = module.etcd_us_east.local_members
  }
}

output "releases" {
  description = "The Meridian release of each region."
  value = {
    "eu-west"    = module.region_eu_west.release
    "eu-central" = module.region_eu_central.release
    "us-east"    = module.region_us_east.release
  }
}
