terraform {
  required_version = ">= 1.8.0"
  required_providers {
    # CI tests with kubernetes v1.13.4; the resources used here are in every later release.
    kubernetes = {
      source  = "hashicorp/kubernetes"
      version = ">= 1.13.4"
    }
  }
}
