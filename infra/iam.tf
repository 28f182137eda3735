# IAM: one execution role (pull the image, write logs, read the DB secret) and one task role per
# process, each limited to what that process does.
#
#   webserver    reads run state, stops run tasks on "terminate", shows compute logs
#   daemon       launches run tasks (EcsRunLauncher) from the run task family only
#   code server  evaluates the sensors: receives/deletes/changes visibility on the upload queue
#   run worker   reads orgs/*, writes only orgs/*/episodes/*/processed/*, writes the episode rows,
#                launches the transcode task family only
#   transcode    reads orgs/*, writes only orgs/*/episodes/*/processed/*

locals {
  run_family       = "${local.prefix}-run"
  transcode_family = "${local.prefix}-transcode"

  run_task_definition_arns       = "arn:${local.partition}:ecs:${var.region}:${local.account_id}:task-definition/${local.run_family}:*"
  transcode_task_definition_arns = "arn:${local.partition}:ecs:${var.region}:${local.account_id}:task-definition/${local.transcode_family}:*"
  cluster_tasks_arn              = "arn:${local.partition}:ecs:${var.region}:${local.account_id}:task/${local.prefix}/*"

  rds_db_user_arn      = "arn:${local.partition}:rds-db:${var.region}:${local.account_id}:dbuser:${var.db_cluster_resource_id}/${var.db_user}"
  rds_dagster_user_arn = "arn:${local.partition}:rds-db:${var.region}:${local.account_id}:dbuser:${var.db_cluster_resource_id}/${var.dagster_db_user}"

  raw_objects_arn       = "${aws_s3_bucket.data.arn}/orgs/*"
  processed_objects_arn = "${aws_s3_bucket.data.arn}/orgs/*/episodes/*/processed/*"
  compute_logs_arn      = "${aws_s3_bucket.dagster.arn}/${local.compute_log_prefix}/*"
}

data "aws_iam_policy_document" "ecs_tasks_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
  }
}

# --- Execution role (ECS agent) ------------------------------------------------------------------

resource "aws_iam_role" "execution" {
  name               = "${local.prefix}-execution"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
}

resource "aws_iam_role_policy" "execution" {
  name   = "pull-image-write-logs-read-secret"
  role   = aws_iam_role.execution.id
  policy = data.aws_iam_policy_document.execution.json
}

data "aws_iam_policy_document" "execution" {
  statement {
    sid       = "EcrAuth"
    actions   = ["ecr:GetAuthorizationToken"]
    resources = ["*"] # GetAuthorizationToken has no resource-level permissions.
  }

  statement {
    sid = "EcrPull"
    actions = [
      "ecr:BatchCheckLayerAvailability",
      "ecr:BatchGetImage",
      "ecr:GetDownloadUrlForLayer",
    ]
    resources = [aws_ecr_repository.app.arn]
  }

  statement {
    sid       = "WriteTaskLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = [for group in aws_cloudwatch_log_group.ecs : "${group.arn}:*"]
  }

  dynamic "statement" {
    for_each = var.db_password_secret_arn == null ? [] : [var.db_password_secret_arn]
    content {
      sid       = "ReadDatabaseSecret"
      actions   = ["secretsmanager:GetSecretValue"]
      resources = [statement.value]
    }
  }

  dynamic "statement" {
    for_each = var.db_secret_kms_key_arn == null ? [] : [var.db_secret_kms_key_arn]
    content {
      sid       = "DecryptDatabaseSecret"
      actions   = ["kms:Decrypt"]
      resources = [statement.value]
    }
  }
}

# --- Webserver -----------------------------------------------------------------------------------

resource "aws_iam_role" "webserver" {
  name               = "${local.prefix}-webserver"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
}

resource "aws_iam_role_policy" "webserver" {
  name   = "webserver"
  role   = aws_iam_role.webserver.id
  policy = data.aws_iam_policy_document.webserver.json
}

data "aws_iam_policy_document" "webserver" {
  statement {
    sid       = "DagsterStorage"
    actions   = ["rds-db:connect"]
    resources = [local.rds_dagster_user_arn]
  }

  statement {
    sid       = "DescribeRunTaskDefinition"
    actions   = ["ecs:DescribeTaskDefinition"]
    resources = ["*"] # DescribeTaskDefinition has no resource-level permissions.
  }

  statement {
    sid       = "TerminateRuns"
    actions   = ["ecs:DescribeTasks", "ecs:StopTask"]
    resources = [local.cluster_tasks_arn]
  }

  statement {
    sid       = "ReadComputeLogs"
    actions   = ["s3:GetObject"]
    resources = [local.compute_logs_arn]
  }

  statement {
    sid       = "ListComputeLogs"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.dagster.arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${local.compute_log_prefix}/*"]
    }
  }
}

# --- Daemon --------------------------------------------------------------------------------------

resource "aws_iam_role" "daemon" {
  name               = "${local.prefix}-daemon"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
}

resource "aws_iam_role_policy" "daemon" {
  name   = "daemon"
  role   = aws_iam_role.daemon.id
  policy = data.aws_iam_policy_document.daemon.json
}

data "aws_iam_policy_document" "daemon" {
  statement {
    sid       = "DagsterStorage"
    actions   = ["rds-db:connect"]
    resources = [local.rds_dagster_user_arn]
  }

  statement {
    sid       = "LaunchRunTasks"
    actions   = ["ecs:RunTask"]
    resources = [local.run_task_definition_arns]

    condition {
      test     = "ArnEquals"
      variable = "ecs:cluster"
      values   = [aws_ecs_cluster.main.arn]
    }
  }

  statement {
    sid       = "TagRunTasks"
    actions   = ["ecs:TagResource"]
    resources = [local.cluster_tasks_arn]

    condition {
      test     = "StringEquals"
      variable = "ecs:CreateAction"
      values   = ["RunTask"]
    }
  }

  statement {
    sid       = "MonitorRunTasks"
    actions   = ["ecs:DescribeTasks", "ecs:StopTask"]
    resources = [local.cluster_tasks_arn]
  }

  statement {
    sid = "DescribeTaskDefinitionsAndNetwork"
    # EcsRunLauncher copies subnets and security groups from the daemon's own task (ENI lookup).
    # Neither action supports resource-level permissions.
    actions   = ["ecs:DescribeTaskDefinition", "ec2:DescribeNetworkInterfaces"]
    resources = ["*"]
  }

  statement {
    sid       = "PassRunRoles"
    actions   = ["iam:PassRole"]
    resources = [aws_iam_role.run.arn, aws_iam_role.execution.arn]

    condition {
      test     = "StringEquals"
      variable = "iam:PassedToService"
      values   = ["ecs-tasks.amazonaws.com"]
    }
  }

  statement {
    sid       = "ReadRunLogsOnFailure"
    actions   = ["logs:GetLogEvents"]
    resources = ["${aws_cloudwatch_log_group.ecs["run"].arn}:*"]
  }
}

# --- Code server (sensors) -----------------------------------------------------------------------

resource "aws_iam_role" "code_server" {
  name               = "${local.prefix}-code-server"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
}

resource "aws_iam_role_policy" "code_server" {
  name   = "code-server"
  role   = aws_iam_role.code_server.id
  policy = data.aws_iam_policy_document.code_server.json
}

data "aws_iam_policy_document" "code_server" {
  # Sensor code runs in the code server process (the daemon only asks it over gRPC), so the
  # queue permissions belong here.
  statement {
    sid = "ConsumeUploadQueue"
    actions = [
      "sqs:ReceiveMessage",
      "sqs:DeleteMessage",
      "sqs:ChangeMessageVisibility",
      "sqs:GetQueueAttributes",
      "sqs:GetQueueUrl",
    ]
    resources = [aws_sqs_queue.uploads.arn]
  }

  statement {
    sid       = "WatchDeadLetterQueue"
    actions   = ["sqs:GetQueueAttributes", "sqs:GetQueueUrl"]
    resources = [aws_sqs_queue.dlq.arn]
  }

  statement {
    sid       = "ReadRawArchives"
    actions   = ["s3:GetObject", "s3:GetObjectVersion"]
    resources = [local.raw_objects_arn]
  }

  statement {
    sid       = "ListEpisodes"
    actions   = ["s3:ListBucket", "s3:ListBucketVersions"]
    resources = [aws_s3_bucket.data.arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["orgs/*"]
    }
  }

  statement {
    sid       = "Databases"
    actions   = ["rds-db:connect"]
    resources = [local.rds_db_user_arn, local.rds_dagster_user_arn]
  }

  statement {
    sid       = "DescribeRunTaskDefinition"
    actions   = ["ecs:DescribeTaskDefinition"]
    resources = ["*"] # no resource-level permissions
  }
}

# --- Run worker ----------------------------------------------------------------------------------

resource "aws_iam_role" "run" {
  name               = "${local.prefix}-run"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
}

resource "aws_iam_role_policy" "run" {
  name   = "run"
  role   = aws_iam_role.run.id
  policy = data.aws_iam_policy_document.run.json
}

data "aws_iam_policy_document" "run" {
  source_policy_documents = [data.aws_iam_policy_document.episode_objects.json]

  statement {
    sid       = "Databases"
    actions   = ["rds-db:connect"]
    resources = [local.rds_db_user_arn, local.rds_dagster_user_arn]
  }

  statement {
    sid       = "WriteComputeLogs"
    actions   = ["s3:PutObject", "s3:GetObject"]
    resources = [local.compute_logs_arn]
  }

  statement {
    # The seed's contract: the message is deleted only after a successful run, and a failed run
    # leaves it for SQS to redeliver.
    sid       = "FinishUploadMessage"
    actions   = ["sqs:DeleteMessage", "sqs:ChangeMessageVisibility"]
    resources = [aws_sqs_queue.uploads.arn]
  }

  statement {
    sid       = "LaunchTranscodeTasks"
    actions   = ["ecs:RunTask"]
    resources = [local.transcode_task_definition_arns]

    condition {
      test     = "ArnEquals"
      variable = "ecs:cluster"
      values   = [aws_ecs_cluster.main.arn]
    }
  }

  statement {
    sid       = "TagTranscodeTasks"
    actions   = ["ecs:TagResource"]
    resources = [local.cluster_tasks_arn]

    condition {
      test     = "StringEquals"
      variable = "ecs:CreateAction"
      values   = ["RunTask"]
    }
  }

  statement {
    sid       = "WaitForTranscodeTasks"
    actions   = ["ecs:DescribeTasks", "ecs:StopTask"]
    resources = [local.cluster_tasks_arn]
  }

  statement {
    sid       = "DescribeTaskDefinitions"
    actions   = ["ecs:DescribeTaskDefinition"]
    resources = ["*"] # no resource-level permissions
  }

  statement {
    sid       = "PassTranscodeRoles"
    actions   = ["iam:PassRole"]
    resources = [aws_iam_role.transcode.arn, aws_iam_role.execution.arn]

    condition {
      test     = "StringEquals"
      variable = "iam:PassedToService"
      values   = ["ecs-tasks.amazonaws.com"]
    }
  }

  statement {
    # PipesECSClient reads the transcode task's Pipes messages from its CloudWatch log stream.
    sid       = "ReadTranscodeLogs"
    actions   = ["logs:GetLogEvents", "logs:FilterLogEvents", "logs:DescribeLogStreams"]
    resources = [aws_cloudwatch_log_group.ecs["transcode"].arn, "${aws_cloudwatch_log_group.ecs["transcode"].arn}:*"]
  }
}

# --- Transcode task ------------------------------------------------------------------------------

resource "aws_iam_role" "transcode" {
  name               = "${local.prefix}-transcode"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
}

resource "aws_iam_role_policy" "transcode" {
  name   = "transcode"
  role   = aws_iam_role.transcode.id
  policy = data.aws_iam_policy_document.episode_objects.json
}

# Shared by the run worker and the transcode task: read anything under orgs/, write only below an
# episode's processed/ prefix.
data "aws_iam_policy_document" "episode_objects" {
  statement {
    sid       = "ReadEpisodeObjects"
    actions   = ["s3:GetObject", "s3:GetObjectVersion"]
    resources = [local.raw_objects_arn]
  }

  statement {
    sid       = "ListEpisodeObjects"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.data.arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["orgs/*"]
    }
  }

  statement {
    sid = "WriteProcessedObjects"
    actions = [
      "s3:PutObject",
      "s3:DeleteObject",
      "s3:AbortMultipartUpload",
    ]
    resources = [local.processed_objects_arn]
  }
}
