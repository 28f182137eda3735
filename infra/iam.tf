# IAM: one execution role (pull the image, write logs, read the DB secret) and one task role per
# process, each limited to what that process does.
#
#   webserver    reads run state, stops run tasks on "terminate", shows compute logs, lists an
#                episode's prefix to size a run it launches (instance/run_coordinator.py)
#   daemon       launches run tasks (EcsRunLauncher) from the run task family only, lists an
#                episode's prefix to size a run it queues (a backfill's, a retry)
#   code server  evaluates the sensors: receives/deletes/changes visibility on the upload queue
#   run worker   reads orgs/*, writes only orgs/*/episodes/*/processed/*, writes the episode rows,
#                launches the transcode task family only; never touches a queue (the sensors do)
#   transcode    reads orgs/*, writes only orgs/*/episodes/*/processed/*
#   dlq          the one-off `episode-pipeline dlq list|redrive` task: reads and deletes on the
#                dead-letter queue, sends to the upload queue, reads Dagster's run history
#
# And one managed policy for people, not tasks: dlq-operator, what an operator needs to start the
# dlq task and read its output (docs/deploy-aws.md, "The dead-letter queue").
#
# Every policy of the stack but the KMS key's is a list of statements in the tables below, all
# rendered by one policy document (data.aws_iam_policy_document.policy[<name>]). A statement has
# actions, and optionally a sid, resources, conditions ({test, variable, values}), and a service
# principal. A statement for a service principal is limited to this account (aws:SourceAccount)
# unless it says `any_account = true` (a service that sets only aws:SourceArn), and, given
# sources, to those source ARNs (aws:SourceArn).
# infra/tests/iam.tftest.hcl checks what they render: every role's statements, "*" only for
# actions without resource-level permissions (checkov does not read statements built this way).

locals {
  run_family       = "${local.prefix}-run"
  transcode_family = "${local.prefix}-transcode"

  cluster_tasks_arn = "arn:${local.partition}:ecs:${var.region}:${local.account_id}:task/${local.prefix}/*"

  rds_db_user_arn      = "arn:${local.partition}:rds-db:${var.region}:${local.account_id}:dbuser:${var.db_cluster_resource_id}/${var.db_user}"
  rds_dagster_user_arn = "arn:${local.partition}:rds-db:${var.region}:${local.account_id}:dbuser:${var.db_cluster_resource_id}/${var.dagster_db_user}"

  raw_objects_arn       = "${local.data_bucket_arn}/orgs/*"
  processed_objects_arn = "${local.data_bucket_arn}/orgs/*/episodes/*/processed/*"
  compute_logs_arn      = "${module.bucket["dagster"].arn}/${local.compute_log_prefix}/*"

  # The roles, <prefix>-<key>, each with one inline policy: its name, and its statements below.
  # Policies name a role by its ARN, built from the name (referring to aws_iam_role.task would
  # make the roles depend on the policies that mention them).
  task_role_arns = { for key in keys(local.task_roles) : key => "arn:${local.partition}:iam::${local.account_id}:role/${local.prefix}-${key}" }
  task_roles = {
    execution     = "pull-image-write-logs-read-secret"
    webserver     = "webserver"
    daemon        = "daemon"
    "code-server" = "code-server"
    run           = "run"
    transcode     = "transcode"
    dlq           = "dead-letter-queue-operations"
  }

  # Who starts which task family through the ECS API: only that family, only on this cluster,
  # passing only that task's role and the execution role.
  task_launchers = {
    daemon = { tasks = "Run", family = local.run_family, role = local.task_role_arns.run }
    run    = { tasks = "Transcode", family = local.transcode_family, role = local.task_role_arns.transcode }
  }
  launch_tasks = { for launcher, launch in local.task_launchers : launcher => [
    {
      sid        = "Launch${launch.tasks}Tasks", actions = ["ecs:RunTask"]
      resources  = ["arn:${local.partition}:ecs:${var.region}:${local.account_id}:task-definition/${launch.family}:*"]
      conditions = [{ test = "ArnEquals", variable = "ecs:cluster", values = [aws_ecs_cluster.main.arn] }]
    },
    {
      sid        = "Tag${launch.tasks}Tasks", actions = ["ecs:TagResource"], resources = [local.cluster_tasks_arn]
      conditions = [{ test = "StringEquals", variable = "ecs:CreateAction", values = ["RunTask"] }]
    },
    { sid = "Monitor${launch.tasks}Tasks", actions = ["ecs:DescribeTasks", "ecs:StopTask"], resources = [local.cluster_tasks_arn] },
    {
      sid        = "Pass${launch.tasks}Roles", actions = ["iam:PassRole"], resources = [launch.role, local.task_role_arns.execution]
      conditions = [{ test = "StringEquals", variable = "iam:PassedToService", values = ["ecs-tasks.amazonaws.com"] }]
    },
  ] }

  # The run queue (EpisodeRunCoordinator, in the webserver for a UI launch and in the daemon for
  # a backfill or a retry) sizes a run nobody sized from its archive, found in the episode's
  # listing: list only, never read.
  list_episodes = { sid = "SizeRunsFromTheirArchive", actions = ["s3:ListBucket"], resources = [local.data_bucket_arn], conditions = [{ test = "StringLike", variable = "s3:prefix", values = ["orgs/*"] }] }

  # The run worker and the transcode task: read anything under orgs/, write only below an
  # episode's processed/ prefix.
  episode_objects = [
    { sid = "ReadEpisodeObjects", actions = ["s3:GetObject"], resources = [local.raw_objects_arn] },
    {
      sid        = "ListEpisodeObjects", actions = ["s3:ListBucket"], resources = [local.data_bucket_arn]
      conditions = [{ test = "StringLike", variable = "s3:prefix", values = ["orgs/*"] }]
    },
    { sid = "WriteProcessedObjects", actions = ["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"], resources = [local.processed_objects_arn] },
  ]

  # "*": ecr:GetAuthorizationToken, ecs:DescribeTaskDefinition and ec2:DescribeNetworkInterfaces
  # have no resource-level permissions.
  task_permissions = {
    execution = concat(
      [
        { sid = "EcrAuth", actions = ["ecr:GetAuthorizationToken"], resources = ["*"] },
        { sid = "EcrPull", actions = ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"], resources = [for repository in aws_ecr_repository.image : repository.arn] },
        { sid = "WriteTaskLogs", actions = ["logs:CreateLogStream", "logs:PutLogEvents"], resources = [for group in aws_cloudwatch_log_group.ecs : "${group.arn}:*"] },
      ],
      [for secret in compact([var.db_password_secret_arn]) : { sid = "ReadDatabaseSecret", actions = ["secretsmanager:GetSecretValue"], resources = [secret] }],
      [for key in compact([var.db_secret_kms_key_arn]) : { sid = "DecryptDatabaseSecret", actions = ["kms:Decrypt"], resources = [key] }],
    )
    webserver = [
      { sid = "DagsterStorage", actions = ["rds-db:connect"], resources = [local.rds_dagster_user_arn] },
      { sid = "DescribeRunTaskDefinition", actions = ["ecs:DescribeTaskDefinition"], resources = ["*"] },
      { sid = "TerminateRuns", actions = ["ecs:DescribeTasks", "ecs:StopTask"], resources = [local.cluster_tasks_arn] },
      { sid = "ReadComputeLogs", actions = ["s3:GetObject"], resources = [local.compute_logs_arn] },
      {
        sid        = "ListComputeLogs", actions = ["s3:ListBucket"], resources = [module.bucket["dagster"].arn]
        conditions = [{ test = "StringLike", variable = "s3:prefix", values = ["${local.compute_log_prefix}/*"] }]
      },
      local.list_episodes,
    ]
    daemon = concat(local.launch_tasks.daemon, [
      { sid = "DagsterStorage", actions = ["rds-db:connect"], resources = [local.rds_dagster_user_arn] },
      # EcsRunLauncher copies subnets and security groups from the daemon's own task (ENI lookup).
      { sid = "DescribeTaskDefinitionsAndNetwork", actions = ["ecs:DescribeTaskDefinition", "ec2:DescribeNetworkInterfaces"], resources = ["*"] },
      { sid = "ReadRunLogsOnFailure", actions = ["logs:GetLogEvents"], resources = ["${aws_cloudwatch_log_group.ecs["run"].arn}:*"] },
      local.list_episodes,
    ])
    # Sensor code runs in the code server process (the daemon only asks it over gRPC), so the
    # queue permissions belong here.
    "code-server" = [
      {
        sid     = "ConsumeUploadQueue", resources = [aws_sqs_queue.uploads.arn]
        actions = ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueAttributes", "sqs:GetQueueUrl"]
      },
      { sid = "WatchDeadLetterQueue", actions = ["sqs:GetQueueAttributes", "sqs:GetQueueUrl"], resources = [aws_sqs_queue.dlq.arn] },
      { sid = "ReadRawArchives", actions = ["s3:GetObject", "s3:GetObjectVersion"], resources = [local.raw_objects_arn] },
      {
        sid        = "ListEpisodes", actions = ["s3:ListBucket", "s3:ListBucketVersions"], resources = [local.data_bucket_arn]
        conditions = [{ test = "StringLike", variable = "s3:prefix", values = ["orgs/*"] }]
      },
      { sid = "Databases", actions = ["rds-db:connect"], resources = [local.rds_db_user_arn, local.rds_dagster_user_arn] },
      { sid = "DescribeRunTaskDefinition", actions = ["ecs:DescribeTaskDefinition"], resources = ["*"] },
    ]
    run = concat(local.episode_objects, local.launch_tasks.run, [
      { sid = "Databases", actions = ["rds-db:connect"], resources = [local.rds_db_user_arn, local.rds_dagster_user_arn] },
      { sid = "WriteComputeLogs", actions = ["s3:PutObject", "s3:GetObject"], resources = [local.compute_logs_arn] },
      # PipesECSClient reads the transcode task definition's log configuration, then the task's
      # Pipes messages from its CloudWatch log stream (DescribeLogStreams until it exists).
      { sid = "DescribeTaskDefinitions", actions = ["ecs:DescribeTaskDefinition"], resources = ["*"] },
      {
        sid       = "ReadTranscodeLogs", actions = ["logs:GetLogEvents", "logs:DescribeLogStreams"]
        resources = [aws_cloudwatch_log_group.ecs["transcode"].arn, "${aws_cloudwatch_log_group.ecs["transcode"].arn}:*"]
      },
    ])
    transcode = local.episode_objects
    # episode_pipeline/uploads/dead_letters.py: `list` receives every message (hiding each a
    # while, then showing it again: ChangeMessageVisibility) and reads each upload's runs from
    # Dagster's storage; `redrive` sends a message to the upload queue, then deletes it from the
    # DLQ.
    dlq = [
      {
        sid     = "ReadAndDeleteDeadLetters", resources = [aws_sqs_queue.dlq.arn]
        actions = ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueAttributes"]
      },
      { sid = "RedriveToUploadQueue", actions = ["sqs:SendMessage"], resources = [aws_sqs_queue.uploads.arn] },
      { sid = "ReadRunHistory", actions = ["rds-db:connect"], resources = [local.rds_dagster_user_arn] },
    ]
  }

  # Managed policies for people (attach them to a role or group in the account's IAM).
  operator_permissions = {
    "dlq-operator" = [
      {
        sid        = "StartDeadLetterQueueTask", actions = ["ecs:RunTask"]
        resources  = ["arn:${local.partition}:ecs:${var.region}:${local.account_id}:task-definition/${local.prefix}-dlq:*"]
        conditions = [{ test = "ArnEquals", variable = "ecs:cluster", values = [aws_ecs_cluster.main.arn] }]
      },
      { sid = "FollowDeadLetterQueueTask", actions = ["ecs:DescribeTasks"], resources = [local.cluster_tasks_arn] },
      {
        sid        = "PassDeadLetterQueueTaskRoles", actions = ["iam:PassRole"], resources = [local.task_role_arns.dlq, local.task_role_arns.execution]
        conditions = [{ test = "StringEquals", variable = "iam:PassedToService", values = ["ecs-tasks.amazonaws.com"] }]
      },
      { sid = "ReadDeadLetterQueueTaskOutput", actions = ["logs:GetLogEvents"], resources = ["${aws_cloudwatch_log_group.ecs["dlq"].arn}:*"] },
    ]
  }

  # Resource policies that let an AWS service act on this stack's resources.
  service_grants = merge({
    ecs_tasks_assume = [{ service = "ecs-tasks.amazonaws.com", actions = ["sts:AssumeRole"] }]
    # S3, the upload topic, or the EventBridge rule: the route's sender (notifications.tf).
    uploads_queue = [{
      sid       = local.upload_sender.sid, service = local.upload_sender.service, actions = ["sqs:SendMessage"]
      resources = [aws_sqs_queue.uploads.arn], sources = [local.upload_sender.source_arn], any_account = local.upload_sender.any_account
    }]
    access_log_delivery = [{
      sid       = "S3ServerAccessLogDelivery", service = "logging.s3.amazonaws.com", actions = ["s3:PutObject"]
      resources = ["arn:${local.partition}:s3:::${local.logs_bucket_name}/*"], sources = local.logged_bucket_arns
    }]
    }, local.create_alerts_topic ? {
    alerts_topic = [{ sid = "CloudWatchAlarms", service = "cloudwatch.amazonaws.com", actions = ["sns:Publish"], resources = aws_sns_topic.alerts[*].arn }]
    } : {}, local.create_upload_topic ? {
    upload_topic = [{
      sid       = "DataBucketNotifications", service = "s3.amazonaws.com", actions = ["sns:Publish"]
      resources = aws_sns_topic.uploads[*].arn, sources = [local.data_bucket_arn]
    }]
  } : {})
}

data "aws_iam_policy_document" "policy" {
  for_each = merge(local.task_permissions, local.operator_permissions, local.service_grants)

  dynamic "statement" {
    for_each = each.value

    content {
      sid       = try(statement.value.sid, null)
      effect    = "Allow"
      actions   = statement.value.actions
      resources = try(statement.value.resources, null)

      dynamic "principals" {
        for_each = try([statement.value.service], [])
        content {
          type        = "Service"
          identifiers = [principals.value]
        }
      }

      dynamic "condition" {
        for_each = concat(
          try(statement.value.conditions, []),
          [for service in try([statement.value.service], []) : { test = "StringEquals", variable = "aws:SourceAccount", values = [local.account_id] } if !try(statement.value.any_account, false)],
          [for sources in try([statement.value.sources], []) : { test = "ArnLike", variable = "aws:SourceArn", values = sources }],
        )
        content {
          test     = condition.value.test
          variable = condition.value.variable
          values   = condition.value.values
        }
      }
    }
  }
}

resource "aws_iam_role" "task" {
  for_each = local.task_roles

  name               = "${local.prefix}-${each.key}"
  assume_role_policy = data.aws_iam_policy_document.policy["ecs_tasks_assume"].json
}

resource "aws_iam_policy" "operator" {
  for_each = local.operator_permissions

  name        = "${local.prefix}-${each.key}"
  description = "${local.prefix} ${each.key}: docs/deploy-aws.md says what it is for"
  policy      = data.aws_iam_policy_document.policy[each.key].json
}

resource "aws_iam_role_policy" "task" {
  for_each = local.task_roles

  name   = each.value
  role   = aws_iam_role.task[each.key].id
  policy = data.aws_iam_policy_document.policy[each.key].json
}
