# The data bucket in its two modes and the three upload routes. Adopted (the default): the
# application's existing bucket is looked up and left as it is, and EventBridge routes its uploads
# to the queue (or SNS, from the topic the bucket already notifies). Created
# (create_data_bucket = true): a new bucket, kept like the stack's others, with an S3 event
# notification to the queue (or to a topic, or to EventBridge). Always: archives under orgs/
# whose key ends in .zst.
#
# Last, modules/bucket on its own: how the stack keeps each of its buckets (the dagster and
# access-log buckets, and a created data bucket).

mock_provider "aws" {
  source = "./tests/mocks"
}

run "adopts_the_existing_bucket" {
  assert {
    condition = (data.aws_s3_bucket.data[0].bucket == "toborverse-dev-data" && local.data_bucket_arn == "arn:aws:s3:::toborverse-dev-data"
    && output.environment.DATA_BUCKET == "toborverse-dev-data" && output.resources.upload_route == "eventbridge" && output.resources.upload_rule == "episode-pipeline-uploads")
    error_message = "The adopted bucket is looked up by data_bucket_name and is the tasks' DATA_BUCKET; the outputs say how uploads arrive."
  }

  assert {
    condition     = keys(module.bucket) == ["dagster"] && length(aws_s3_bucket_notification.data) == 0
    error_message = "Nothing on the adopted bucket is managed: no bucket settings (${jsonencode(keys(module.bucket))}), no notification configuration."
  }

  assert {
    condition     = local.logged_bucket_arns == ["arn:aws:s3:::episode-pipeline-dagster-123456789012"]
    error_message = "Only the stack's own buckets log into the access-log bucket: ${jsonencode(local.logged_bucket_arns)}"
  }

  assert {
    condition     = aws_cloudwatch_event_rule.uploads[0].name == "episode-pipeline-uploads" && coalesce(aws_cloudwatch_event_rule.uploads[0].event_bus_name, "default") == "default"
    error_message = "The upload rule is <prefix>-uploads on the default event bus (where S3 sends its events)."
  }

  assert {
    condition = jsondecode(aws_cloudwatch_event_rule.uploads[0].event_pattern) == {
      source        = ["aws.s3"]
      "detail-type" = ["Object Created"]
      detail = {
        bucket = { name = ["toborverse-dev-data"] }
        object = { key = [{ wildcard = "orgs/*.zst" }] }
      }
    }
    error_message = "The rule matches objects created in the data bucket, key orgs/...zst: ${aws_cloudwatch_event_rule.uploads[0].event_pattern}"
  }

  assert {
    condition     = aws_cloudwatch_event_target.uploads[0].rule == aws_cloudwatch_event_rule.uploads[0].name && aws_cloudwatch_event_target.uploads[0].arn == aws_sqs_queue.uploads.arn
    error_message = "The rule's target is the upload queue."
  }

  assert {
    condition = (length(aws_cloudwatch_event_target.uploads[0].input_transformer) == 0
    && aws_cloudwatch_event_target.uploads[0].input == null && aws_cloudwatch_event_target.uploads[0].input_path == null)
    error_message = "The queue gets the EventBridge event as it is (episode_pipeline/uploads/events.py reads it): no transformer, no template a key could break."
  }

  assert {
    condition     = length(aws_sns_topic.uploads) == 0 && length(aws_sns_topic_subscription.uploads) == 0
    error_message = "The EventBridge route needs no topic."
  }

  assert {
    condition = [for statement in data.aws_iam_policy_document.policy["uploads_queue"].statement : [
      one(statement.principals).identifiers, [for condition in statement.condition : join(",", condition.values) if condition.variable == "aws:SourceArn"]
    ]] == [[toset(["events.amazonaws.com"]), [aws_cloudwatch_event_rule.uploads[0].arn]]]
    error_message = "Only EventBridge, for the upload rule, may send to the queue (iam.tftest.hcl checks the whole statement)."
  }
}

# Plans as well, where no ARN is known yet: every count and for_each is known before apply.
run "adopting_plans_before_anything_exists" {
  command = plan

  assert {
    condition     = length(aws_cloudwatch_event_target.uploads) == 1 && length(aws_s3_bucket_notification.data) == 0
    error_message = "An adopted bucket is fed through EventBridge."
  }
}

run "creates_a_bucket_when_asked" {
  variables {
    create_data_bucket = true
    data_bucket_name   = null
  }

  assert {
    condition = (keys(module.bucket) == ["dagster", "data"] && module.bucket["data"].name == "episode-pipeline-data-123456789012"
    && output.environment.DATA_BUCKET == module.bucket["data"].name && output.resources.upload_route == "s3")
    error_message = "create_data_bucket creates <prefix>-data-<account>, kept like the stack's buckets (modules/bucket), for the tasks to read."
  }

  assert {
    condition     = local.owned_buckets.data.expiry == { id = "expire-old-versions", noncurrent_days = 30 } && local.owned_buckets.data.abort_days == 7
    error_message = "The created data bucket keeps overwritten versions 30 days and aborts incomplete uploads after 7."
  }

  assert {
    condition     = length(local.logged_bucket_arns) == 2 && contains(local.logged_bucket_arns, "arn:aws:s3:::episode-pipeline-data-123456789012")
    error_message = "The created data bucket logs its server access to the access-log bucket: ${jsonencode(local.logged_bucket_arns)}"
  }

  assert {
    condition     = aws_s3_bucket_notification.data[0].bucket == module.bucket["data"].name && length(aws_cloudwatch_event_rule.uploads) == 0
    error_message = "A created bucket notifies the queue itself, without EventBridge."
  }

  assert {
    condition = jsonencode(aws_s3_bucket_notification.data[0].queue) == jsonencode([{
      events        = ["s3:ObjectCreated:*"]
      filter_prefix = "orgs/"
      filter_suffix = ".zst"
      id            = "raw-episode-archives"
      queue_arn     = aws_sqs_queue.uploads.arn
    }])
    error_message = "Every object created under orgs/ with a key ending in .zst is announced on the upload queue: ${jsonencode(aws_s3_bucket_notification.data[0].queue)}"
  }

  assert {
    condition     = one(data.aws_iam_policy_document.policy["uploads_queue"].statement[0].principals).identifiers == toset(["s3.amazonaws.com"])
    error_message = "S3 sends the created bucket's notifications."
  }

  assert {
    condition     = contains(flatten([for condition in data.aws_iam_policy_document.policy["uploads_queue"].statement[0].condition : tolist(condition.values)]), module.bucket["data"].arn)
    error_message = "Only the created bucket's notifications may reach the queue (aws:SourceArn)."
  }
}

run "creating_plans_before_anything_exists" {
  command = plan

  variables {
    create_data_bucket = true
    data_bucket_name   = null
  }

  assert {
    condition     = length(aws_s3_bucket_notification.data) == 1 && length(aws_cloudwatch_event_rule.uploads) == 0
    error_message = "A created bucket is fed by its own notification."
  }
}

# The SNS route on the application's bucket: the queue subscribes to the topic the bucket already
# notifies; the bucket and the topic stay as they are.
run "an_adopted_bucket_through_its_existing_topic" {
  variables {
    upload_route     = "sns"
    upload_topic_arn = "arn:aws:sns:us-west-2:123456789012:toborverse-dev-uploads"
  }

  assert {
    condition = (aws_sns_topic_subscription.uploads[0].topic_arn == "arn:aws:sns:us-west-2:123456789012:toborverse-dev-uploads"
      && aws_sns_topic_subscription.uploads[0].protocol == "sqs" && aws_sns_topic_subscription.uploads[0].endpoint == aws_sqs_queue.uploads.arn
    && !aws_sns_topic_subscription.uploads[0].raw_message_delivery)
    error_message = "The queue subscribes to the given topic with raw message delivery off: the S3 event arrives in the envelope's Message."
  }

  assert {
    condition = (length(aws_sns_topic.uploads) == 0 && length(aws_sns_topic_policy.uploads) == 0 && length(aws_s3_bucket_notification.data) == 0
    && length(aws_cloudwatch_event_rule.uploads) == 0 && output.resources.upload_route == "sns" && output.resources.upload_topic_arn == "arn:aws:sns:us-west-2:123456789012:toborverse-dev-uploads")
    error_message = "Nothing else: no topic of its own, no notification on the adopted bucket, no EventBridge rule."
  }

  assert {
    condition = [for statement in data.aws_iam_policy_document.policy["uploads_queue"].statement : [
      statement.actions, one(statement.principals).identifiers, [for condition in statement.condition : "${condition.variable} ${join(",", condition.values)}"]
    ]] == [[toset(["sqs:SendMessage"]), toset(["sns.amazonaws.com"]), ["aws:SourceArn arn:aws:sns:us-west-2:123456789012:toborverse-dev-uploads"]]]
    error_message = "Only SNS, for that topic, may send to the queue: matched by the topic's ARN alone, as SNS's documented queue policy is."
  }
}

# The SNS route on a created bucket: the stack creates the topic and the bucket's notification to it.
run "a_created_bucket_through_a_topic_it_creates" {
  variables {
    create_data_bucket = true
    data_bucket_name   = null
    upload_route       = "sns"
  }

  assert {
    condition     = aws_sns_topic.uploads[0].name == "episode-pipeline-uploads" && aws_sns_topic.uploads[0].kms_master_key_id == aws_kms_key.pipeline.arn
    error_message = "The upload topic is <prefix>-uploads, encrypted with the stack's key."
  }

  assert {
    condition = jsonencode(aws_s3_bucket_notification.data[0].topic) == jsonencode([{
      events        = ["s3:ObjectCreated:*"]
      filter_prefix = "orgs/"
      filter_suffix = ".zst"
      id            = "raw-episode-archives"
      topic_arn     = aws_sns_topic.uploads[0].arn
    }]) && length(aws_s3_bucket_notification.data[0].queue) == 0 && !aws_s3_bucket_notification.data[0].eventbridge
    error_message = "The bucket notifies the topic (not the queue) of archives under orgs/ ending in .zst: ${jsonencode(aws_s3_bucket_notification.data[0].topic)}"
  }

  assert {
    condition     = aws_sns_topic_subscription.uploads[0].topic_arn == aws_sns_topic.uploads[0].arn && !aws_sns_topic_subscription.uploads[0].raw_message_delivery
    error_message = "The queue subscribes to the stack's topic, raw message delivery off."
  }

  assert {
    condition = (aws_sns_topic_policy.uploads[0].arn == aws_sns_topic.uploads[0].arn
      && [for statement in data.aws_iam_policy_document.policy["upload_topic"].statement : [
        statement.actions, statement.resources, one(statement.principals).identifiers, [for condition in statement.condition : join(",", condition.values) if condition.variable == "aws:SourceArn"]
    ]] == [[toset(["sns:Publish"]), toset([aws_sns_topic.uploads[0].arn]), toset(["s3.amazonaws.com"]), [module.bucket["data"].arn]]])
    error_message = "Only S3, for the created bucket, may publish to the upload topic."
  }

  assert {
    condition = [for statement in data.aws_iam_policy_document.kms.statement : flatten([
      for condition in statement.condition : tolist(condition.values) if condition.variable == "aws:SourceArn"
    ]) if statement.sid == "S3NotificationsPublishToEncryptedTopic"] == [[module.bucket["data"].arn]]
    error_message = "The stack's key lets S3 encrypt the created bucket's notifications to the upload topic."
  }
}

run "a_created_bucket_through_eventbridge" {
  variables {
    create_data_bucket = true
    data_bucket_name   = null
    upload_route       = "eventbridge"
  }

  assert {
    condition     = aws_s3_bucket_notification.data[0].eventbridge && length(aws_s3_bucket_notification.data[0].queue) == 0 && length(aws_s3_bucket_notification.data[0].topic) == 0
    error_message = "A created bucket on the EventBridge route switches its EventBridge delivery on, and notifies nothing else."
  }

  assert {
    condition     = aws_cloudwatch_event_target.uploads[0].arn == aws_sqs_queue.uploads.arn && length(aws_cloudwatch_event_target.uploads[0].input_transformer) == 0
    error_message = "The rule delivers the raw events to the queue."
  }
}

run "the_sns_route_plans_before_anything_exists" {
  command = plan

  variables {
    create_data_bucket = true
    data_bucket_name   = null
    upload_route       = "sns"
  }

  assert {
    condition     = length(aws_sns_topic.uploads) == 1 && length(aws_sns_topic_subscription.uploads) == 1 && length(aws_cloudwatch_event_rule.uploads) == 0
    error_message = "A created bucket on the SNS route gets its topic and the queue's subscription."
  }
}

run "an_adopted_bucket_is_never_given_a_direct_notification" {
  command = plan

  variables {
    upload_route = "s3"
  }

  expect_failures = [var.upload_route]
}

run "the_sns_route_on_an_adopted_bucket_needs_its_topic" {
  command = plan

  variables {
    upload_route = "sns"
  }

  expect_failures = [var.upload_route]
}

run "a_topic_is_only_for_the_sns_route" {
  command = plan

  variables {
    upload_topic_arn = "arn:aws:sns:us-west-2:123456789012:toborverse-dev-uploads"
  }

  expect_failures = [var.upload_route]
}

run "the_route_must_be_one_of_three" {
  command = plan

  variables {
    upload_route = "lambda"
  }

  expect_failures = [var.upload_route]
}

run "adopting_needs_the_bucket_name" {
  command = plan

  variables {
    data_bucket_name = null
  }

  expect_failures = [var.data_bucket_name]
}

run "the_bucket_name_must_be_valid" {
  command = plan

  variables {
    data_bucket_name = "Toborverse_Data"
  }

  expect_failures = [var.data_bucket_name]
}

run "an_adopted_bucket_in_another_region_is_refused" {
  command = plan

  override_data {
    target = data.aws_s3_bucket.data[0]
    values = {
      arn    = "arn:aws:s3:::toborverse-dev-data"
      region = "eu-west-1"
    }
  }

  expect_failures = [data.aws_s3_bucket.data]
}

run "a_bucket_logging_to_the_log_bucket" {
  module {
    source = "./modules/bucket"
  }

  variables {
    name                         = "episode-pipeline-dagster-123456789012"
    expiry                       = { id = "expire-compute-logs", prefix = "compute-logs/", current_days = 30, noncurrent_days = 1 }
    abort_incomplete_upload_days = 1
    access_log                   = { bucket = "episode-pipeline-access-logs-123456789012", prefix = "dagster/" }
  }

  assert {
    condition     = aws_s3_bucket.this.bucket == "episode-pipeline-dagster-123456789012" && output.name == aws_s3_bucket.this.bucket
    error_message = "The bucket has the name it is given."
  }

  assert {
    condition     = aws_s3_bucket_versioning.this.versioning_configuration[0].status == "Enabled"
    error_message = "Buckets are versioned."
  }

  assert {
    condition     = one(aws_s3_bucket_server_side_encryption_configuration.this.rule).apply_server_side_encryption_by_default[0].sse_algorithm == "AES256"
    error_message = "Buckets are encrypted with SSE-S3."
  }

  assert {
    condition = (aws_s3_bucket_public_access_block.this.block_public_acls && aws_s3_bucket_public_access_block.this.block_public_policy
    && aws_s3_bucket_public_access_block.this.ignore_public_acls && aws_s3_bucket_public_access_block.this.restrict_public_buckets)
    error_message = "Buckets block every kind of public access."
  }

  assert {
    condition     = aws_s3_bucket_ownership_controls.this.rule[0].object_ownership == "BucketOwnerEnforced"
    error_message = "The bucket owner owns every object (ACLs disabled)."
  }

  assert {
    condition     = aws_s3_bucket_logging.this[0].target_bucket == "episode-pipeline-access-logs-123456789012" && aws_s3_bucket_logging.this[0].target_prefix == "dagster/"
    error_message = "Server access logs go to the log bucket under the bucket's prefix."
  }

  assert {
    condition = jsonencode({ for rule in aws_s3_bucket_lifecycle_configuration.this.rule : rule.id => {
      status     = rule.status
      expire     = rule.expiration[*].days
      noncurrent = rule.noncurrent_version_expiration[*].noncurrent_days
      abort      = rule.abort_incomplete_multipart_upload[*].days_after_initiation
      } }) == jsonencode({
      "abort-incomplete-uploads" = { status = "Enabled", expire = [], noncurrent = [], abort = [1] }
      "expire-compute-logs"      = { status = "Enabled", expire = [30], noncurrent = [1], abort = [] }
    })
    error_message = "Compute logs expire after 30 days, old versions after 1, incomplete uploads are aborted after 1: ${jsonencode(aws_s3_bucket_lifecycle_configuration.this.rule)}"
  }

  assert {
    condition     = aws_s3_bucket_lifecycle_configuration.this.rule[0].filter[0].prefix == "compute-logs/"
    error_message = "The expiry rule applies to the given key prefix only."
  }

  assert {
    condition = jsonencode(data.aws_iam_policy_document.this.statement[*]) == jsonencode([{
      actions        = ["s3:*"]
      condition      = [{ test = "Bool", values = ["false"], variable = "aws:SecureTransport" }]
      effect         = "Deny"
      not_actions    = null
      not_principals = []
      not_resources  = null
      principals     = [{ identifiers = ["*"], type = "*" }]
      resources      = [aws_s3_bucket.this.arn, "${aws_s3_bucket.this.arn}/*"]
      sid            = "DenyInsecureTransport"
    }])
    error_message = "The bucket policy refuses every request without TLS: ${jsonencode(data.aws_iam_policy_document.this.statement)}"
  }

  assert {
    condition     = aws_s3_bucket_policy.this.bucket == aws_s3_bucket.this.id && aws_s3_bucket_policy.this.policy == data.aws_iam_policy_document.this.json
    error_message = "The policy document is the bucket's policy."
  }
}

run "the_log_bucket_itself" {
  module {
    source = "./modules/bucket"
  }

  variables {
    name                         = "episode-pipeline-access-logs-123456789012"
    expiry                       = { id = "expire-access-logs", current_days = 90, noncurrent_days = 1 }
    abort_incomplete_upload_days = 1
    policy_documents             = ["{\"Statement\":[{\"Sid\":\"S3ServerAccessLogDelivery\"}]}"]
  }

  assert {
    condition     = length(aws_s3_bucket_logging.this) == 0
    error_message = "The log bucket does not log into itself."
  }

  assert {
    condition     = data.aws_iam_policy_document.this.source_policy_documents == tolist(["{\"Statement\":[{\"Sid\":\"S3ServerAccessLogDelivery\"}]}"])
    error_message = "The log bucket's policy also grants what it is given (S3 log delivery)."
  }

  assert {
    condition = jsonencode([for rule in aws_s3_bucket_lifecycle_configuration.this.rule : [rule.id, rule.expiration[*].days, rule.noncurrent_version_expiration[*].noncurrent_days]]) == jsonencode([
      ["expire-access-logs", [90], [1]],
      ["abort-incomplete-uploads", [], []],
    ])
    error_message = "Access logs are kept 90 days."
  }
}
