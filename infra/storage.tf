# Buckets: the data bucket robots upload to, the bucket of Dagster's compute logs, and the bucket
# receiving the server access logs of the other two. The stack's own buckets are all kept the same
# way (modules/bucket); what differs between them is below.
#
# The data bucket is the application's existing bucket by default. It is adopted by name and
# nothing on it changes: not its versioning, encryption, lifecycle, policy, logging or
# notification configuration (README.md, "Running against an existing application bucket").
# Only with create_data_bucket = true does this stack create it, kept like the others.

data "aws_s3_bucket" "data" {
  count  = var.create_data_bucket ? 0 : 1
  bucket = local.data_bucket_name

  lifecycle {
    # S3 delivers a bucket's events to EventBridge in the bucket's own region only.
    postcondition {
      condition     = self.region == var.region
      error_message = "The data bucket ${self.bucket} is in ${self.region}, but this stack deploys to ${var.region}: set region to the bucket's region."
    }
  }
}

locals {
  # The data bucket, adopted or created: what the upload route, the IAM policies and the tasks use.
  data_bucket_id  = var.create_data_bucket ? module.bucket["data"].name : data.aws_s3_bucket.data[0].bucket
  data_bucket_arn = var.create_data_bucket ? module.bucket["data"].arn : data.aws_s3_bucket.data[0].arn

  # The buckets this stack owns besides the access-log bucket, their expiry rule and after how
  # many days incomplete uploads are aborted. Their access logs go under "<key>/".
  buckets = {
    data = {
      owned = var.create_data_bucket
      name  = local.data_bucket_name
      # Reprocessing overwrites processed objects; keep the previous versions a month.
      expiry     = { id = "expire-old-versions", noncurrent_days = 30 }
      abort_days = 7
    }
    dagster = {
      owned      = true
      name       = local.dagster_bucket_name
      expiry     = { id = "expire-compute-logs", prefix = "${local.compute_log_prefix}/", current_days = 30, noncurrent_days = 1 }
      abort_days = 1
    }
  }
  owned_buckets = { for key, bucket in local.buckets : key => bucket if bucket.owned }

  # The buckets whose server access logs S3 may deliver into the access-log bucket (iam.tf).
  logged_bucket_arns = [for bucket in local.owned_buckets : "arn:${local.partition}:s3:::${bucket.name}"]
}

module "bucket" {
  source   = "./modules/bucket"
  for_each = local.owned_buckets

  name                         = each.value.name
  expiry                       = each.value.expiry
  abort_incomplete_upload_days = each.value.abort_days
  access_log                   = { bucket = module.access_logs_bucket.name, prefix = "${each.key}/" }
}

# Receives the server access logs of the buckets above; kept 90 days for audits.
module "access_logs_bucket" {
  source = "./modules/bucket"

  name                         = local.logs_bucket_name
  expiry                       = { id = "expire-access-logs", current_days = 90, noncurrent_days = 1 }
  abort_incomplete_upload_days = 1
  policy_documents             = [data.aws_iam_policy_document.policy["access_log_delivery"].json]
}
