# How an upload reaches the queue: every archive created under orgs/ whose key ends in .zst
# (orgs/<org_id>/episodes/<episode_id>/<name>.tar.zst) becomes one message on the upload queue,
# by one of three routes (var.upload_route; docs/deploy-aws.md, "Upload routes"):
#
#   s3           S3 event notification -> queue                    (created bucket; its default)
#   sns          S3 event notification -> SNS topic -> queue       (raw message delivery off)
#   eventbridge  S3 -> EventBridge rule -> queue, event as it is   (adopted bucket's default)
#
# The sensor's parser (episode_pipeline/uploads/events.py) reads the three bodies as they arrive, so no
# route reshapes anything: no EventBridge input transformer, no raw SNS delivery.
#
# An S3 notification configuration is one document per bucket: aws_s3_bucket_notification
# replaces all of it, so it is used only on a bucket this stack owns. On the application's bucket
# the EventBridge rule (or a subscription to the topic the bucket already notifies) leaves its
# queue, topic and Lambda notifications alone. EventBridge delivery must be switched on there
# once, by hand (docs/deploy-aws.md): that switch is part of the same notification document.

locals {
  notification_prefix = "orgs/"
  notification_suffix = ".zst"

  upload_route        = coalesce(var.upload_route, var.create_data_bucket ? "s3" : "eventbridge")
  create_upload_topic = local.upload_route == "sns" && var.upload_topic_arn == null
  upload_topic_arn    = local.upload_route == "sns" ? coalesce(var.upload_topic_arn, one(aws_sns_topic.uploads[*].arn)) : null

  # Who may send to the upload queue: S3 from the data bucket, the upload topic, or the rule.
  # SNS deliveries are matched by the topic's ARN alone, as the SNS Developer Guide's queue
  # policy for a subscription does (the topic ARN names its account).
  upload_sender = {
    s3          = { sid = "DataBucketNotifications", service = "s3.amazonaws.com", source_arn = local.data_bucket_arn, any_account = false }
    sns         = { sid = "UploadTopicSubscription", service = "sns.amazonaws.com", source_arn = local.upload_topic_arn, any_account = true }
    eventbridge = { sid = "DataBucketEventBridgeRule", service = "events.amazonaws.com", source_arn = one(aws_cloudwatch_event_rule.uploads[*].arn), any_account = false }
  }[local.upload_route]
}

resource "aws_s3_bucket_notification" "data" {
  count = var.create_data_bucket ? 1 : 0

  bucket      = local.data_bucket_id
  eventbridge = local.upload_route == "eventbridge"

  dynamic "queue" {
    for_each = local.upload_route == "s3" ? [aws_sqs_queue.uploads.arn] : []
    content {
      id            = "raw-episode-archives"
      queue_arn     = queue.value
      events        = ["s3:ObjectCreated:*"]
      filter_prefix = local.notification_prefix
      filter_suffix = local.notification_suffix
    }
  }

  dynamic "topic" {
    for_each = local.upload_route == "sns" ? [local.upload_topic_arn] : []
    content {
      id            = "raw-episode-archives"
      topic_arn     = topic.value
      events        = ["s3:ObjectCreated:*"]
      filter_prefix = local.notification_prefix
      filter_suffix = local.notification_suffix
    }
  }

  depends_on = [aws_sqs_queue_policy.uploads, aws_sns_topic_policy.uploads]
}

# --- sns -----------------------------------------------------------------------------------------

resource "aws_sns_topic" "uploads" {
  count = local.create_upload_topic ? 1 : 0

  name              = "${local.prefix}-uploads"
  kms_master_key_id = aws_kms_key.pipeline.arn
}

resource "aws_sns_topic_policy" "uploads" {
  count = local.create_upload_topic ? 1 : 0

  arn    = aws_sns_topic.uploads[0].arn
  policy = data.aws_iam_policy_document.policy["upload_topic"].json
}

# Raw message delivery off: the queue gets SNS's envelope, the S3 event in its Message.
resource "aws_sns_topic_subscription" "uploads" {
  count = local.upload_route == "sns" ? 1 : 0

  topic_arn            = local.upload_topic_arn
  protocol             = "sqs"
  endpoint             = aws_sqs_queue.uploads.arn
  raw_message_delivery = false

  depends_on = [aws_sqs_queue_policy.uploads]
}

# --- eventbridge ---------------------------------------------------------------------------------

resource "aws_cloudwatch_event_rule" "uploads" {
  count = local.upload_route == "eventbridge" ? 1 : 0

  name        = "${local.prefix}-uploads"
  description = "Episode archives created in ${local.data_bucket_id} under ${local.notification_prefix}, key ending in ${local.notification_suffix}"

  event_pattern = jsonencode({
    source        = ["aws.s3"]
    "detail-type" = ["Object Created"]
    detail = {
      bucket = { name = [local.data_bucket_id] }
      object = { key = [{ wildcard = "${local.notification_prefix}*${local.notification_suffix}" }] }
    }
  })
}

# The event as EventBridge has it: no input transformer, so no template a key could break.
resource "aws_cloudwatch_event_target" "uploads" {
  count = local.upload_route == "eventbridge" ? 1 : 0

  rule      = aws_cloudwatch_event_rule.uploads[0].name
  target_id = "upload-queue"
  arn       = aws_sqs_queue.uploads.arn

  depends_on = [aws_sqs_queue_policy.uploads]
}
