terraform {
  required_version = ">= 1.0"
  required_providers {
    runpod = {
      source  = "runpod/runpod"
      version = "~> 2.0"
    }
  }
}

# The API key comes from RUNPOD_API_KEY.
provider "runpod" {}
