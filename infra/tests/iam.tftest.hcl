# IAM: one role per process, each limited to what the process does (README.md, "Permissions, in
# short"). The policies are tables (iam.tf) rendered by data.aws_iam_policy_document.policy; these
# runs read the rendered statements.

mock_provider "aws" {
  source = "./tests/mocks"

  override_data {
    target = data.aws_iam_policy_document.policy["transcode"]
    values = { json = "{\"Version\":\"2012-10-17\",\"Statement\":[{\"Sid\":\"TranscodePolicy\"}]}" }
  }

  override_data {
    target = data.aws_iam_policy_document.policy["ecs_tasks_assume"]
    values = { json = "{\"Version\":\"2012-10-17\",\"Statement\":[{\"Sid\":\"AssumeRolePolicy\"}]}" }
  }
}

variables {
  db_password_secret_arn = "arn:aws:secretsmanager:us-west-2:123456789012:secret:toborverse-db-AbCdEf"
  db_secret_kms_key_arn  = "arn:aws:kms:us-west-2:123456789012:key/11111111-1111-1111-1111-111111111111"
}

run "each_process_may_do_only_its_work" {
  # Roles and their inline policies.
  assert {
    condition = { for key, role in aws_iam_role.task : key => [role.name, aws_iam_role_policy.task[key].name] } == {
      execution     = ["episode-pipeline-execution", "pull-image-write-logs-read-secret"]
      webserver     = ["episode-pipeline-webserver", "webserver"]
      daemon        = ["episode-pipeline-daemon", "daemon"]
      "code-server" = ["episode-pipeline-code-server", "code-server"]
      run           = ["episode-pipeline-run", "run"]
      transcode     = ["episode-pipeline-transcode", "transcode"]
      dlq           = ["episode-pipeline-dlq", "dead-letter-queue-operations"]
    }
    error_message = "One role per process, <prefix>-<process>, with one inline policy."
  }

  assert {
    condition     = alltrue([for key, arn in local.task_role_arns : arn == "arn:aws:iam::123456789012:role/${aws_iam_role.task[key].name}"])
    error_message = "The role ARNs the policies name are the roles' own: ${jsonencode(local.task_role_arns)}"
  }

  assert {
    condition = (aws_iam_role_policy.task["transcode"].policy == data.aws_iam_policy_document.policy["transcode"].json
      && aws_iam_role_policy.task["transcode"].role == aws_iam_role.task["transcode"].id
      && alltrue([for role in aws_iam_role.task : role.assume_role_policy == data.aws_iam_policy_document.policy["ecs_tasks_assume"].json])
    )
    error_message = "Each role gets the policy of its own name, and every role trusts ECS tasks (the ecs_tasks_assume grant below)."
  }

  # Every role's permissions, one line per statement: "actions on resources [if conditions]".
  # What each role may do, and on what, is exactly this (the scopes of README.md, "Permissions,
  # in short"): reads under orgs/, writes only below processed/, ecs:RunTask only for the run
  # and transcode families on this cluster, iam:PassRole only for the launched task's role.
  assert {
    condition = { for key in keys(local.task_roles) : key => toset([
      for statement in data.aws_iam_policy_document.policy[key].statement : join(" if ", concat(
        ["${join(",", sort(statement.actions))} on ${join(",", sort(statement.resources))}"],
        [for condition in statement.condition : "${condition.variable} ${condition.test} ${join(",", sort(condition.values))}"],
      ))
      ]) } == {
      execution = toset([
        "ecr:GetAuthorizationToken on *",
        "ecr:BatchCheckLayerAvailability,ecr:BatchGetImage,ecr:GetDownloadUrlForLayer on arn:aws:ecr:us-west-2:123456789012:repository/episode-pipeline,arn:aws:ecr:us-west-2:123456789012:repository/episode-pipeline-webserver",
        "logs:CreateLogStream,logs:PutLogEvents on ${join(",", sort(distinct([for group in aws_cloudwatch_log_group.ecs : "${group.arn}:*"])))}",
        "secretsmanager:GetSecretValue on arn:aws:secretsmanager:us-west-2:123456789012:secret:toborverse-db-AbCdEf",
        "kms:Decrypt on arn:aws:kms:us-west-2:123456789012:key/11111111-1111-1111-1111-111111111111",
      ])
      webserver = toset([
        "rds-db:connect on arn:aws:rds-db:us-west-2:123456789012:dbuser:cluster-ABCDEFGHIJKLMNOP/dagster",
        "ecs:DescribeTaskDefinition on *",
        "ecs:DescribeTasks,ecs:StopTask on arn:aws:ecs:us-west-2:123456789012:task/episode-pipeline/*",
        "s3:GetObject on arn:aws:s3:::mock-bucket/compute-logs/*",
        "s3:ListBucket on arn:aws:s3:::mock-bucket if s3:prefix StringLike compute-logs/*",
        "s3:ListBucket on arn:aws:s3:::toborverse-dev-data if s3:prefix StringLike orgs/*",
      ])
      daemon = toset([
        "ecs:RunTask on arn:aws:ecs:us-west-2:123456789012:task-definition/episode-pipeline-run:* if ecs:cluster ArnEquals ${aws_ecs_cluster.main.arn}",
        "ecs:TagResource on arn:aws:ecs:us-west-2:123456789012:task/episode-pipeline/* if ecs:CreateAction StringEquals RunTask",
        "ecs:DescribeTasks,ecs:StopTask on arn:aws:ecs:us-west-2:123456789012:task/episode-pipeline/*",
        "iam:PassRole on arn:aws:iam::123456789012:role/episode-pipeline-execution,arn:aws:iam::123456789012:role/episode-pipeline-run if iam:PassedToService StringEquals ecs-tasks.amazonaws.com",
        "rds-db:connect on arn:aws:rds-db:us-west-2:123456789012:dbuser:cluster-ABCDEFGHIJKLMNOP/dagster",
        "ec2:DescribeNetworkInterfaces,ecs:DescribeTaskDefinition on *",
        "logs:GetLogEvents on ${aws_cloudwatch_log_group.ecs["run"].arn}:*",
        "s3:ListBucket on arn:aws:s3:::toborverse-dev-data if s3:prefix StringLike orgs/*",
      ])
      "code-server" = toset([
        "sqs:ChangeMessageVisibility,sqs:DeleteMessage,sqs:GetQueueAttributes,sqs:GetQueueUrl,sqs:ReceiveMessage on ${aws_sqs_queue.uploads.arn}",
        "sqs:GetQueueAttributes,sqs:GetQueueUrl on ${aws_sqs_queue.dlq.arn}",
        "s3:GetObject,s3:GetObjectVersion on arn:aws:s3:::toborverse-dev-data/orgs/*",
        "s3:ListBucket,s3:ListBucketVersions on arn:aws:s3:::toborverse-dev-data if s3:prefix StringLike orgs/*",
        "rds-db:connect on arn:aws:rds-db:us-west-2:123456789012:dbuser:cluster-ABCDEFGHIJKLMNOP/app_user,arn:aws:rds-db:us-west-2:123456789012:dbuser:cluster-ABCDEFGHIJKLMNOP/dagster",
        "ecs:DescribeTaskDefinition on *",
      ])
      run = toset([
        "s3:GetObject on arn:aws:s3:::toborverse-dev-data/orgs/*",
        "s3:ListBucket on arn:aws:s3:::toborverse-dev-data if s3:prefix StringLike orgs/*",
        "s3:AbortMultipartUpload,s3:DeleteObject,s3:PutObject on arn:aws:s3:::toborverse-dev-data/orgs/*/episodes/*/processed/*",
        "ecs:RunTask on arn:aws:ecs:us-west-2:123456789012:task-definition/episode-pipeline-transcode:* if ecs:cluster ArnEquals ${aws_ecs_cluster.main.arn}",
        "ecs:TagResource on arn:aws:ecs:us-west-2:123456789012:task/episode-pipeline/* if ecs:CreateAction StringEquals RunTask",
        "ecs:DescribeTasks,ecs:StopTask on arn:aws:ecs:us-west-2:123456789012:task/episode-pipeline/*",
        "iam:PassRole on arn:aws:iam::123456789012:role/episode-pipeline-execution,arn:aws:iam::123456789012:role/episode-pipeline-transcode if iam:PassedToService StringEquals ecs-tasks.amazonaws.com",
        "rds-db:connect on arn:aws:rds-db:us-west-2:123456789012:dbuser:cluster-ABCDEFGHIJKLMNOP/app_user,arn:aws:rds-db:us-west-2:123456789012:dbuser:cluster-ABCDEFGHIJKLMNOP/dagster",
        "s3:GetObject,s3:PutObject on arn:aws:s3:::mock-bucket/compute-logs/*",
        "ecs:DescribeTaskDefinition on *",
        "logs:DescribeLogStreams,logs:GetLogEvents on ${aws_cloudwatch_log_group.ecs["transcode"].arn},${aws_cloudwatch_log_group.ecs["transcode"].arn}:*",
      ])
      transcode = toset([
        "s3:GetObject on arn:aws:s3:::toborverse-dev-data/orgs/*",
        "s3:ListBucket on arn:aws:s3:::toborverse-dev-data if s3:prefix StringLike orgs/*",
        "s3:AbortMultipartUpload,s3:DeleteObject,s3:PutObject on arn:aws:s3:::toborverse-dev-data/orgs/*/episodes/*/processed/*",
      ])
      dlq = toset([
        "sqs:ChangeMessageVisibility,sqs:DeleteMessage,sqs:GetQueueAttributes,sqs:ReceiveMessage on ${aws_sqs_queue.dlq.arn}",
        "sqs:SendMessage on ${aws_sqs_queue.uploads.arn}",
        "rds-db:connect on arn:aws:rds-db:us-west-2:123456789012:dbuser:cluster-ABCDEFGHIJKLMNOP/dagster",
      ])
    }
    error_message = "The roles' permissions changed: ${jsonencode({ for key in keys(local.task_roles) : key => [for statement in data.aws_iam_policy_document.policy[key].statement : [statement.actions, statement.resources, statement.condition]] })}"
  }

  # The run worker never touches a queue: the sensors receive, hold and delete (code server).
  assert {
    condition     = length([for statement in data.aws_iam_policy_document.policy["run"].statement : statement if anytrue([for action in statement.actions : startswith(action, "sqs:")])]) == 0
    error_message = "The run role has no SQS permission: nothing the run worker calls needs one."
  }

  # For people: start the dlq task on this cluster, pass only its roles, follow it, read its log.
  assert {
    condition = toset([
      for statement in data.aws_iam_policy_document.policy["dlq-operator"].statement : join(" if ", concat(
        ["${join(",", sort(statement.actions))} on ${join(",", sort(statement.resources))}"],
        [for condition in statement.condition : "${condition.variable} ${condition.test} ${join(",", sort(condition.values))}"],
      ))
      ]) == toset([
      "ecs:RunTask on arn:aws:ecs:us-west-2:123456789012:task-definition/episode-pipeline-dlq:* if ecs:cluster ArnEquals ${aws_ecs_cluster.main.arn}",
      "ecs:DescribeTasks on arn:aws:ecs:us-west-2:123456789012:task/episode-pipeline/*",
      "iam:PassRole on arn:aws:iam::123456789012:role/episode-pipeline-dlq,arn:aws:iam::123456789012:role/episode-pipeline-execution if iam:PassedToService StringEquals ecs-tasks.amazonaws.com",
      "logs:GetLogEvents on ${aws_cloudwatch_log_group.ecs["dlq"].arn}:*",
    ])
    error_message = "The dlq-operator policy changed: ${jsonencode(data.aws_iam_policy_document.policy["dlq-operator"].statement)}"
  }

  assert {
    condition = (aws_iam_policy.operator["dlq-operator"].name == "episode-pipeline-dlq-operator"
      && aws_iam_policy.operator["dlq-operator"].policy == data.aws_iam_policy_document.policy["dlq-operator"].json
    && output.resources.operator_policy_arns["dlq-operator"] == aws_iam_policy.operator["dlq-operator"].arn)
    error_message = "The operator policy is <prefix>-dlq-operator, in the outputs for attaching to a role or group."
  }

  # A rule for any future statement too: "*" only for actions without resource-level
  # permissions, and never a wildcard action.
  assert {
    condition = length(flatten([for key in concat(keys(local.task_roles), keys(local.operator_permissions)) : [
      for statement in data.aws_iam_policy_document.policy[key].statement : statement
      if anytrue([for action in statement.actions : action == "*" || endswith(action, ":*")])
      || (contains(statement.resources, "*") && length(setsubtract(statement.actions, ["ecr:GetAuthorizationToken", "ecs:DescribeTaskDefinition", "ec2:DescribeNetworkInterfaces"])) > 0)
    ]])) == 0
    error_message = "A task policy allows a wildcard action, or \"*\" for an action that can be scoped."
  }

  # The resource policies that let AWS services act: "actions on resources by service [if
  # conditions]". Each is limited to this account and, where it has a source, to that source.
  assert {
    condition = { for key in keys(local.service_grants) : key => toset([
      for statement in data.aws_iam_policy_document.policy[key].statement : join(" if ", concat(
        ["${join(",", sort(statement.actions))} on ${join(",", sort(coalesce(statement.resources, ["-"])))} by ${join(",", flatten(statement.principals[*].identifiers))}"],
        sort([for condition in statement.condition : "${condition.variable} ${condition.test} ${join(",", sort(condition.values))}"]),
      ))
      ]) } == {
      ecs_tasks_assume    = toset(["sts:AssumeRole on - by ecs-tasks.amazonaws.com if aws:SourceAccount StringEquals 123456789012"])
      alerts_topic        = toset(["sns:Publish on ${aws_sns_topic.alerts[0].arn} by cloudwatch.amazonaws.com if aws:SourceAccount StringEquals 123456789012"])
      uploads_queue       = toset(["sqs:SendMessage on ${aws_sqs_queue.uploads.arn} by events.amazonaws.com if aws:SourceAccount StringEquals 123456789012 if aws:SourceArn ArnLike ${aws_cloudwatch_event_rule.uploads[0].arn}"])
      access_log_delivery = toset(["s3:PutObject on arn:aws:s3:::episode-pipeline-access-logs-123456789012/* by logging.s3.amazonaws.com if aws:SourceAccount StringEquals 123456789012 if aws:SourceArn ArnLike arn:aws:s3:::episode-pipeline-dagster-123456789012"])
    }
    error_message = "The service grants changed: ${jsonencode({ for key in keys(local.service_grants) : key => data.aws_iam_policy_document.policy[key].statement })}"
  }
}

run "without_a_database_secret" {
  variables {
    db_password_secret_arn = null
    db_secret_kms_key_arn  = null
  }

  assert {
    condition     = length([for statement in data.aws_iam_policy_document.policy["execution"].statement : statement if contains(statement.actions, "secretsmanager:GetSecretValue")]) == 0
    error_message = "Without db_password_secret_arn no secret is readable."
  }

  assert {
    condition     = jsondecode(aws_ecs_task_definition.task["run"].container_definitions)[0].secrets == []
    error_message = "Without db_password_secret_arn no DB_PASSWORD is injected."
  }
}
