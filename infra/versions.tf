terraform {
  # 1.9+: a variable's validation may refer to another variable (data_bucket_name needs
  # create_data_bucket). `terraform test` with mock providers (infra/tests/) needs 1.7+.
  required_version = ">= 1.9.0"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # Exact pin: the offline validation in the test suite uses the provider mirror of the
      # machine image, which carries this version only. Bump both together.
      version = "5.100.0"
    }
  }

  # Remote state: `terraform init -backend-config=backend.hcl` (bucket, key, region,
  # dynamodb_table or use_lockfile). See README.md, "Deploying to AWS".
  backend "s3" {}
}

provider "aws" {
  region = var.region

  default_tags {
    tags = merge(
      {
        app         = "episode-pipeline"
        environment = var.environment
        managed-by  = "terraform"
      },
      var.tags,
    )
  }
}

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition
  prefix     = var.name_prefix

  # The application's bucket by default (adopted, see storage.tf); a new one with create_data_bucket.
  data_bucket_name = (var.create_data_bucket
    ? coalesce(var.data_bucket_name, "${var.name_prefix}-data-${local.account_id}")
    : var.data_bucket_name
  )
  dagster_bucket_name = "${var.name_prefix}-dagster-${local.account_id}"
  logs_bucket_name    = "${var.name_prefix}-access-logs-${local.account_id}"

  # Prefix under which Dagster's compute logs (step stdout/stderr) live in the dagster bucket;
  # must match `compute_logs.config.prefix` in dagster.yaml.
  compute_log_prefix = "compute-logs"
}
