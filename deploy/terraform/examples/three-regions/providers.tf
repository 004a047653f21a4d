# One provider configuration per region's cluster. (helm provider 3.x writes the
# `kubernetes` block as an attribute: `kubernetes = { config_path = ... }`.)

provider "kubernetes" {
  alias          = "eu_west"
  config_path    = var.kubeconfig_path
  config_context = var.contexts["eu-west"]
}

provider "kubernetes" {
  alias          = "eu_central"
  config_path    = var.kubeconfig_path
  config_context = var.contexts["eu-central"]
}

provider "kubernetes" {
  alias          = "us_east"
  config_path    = var.kubeconfig_path
  config_context = var.contexts["us-east"]
}

provider "helm" {
  alias = "eu_west"
  kubernetes {
    config_path    = var.kubeconfig_path
    config_context = var.contexts["eu-west"]
  }
}

provider "helm" {
  alias = "eu_central"
  kubernetes {
    config_path    = var.kubeconfig_path
    config_context = var.contexts["eu-central"]
  }
}

provider "helm" {
  alias = "us_east"
  kubernetes {
    config_path    = var.kubeconfig_path
    config_context = var.contexts["us-east"]
  }
}
