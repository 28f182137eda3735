# How an upload reaches the queue: every archive created under orgs/ whose key ends in .zst
# (orgs/<org_id>/episodes/<episode_id>/<name>.tar.zst) becomes one message on the upload queue.
#
#   created bucket  (create_data_bucket = true)   S3 event notification -> queue
#   adopted bucket  (the default)                 S3 -> EventBridge rule -> queue
#
# An S3 notification configuration is one document per bucket: aws_s3_bucket_notification
# replaces all of it, so it is used only on a bucket this stack owns. On the application's bucket
# the EventBridge rule leaves the queue, topic and Lambda notifications it already has alone. It
# needs the bucket's EventBridge delivery switched on, once, by hand (README.md, "Running against
# an existing application bucket"): that switch is part of the same notification document.

locals {
  notification_prefix = "orgs/"
  notification_suffix = ".zst"

  # The EventBridge target reshapes each event into the S3 notification body the sensor parses.
  upload_record = yamldecode(file("${path.module}/templates/upload-event-record.yaml"))

  # Who may send to the upload queue: S3 from the created bucket, or the EventBridge rule.
  upload_sender = (var.create_data_bucket
    ? { sid = "DataBucketNotifications", service = "s3.amazonaws.com", source_arn = local.data_bucket_arn }
    : { sid = "DataBucketEventBridgeRule", service = "events.amazonaws.com", source_arn = one(aws_cloudwatch_event_rule.uploads[*].arn) }
  )
}

resource "aws_s3_bucket_notification" "data" {
  count = var.create_data_bucket ? 1 : 0

  bucket = local.data_bucket_id

  queue {
    id            = "raw-episode-archives"
    queue_arn     = aws_sqs_queue.uploads.arn
    events        = ["s3:ObjectCreated:*"]
    filter_prefix = local.notification_prefix
    filter_suffix = local.notification_suffix
  }

  depends_on = [aws_sqs_queue_policy.uploads]
}

resource "aws_cloudwatch_event_rule" "uploads" {
  count = var.create_data_bucket ? 0 : 1

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

resource "aws_cloudwatch_event_target" "uploads" {
  count = var.create_data_bucket ? 0 : 1

  rule      = aws_cloudwatch_event_rule.uploads[0].name
  target_id = "upload-queue"
  arn       = aws_sqs_queue.uploads.arn

  input_transformer {
    input_paths    = local.upload_record.input_paths
    input_template = local.upload_record.input_template
  }

  depends_on = [aws_sqs_queue_policy.uploads]
}
