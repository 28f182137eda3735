# Buckets: the data bucket robots upload to, the bucket of Dagster's compute logs, and the bucket
# receiving both buckets' server access logs.

# --- Data bucket -------------------------------------------------------------------------------

resource "aws_s3_bucket" "data" {
  #checkov:skip=CKV_AWS_144:Cross-region replication is a disaster-recovery decision per environment; versioning already protects against overwrites and deletes.
  #checkov:skip=CKV_AWS_145:SSE-S3 on purpose: robots upload with their own credentials, and a customer managed KMS key would require granting every uploader kms:GenerateDataKey.
  bucket = local.data_bucket_name
}

resource "aws_s3_bucket_versioning" "data" {
  bucket = aws_s3_bucket.data.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "data" {
  bucket = aws_s3_bucket.data.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

resource "aws_s3_bucket_public_access_block" "data" {
  bucket = aws_s3_bucket.data.id

  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "data" {
  bucket = aws_s3_bucket.data.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_logging" "data" {
  bucket        = aws_s3_bucket.data.id
  target_bucket = aws_s3_bucket.access_logs.id
  target_prefix = "data/"
}

resource "aws_s3_bucket_lifecycle_configuration" "data" {
  bucket = aws_s3_bucket.data.id

  rule {
    id     = "expire-old-versions"
    status = "Enabled"

    filter {}

    # Reprocessing overwrites processed objects; keep the previous versions a month.
    noncurrent_version_expiration {
      noncurrent_days = 30
    }

    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }
  }
}

resource "aws_s3_bucket_policy" "data" {
  bucket = aws_s3_bucket.data.id
  policy = data.aws_iam_policy_document.data_bucket.json

  depends_on = [aws_s3_bucket_public_access_block.data]
}

data "aws_iam_policy_document" "data_bucket" {
  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.data.arn,
      "${aws_s3_bucket.data.arn}/*",
    ]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

# Every uploaded archive (orgs/<org_id>/episodes/<episode_id>/....zst) is announced on the queue.
resource "aws_s3_bucket_notification" "data" {
  bucket = aws_s3_bucket.data.id

  queue {
    id            = "raw-episode-archives"
    queue_arn     = aws_sqs_queue.uploads.arn
    events        = ["s3:ObjectCreated:*"]
    filter_prefix = local.notification_prefix
    filter_suffix = local.notification_suffix
  }

  depends_on = [aws_sqs_queue_policy.uploads]
}

# --- Dagster compute logs ----------------------------------------------------------------------

resource "aws_s3_bucket" "dagster" {
  #checkov:skip=CKV_AWS_144:Compute logs are disposable diagnostics (expired after 30 days); not replicated.
  #checkov:skip=CKV_AWS_145:SSE-S3 is enough for step stdout/stderr; no KMS key grants needed on every task role.
  #checkov:skip=CKV2_AWS_62:Nothing reacts to new compute-log objects; event notifications would have no consumer.
  bucket = local.dagster_bucket_name
}

resource "aws_s3_bucket_versioning" "dagster" {
  bucket = aws_s3_bucket.dagster.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "dagster" {
  bucket = aws_s3_bucket.dagster.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

resource "aws_s3_bucket_public_access_block" "dagster" {
  bucket = aws_s3_bucket.dagster.id

  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "dagster" {
  bucket = aws_s3_bucket.dagster.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_logging" "dagster" {
  bucket        = aws_s3_bucket.dagster.id
  target_bucket = aws_s3_bucket.access_logs.id
  target_prefix = "dagster/"
}

resource "aws_s3_bucket_lifecycle_configuration" "dagster" {
  bucket = aws_s3_bucket.dagster.id

  rule {
    id     = "expire-compute-logs"
    status = "Enabled"

    filter {
      prefix = "${local.compute_log_prefix}/"
    }

    expiration {
      days = 30
    }

    noncurrent_version_expiration {
      noncurrent_days = 1
    }
  }

  rule {
    id     = "abort-incomplete-uploads"
    status = "Enabled"

    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }
}

resource "aws_s3_bucket_policy" "dagster" {
  bucket = aws_s3_bucket.dagster.id
  policy = data.aws_iam_policy_document.dagster_bucket.json

  depends_on = [aws_s3_bucket_public_access_block.dagster]
}

data "aws_iam_policy_document" "dagster_bucket" {
  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.dagster.arn,
      "${aws_s3_bucket.dagster.arn}/*",
    ]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

# --- Server access logs of the two buckets above -----------------------------------------------

resource "aws_s3_bucket" "access_logs" {
  #checkov:skip=CKV_AWS_18:This is the access-log target bucket; logging it into itself would loop.
  #checkov:skip=CKV_AWS_144:Access logs are kept 90 days for audits in-region; not replicated.
  #checkov:skip=CKV_AWS_145:S3 server access log delivery supports only SSE-S3 on the target bucket.
  #checkov:skip=CKV2_AWS_62:Nothing consumes new access-log objects, so notifications would have no target.
  bucket = local.logs_bucket_name
}

resource "aws_s3_bucket_versioning" "access_logs" {
  bucket = aws_s3_bucket.access_logs.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "access_logs" {
  bucket = aws_s3_bucket.access_logs.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

resource "aws_s3_bucket_public_access_block" "access_logs" {
  bucket = aws_s3_bucket.access_logs.id

  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "access_logs" {
  bucket = aws_s3_bucket.access_logs.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "access_logs" {
  bucket = aws_s3_bucket.access_logs.id

  rule {
    id     = "expire-access-logs"
    status = "Enabled"

    filter {}

    expiration {
      days = 90
    }

    noncurrent_version_expiration {
      noncurrent_days = 1
    }

    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }
}

resource "aws_s3_bucket_policy" "access_logs" {
  bucket = aws_s3_bucket.access_logs.id
  policy = data.aws_iam_policy_document.access_logs_bucket.json

  depends_on = [aws_s3_bucket_public_access_block.access_logs]
}

data "aws_iam_policy_document" "access_logs_bucket" {
  statement {
    sid       = "S3ServerAccessLogDelivery"
    effect    = "Allow"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.access_logs.arn}/*"]

    principals {
      type        = "Service"
      identifiers = ["logging.s3.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }

    condition {
      test     = "ArnLike"
      variable = "aws:SourceArn"
      values   = [aws_s3_bucket.data.arn, aws_s3_bucket.dagster.arn]
    }
  }

  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.access_logs.arn,
      "${aws_s3_bucket.access_logs.arn}/*",
    ]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}
