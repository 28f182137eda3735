# What the mocked AWS provider returns (terraform test, no AWS account): account 123456789012 in
# us-west-2, and for every computed ARN or URL a well-formed one (the provider validates them on
# the task definitions and policies). A few instances get their own ARN so that the tests can
# tell which one a policy names.

mock_data "aws_caller_identity" {
  defaults = {
    account_id = "123456789012"
    arn        = "arn:aws:iam::123456789012:user/terraform"
  }
}

mock_data "aws_partition" {
  defaults = {
    partition  = "aws"
    dns_suffix = "amazonaws.com"
  }
}

# The application's existing bucket (tests/terraform.tfvars names it).
mock_data "aws_s3_bucket" {
  defaults = {
    arn    = "arn:aws:s3:::toborverse-dev-data"
    region = "us-west-2"
  }
}

# Policy documents render nothing under a mock; the tests read their statements instead.
mock_data "aws_iam_policy_document" {
  defaults = {
    json = "{\"Version\":\"2012-10-17\",\"Statement\":[]}"
  }
}

mock_resource "aws_s3_bucket" {
  defaults = {
    arn = "arn:aws:s3:::mock-bucket"
  }
}

mock_resource "aws_sqs_queue" {
  defaults = {
    arn = "arn:aws:sqs:us-west-2:123456789012:episode-pipeline-uploads"
    id  = "https://sqs.us-west-2.amazonaws.com/123456789012/episode-pipeline-uploads"
    url = "https://sqs.us-west-2.amazonaws.com/123456789012/episode-pipeline-uploads"
  }
}

override_resource {
  target = aws_sqs_queue.dlq
  values = {
    arn = "arn:aws:sqs:us-west-2:123456789012:episode-pipeline-uploads-dlq"
    id  = "https://sqs.us-west-2.amazonaws.com/123456789012/episode-pipeline-uploads-dlq"
    url = "https://sqs.us-west-2.amazonaws.com/123456789012/episode-pipeline-uploads-dlq"
  }
}

mock_resource "aws_cloudwatch_log_group" {
  defaults = {
    arn = "arn:aws:logs:us-west-2:123456789012:log-group:/ecs/episode-pipeline-other"
  }
}

override_resource {
  target = aws_cloudwatch_log_group.ecs["run"]
  values = {
    arn = "arn:aws:logs:us-west-2:123456789012:log-group:/ecs/episode-pipeline-run"
  }
}

override_resource {
  target = aws_cloudwatch_log_group.ecs["transcode"]
  values = {
    arn = "arn:aws:logs:us-west-2:123456789012:log-group:/ecs/episode-pipeline-transcode"
  }
}

mock_resource "aws_iam_role" {
  defaults = {
    arn = "arn:aws:iam::123456789012:role/mock"
  }
}

mock_resource "aws_kms_key" {
  defaults = {
    arn = "arn:aws:kms:us-west-2:123456789012:key/00000000-0000-0000-0000-000000000000"
  }
}

mock_resource "aws_sns_topic" {
  defaults = {
    arn = "arn:aws:sns:us-west-2:123456789012:episode-pipeline-alerts"
  }
}

mock_resource "aws_ecr_repository" {
  defaults = {
    arn            = "arn:aws:ecr:us-west-2:123456789012:repository/episode-pipeline"
    repository_url = "123456789012.dkr.ecr.us-west-2.amazonaws.com/episode-pipeline"
  }
}

# The defaults above are the run image's repository; the webserver image has its own.
override_resource {
  target = aws_ecr_repository.image["webserver"]
  values = {
    arn            = "arn:aws:ecr:us-west-2:123456789012:repository/episode-pipeline-webserver"
    repository_url = "123456789012.dkr.ecr.us-west-2.amazonaws.com/episode-pipeline-webserver"
  }
}

mock_resource "aws_ecs_cluster" {
  defaults = {
    arn = "arn:aws:ecs:us-west-2:123456789012:cluster/episode-pipeline"
  }
}

mock_resource "aws_ecs_task_definition" {
  defaults = {
    arn = "arn:aws:ecs:us-west-2:123456789012:task-definition/episode-pipeline:1"
  }
}

mock_resource "aws_security_group" {
  defaults = {
    id = "sg-0aaaaaaaaaaaaaaaa"
  }
}

mock_resource "aws_service_discovery_service" {
  defaults = {
    arn = "arn:aws:servicediscovery:us-west-2:123456789012:service/srv-mock"
  }
}

mock_resource "aws_cloudwatch_event_rule" {
  defaults = {
    arn = "arn:aws:events:us-west-2:123456789012:rule/episode-pipeline-uploads"
  }
}

override_resource {
  target = aws_sns_topic.uploads
  values = {
    arn = "arn:aws:sns:us-west-2:123456789012:episode-pipeline-uploads"
  }
}

mock_resource "aws_iam_policy" {
  defaults = {
    arn = "arn:aws:iam::123456789012:policy/mock"
  }
}

mock_resource "aws_cloudwatch_metric_alarm" {
  defaults = {
    arn = "arn:aws:cloudwatch:us-west-2:123456789012:alarm:episode-pipeline-mock"
  }
}
