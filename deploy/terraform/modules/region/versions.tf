terraform {
  required_version = ">= 1.8.0"
  required_providers {
    # CI tests with helm v1.3.2 (what the Go module proxy serves); written to hold for
    # current releases too: values through yamlencode, no `set` blocks.
    helm = {
      source  = "hashicorp/helm"
      version = ">= 1.3.2"
    }
  }
}
