terraform {
  required_version = ">= 1.8.0"
  required_providers {
    # CI tests with kubernetes v1.13.4 and helm v1.3.2; what is used here is written the
    # same in their current releases (a namespace's metadata block; values as yamlencode).
    kubernetes = {
      source  = "hashicorp/kubernetes"
      version = ">= 1.13.4"
    }
    helm = {
      source  = "hashicorp/helm"
      version = ">= 1.3.2"
    }
  }
}
