# One customer managed key for the stack's SNS topics (CloudWatch and S3 must be allowed to use the
# key to publish, which an AWS managed key cannot grant) and the ECS log groups.

resource "aws_kms_key" "pipeline" {
  description             = "${local.prefix}: SNS topics and ECS log groups"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.kms.json
}

resource "aws_kms_alias" "pipeline" {
  name          = "alias/${local.prefix}"
  target_key_id = aws_kms_key.pipeline.key_id
}

data "aws_iam_policy_document" "kms" {
  #checkov:skip=CKV_AWS_109:Key policies must name the key as "*"; the account root statement delegates to IAM policies as AWS recommends.
  #checkov:skip=CKV_AWS_111:Key policies must name the key as "*"; write access is limited to the account and the two services below.
  #checkov:skip=CKV_AWS_356:In a key policy "*" means this key only.
  statement {
    sid       = "AccountAdministration"
    effect    = "Allow"
    actions   = ["kms:*"]
    resources = ["*"]

    principals {
      type        = "AWS"
      identifiers = ["arn:${local.partition}:iam::${local.account_id}:root"]
    }
  }

  statement {
    sid       = "CloudWatchAlarmsPublishToEncryptedTopic"
    effect    = "Allow"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey*"]
    resources = ["*"]

    principals {
      type        = "Service"
      identifiers = ["cloudwatch.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
  }

  # S3 publishing its notifications to the upload topic the stack creates (upload_route = "sns").
  dynamic "statement" {
    for_each = local.create_upload_topic ? [local.data_bucket_arn] : []
    content {
      sid       = "S3NotificationsPublishToEncryptedTopic"
      effect    = "Allow"
      actions   = ["kms:Decrypt", "kms:GenerateDataKey*"]
      resources = ["*"]

      principals {
        type        = "Service"
        identifiers = ["s3.amazonaws.com"]
      }

      condition {
        test     = "StringEquals"
        variable = "aws:SourceAccount"
        values   = [local.account_id]
      }

      condition {
        test     = "ArnLike"
        variable = "aws:SourceArn"
        values   = [statement.value]
      }
    }
  }

  statement {
    sid    = "CloudWatchLogsEncryptLogGroups"
    effect = "Allow"
    actions = [
      "kms:Encrypt*",
      "kms:Decrypt*",
      "kms:ReEncrypt*",
      "kms:GenerateDataKey*",
      "kms:Describe*",
    ]
    resources = ["*"]

    principals {
      type        = "Service"
      identifiers = ["logs.${var.region}.amazonaws.com"]
    }

    condition {
      test     = "ArnLike"
      variable = "kms:EncryptionContext:aws:logs:arn"
      values   = ["arn:${local.partition}:logs:${var.region}:${local.account_id}:log-group:/ecs/${local.prefix}-*"]
    }
  }
}
