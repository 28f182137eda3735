# An S3 bucket the way this stack keeps its buckets: versioned, SSE-S3, private, owner-enforced,
# TLS only, old versions and incomplete uploads expired, and optionally logging its server
# access to a log bucket or being that log bucket.

terraform {
  required_providers {
    aws = {
      source = "hashicorp/aws"
    }
  }
}

resource "aws_s3_bucket" "this" {
  #checkov:skip=CKV_AWS_18:The access-log bucket is the log target and would loop logging into itself; every other bucket logs to it (var.access_log).
  #checkov:skip=CKV_AWS_144:Not replicated: cross-region replication is a per-environment disaster-recovery decision, compute logs and access logs are disposable, and versioning protects against overwrites.
  #checkov:skip=CKV_AWS_145:SSE-S3 on purpose: robots upload with their own credentials (a KMS key would need grants for every uploader) and S3 log delivery supports only SSE-S3.
  #checkov:skip=CKV2_AWS_62:Only new data-bucket uploads have a consumer, the upload queue (notifications.tf in the root module); nothing reacts to new compute-log or access-log objects.
  bucket = var.name
}

resource "aws_s3_bucket_versioning" "this" {
  bucket = aws_s3_bucket.this.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_public_access_block" "this" {
  bucket                  = aws_s3_bucket.this.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_server_side_encryption_configuration" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

resource "aws_s3_bucket_ownership_controls" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_logging" "this" {
  count = var.access_log == null ? 0 : 1

  bucket        = aws_s3_bucket.this.id
  target_bucket = var.access_log.bucket
  target_prefix = var.access_log.prefix
}

resource "aws_s3_bucket_lifecycle_configuration" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    id     = var.expiry.id
    status = "Enabled"

    filter {
      prefix = var.expiry.prefix
    }

    dynamic "expiration" {
      for_each = var.expiry.current_days[*]
      content {
        days = expiration.value
      }
    }

    noncurrent_version_expiration {
      noncurrent_days = var.expiry.noncurrent_days
    }
  }

  rule {
    id     = "abort-incomplete-uploads"
    status = "Enabled"

    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = var.abort_incomplete_upload_days
    }
  }
}

resource "aws_s3_bucket_policy" "this" {
  bucket = aws_s3_bucket.this.id
  policy = data.aws_iam_policy_document.this.json

  depends_on = [aws_s3_bucket_public_access_block.this]
}

data "aws_iam_policy_document" "this" {
  source_policy_documents = var.policy_documents

  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.this.arn, "${aws_s3_bucket.this.arn}/*"]

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
