# Upload queue, its dead-letter queue and the alarm on the dead-letter queue. The numbers are the
# replaced worker's contract (infra/tests/queue.tftest.hcl checks them). What feeds the queue:
# notifications.tf.

locals {
  queue_visibility_timeout_seconds = 900     # 15 minutes
  queue_retention_seconds          = 345600  # 4 days
  queue_receive_wait_seconds       = 20      # long polling
  dlq_retention_seconds            = 1209600 # 14 days
  max_receive_count                = 3
}

resource "aws_sqs_queue" "dlq" {
  name                      = "${local.prefix}-uploads-dlq"
  message_retention_seconds = local.dlq_retention_seconds
  sqs_managed_sse_enabled   = true
}

resource "aws_sqs_queue" "uploads" {
  name                       = "${local.prefix}-uploads"
  visibility_timeout_seconds = local.queue_visibility_timeout_seconds
  message_retention_seconds  = local.queue_retention_seconds
  receive_wait_time_seconds  = local.queue_receive_wait_seconds
  # SSE-SQS: S3 event notifications and EventBridge can deliver to it without KMS key grants.
  sqs_managed_sse_enabled = true

  redrive_policy = jsonencode({
    deadLetterTargetArn = aws_sqs_queue.dlq.arn
    maxReceiveCount     = local.max_receive_count
  })
}

# Only the upload queue may move messages into the dead-letter queue.
resource "aws_sqs_queue_redrive_allow_policy" "dlq" {
  queue_url = aws_sqs_queue.dlq.id

  redrive_allow_policy = jsonencode({
    redrivePermission = "byQueue"
    sourceQueueArns   = [aws_sqs_queue.uploads.arn]
  })
}

resource "aws_sqs_queue_policy" "uploads" {
  queue_url = aws_sqs_queue.uploads.id
  policy    = data.aws_iam_policy_document.policy["uploads_queue"].json
}

# --- Alerts: a message in the dead-letter queue means an episode failed 3 times ------------------
# The alarm notifies the application's alerts topic when one is given (var.alerts_topic_arn);
# otherwise the stack creates <prefix>-alerts and subscribes var.alert_emails to it.

locals {
  create_alerts_topic = var.alerts_topic_arn == null
  alerts_topic_arn    = local.create_alerts_topic ? one(aws_sns_topic.alerts[*].arn) : var.alerts_topic_arn
}

resource "aws_sns_topic" "alerts" {
  count = local.create_alerts_topic ? 1 : 0

  name              = "${local.prefix}-alerts"
  kms_master_key_id = aws_kms_key.pipeline.arn
}

resource "aws_sns_topic_policy" "alerts" {
  count = local.create_alerts_topic ? 1 : 0

  arn    = aws_sns_topic.alerts[0].arn
  policy = data.aws_iam_policy_document.policy["alerts_topic"].json
}

resource "aws_sns_topic_subscription" "alert_email" {
  for_each = toset(var.alert_emails)

  topic_arn = aws_sns_topic.alerts[0].arn
  protocol  = "email"
  endpoint  = each.value
}

resource "aws_cloudwatch_metric_alarm" "dlq_not_empty" {
  alarm_name        = "${local.prefix}-uploads-dlq-not-empty"
  alarm_description = "An upload failed ${local.max_receive_count} times and is in ${aws_sqs_queue.dlq.name}. Inspect it, fix the cause, then redrive it (docs/deploy-aws.md, The dead-letter queue)."

  namespace   = "AWS/SQS"
  metric_name = "ApproximateNumberOfMessagesVisible"
  dimensions = {
    QueueName = aws_sqs_queue.dlq.name
  }
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = 1
  comparison_operator = "GreaterThanThreshold"
  threshold           = 0
  treat_missing_data  = "notBreaching"

  alarm_actions = [local.alerts_topic_arn]
  ok_actions    = [local.alerts_topic_arn]
}
