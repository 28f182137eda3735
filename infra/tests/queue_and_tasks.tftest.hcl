# What runs the pipeline: the upload queue with its dead-letter queue and alarm (the replaced
# worker's numbers: visibility 15 min, retention 4 days / 14 days, 3 receives before the
# dead-letter queue, an email when it is not empty), then the five ECS task definitions (sizes,
# image, logs, environment), the three services, the network rules, the logs and the registry.

mock_provider "aws" {
  source = "./tests/mocks"
}

variables {
  db_password_secret_arn = "arn:aws:secretsmanager:us-west-2:123456789012:secret:toborverse-db-AbCdEf"
}

run "queue_dead_letter_queue_and_alarm" {
  assert {
    condition     = aws_sqs_queue.uploads.name == "episode-pipeline-uploads" && aws_sqs_queue.dlq.name == "episode-pipeline-uploads-dlq"
    error_message = "Queue names are <prefix>-uploads and <prefix>-uploads-dlq."
  }

  assert {
    condition     = aws_sqs_queue.uploads.visibility_timeout_seconds == 900
    error_message = "The upload queue hides a received message 15 minutes (900 s), got ${aws_sqs_queue.uploads.visibility_timeout_seconds}."
  }

  assert {
    condition     = aws_sqs_queue.uploads.message_retention_seconds == 4 * 24 * 3600
    error_message = "The upload queue keeps messages 4 days, got ${aws_sqs_queue.uploads.message_retention_seconds} s."
  }

  assert {
    condition     = aws_sqs_queue.dlq.message_retention_seconds == 14 * 24 * 3600
    error_message = "The dead-letter queue keeps messages 14 days, got ${aws_sqs_queue.dlq.message_retention_seconds} s."
  }

  assert {
    condition     = aws_sqs_queue.uploads.receive_wait_time_seconds == 20
    error_message = "The upload queue long-polls 20 s."
  }

  assert {
    condition     = aws_sqs_queue.uploads.sqs_managed_sse_enabled && aws_sqs_queue.dlq.sqs_managed_sse_enabled
    error_message = "Both queues are encrypted with SSE-SQS (S3 and EventBridge need no KMS grant)."
  }

  assert {
    condition = jsondecode(aws_sqs_queue.uploads.redrive_policy) == {
      deadLetterTargetArn = aws_sqs_queue.dlq.arn
      maxReceiveCount     = 3
    }
    error_message = "After 3 receives a message moves to the dead-letter queue: ${aws_sqs_queue.uploads.redrive_policy}"
  }

  assert {
    condition = jsondecode(aws_sqs_queue_redrive_allow_policy.dlq.redrive_allow_policy) == {
      redrivePermission = "byQueue"
      sourceQueueArns   = [aws_sqs_queue.uploads.arn]
    }
    error_message = "Only the upload queue may move messages into the dead-letter queue."
  }

  assert {
    condition     = aws_sqs_queue_redrive_allow_policy.dlq.queue_url == aws_sqs_queue.dlq.id
    error_message = "The redrive allow policy belongs to the dead-letter queue."
  }

  assert {
    condition = (aws_cloudwatch_metric_alarm.dlq_not_empty.namespace == "AWS/SQS"
      && aws_cloudwatch_metric_alarm.dlq_not_empty.metric_name == "ApproximateNumberOfMessagesVisible"
      && aws_cloudwatch_metric_alarm.dlq_not_empty.dimensions == tomap({ QueueName = aws_sqs_queue.dlq.name })
    )
    error_message = "The alarm watches the visible messages of the dead-letter queue."
  }

  assert {
    condition = (aws_cloudwatch_metric_alarm.dlq_not_empty.comparison_operator == "GreaterThanThreshold"
      && aws_cloudwatch_metric_alarm.dlq_not_empty.threshold == 0
      && aws_cloudwatch_metric_alarm.dlq_not_empty.treat_missing_data == "notBreaching"
    )
    error_message = "The alarm fires as soon as one message is in the dead-letter queue."
  }

  assert {
    condition = (aws_cloudwatch_metric_alarm.dlq_not_empty.alarm_actions == toset([aws_sns_topic.alerts[0].arn])
    && output.resources.alerts_topic_arn == aws_sns_topic.alerts[0].arn && aws_sns_topic.alerts[0].name == "episode-pipeline-alerts")
    error_message = "Without alerts_topic_arn the stack creates <prefix>-alerts, and the alarm notifies it."
  }

  assert {
    condition = {
      for subscription in aws_sns_topic_subscription.alert_email : subscription.endpoint => [subscription.protocol, subscription.topic_arn]
      } == {
      "oncall@example.com" = ["email", aws_sns_topic.alerts[0].arn]
      "lead@example.com"   = ["email", aws_sns_topic.alerts[0].arn]
    }
    error_message = "Every address in alert_emails gets an email subscription to the alerts topic."
  }

  assert {
    condition     = aws_sns_topic.alerts[0].kms_master_key_id == aws_kms_key.pipeline.arn
    error_message = "The alerts topic is encrypted with the stack's key (CloudWatch may use it; iam.tftest.hcl checks who may publish)."
  }
}

# The application's own alerts topic: the alarm notifies it, and the stack creates no topic.
run "the_alarm_notifies_an_existing_alerts_topic" {
  variables {
    alerts_topic_arn = "arn:aws:sns:us-west-2:123456789012:toborverse-alerts"
    alert_emails     = []
  }

  assert {
    condition = (aws_cloudwatch_metric_alarm.dlq_not_empty.alarm_actions == toset(["arn:aws:sns:us-west-2:123456789012:toborverse-alerts"])
      && aws_cloudwatch_metric_alarm.dlq_not_empty.ok_actions == toset(["arn:aws:sns:us-west-2:123456789012:toborverse-alerts"])
    && output.resources.alerts_topic_arn == "arn:aws:sns:us-west-2:123456789012:toborverse-alerts")
    error_message = "With alerts_topic_arn the alarm (and its OK) goes to that topic."
  }

  assert {
    condition     = length(aws_sns_topic.alerts) == 0 && length(aws_sns_topic_policy.alerts) == 0 && length(aws_sns_topic_subscription.alert_email) == 0
    error_message = "Given a topic, the stack creates none, and changes nothing on it (no policy, no subscriptions)."
  }

  assert {
    condition     = !contains(keys(data.aws_iam_policy_document.policy), "alerts_topic")
    error_message = "No topic policy is rendered for a topic the stack does not own."
  }
}

run "emails_are_subscribed_only_to_a_created_topic" {
  command = plan

  variables {
    alerts_topic_arn = "arn:aws:sns:us-west-2:123456789012:toborverse-alerts"
  }

  expect_failures = [var.alert_emails]
}

run "the_alerts_topic_must_be_an_sns_arn" {
  command = plan

  variables {
    alerts_topic_arn = "toborverse-alerts"
    alert_emails     = []
  }

  expect_failures = [var.alerts_topic_arn]
}

run "tasks_services_logs_and_registry" {
  # Task definitions: family, size, scratch disk.
  assert {
    condition = jsonencode({ for key, task in aws_ecs_task_definition.task : key => [
      task.family, task.cpu, task.memory, task.ephemeral_storage[*].size_in_gib
      ] }) == jsonencode({
      "code-server" = ["episode-pipeline-code-server", "512", "1024", []]
      daemon        = ["episode-pipeline-daemon", "512", "1024", []]
      dlq           = ["episode-pipeline-dlq", "256", "512", []]
      run           = ["episode-pipeline-run", "2048", "4096", [50]]
      transcode     = ["episode-pipeline-transcode", "2048", "4096", [50]]
      webserver     = ["episode-pipeline-webserver", "512", "1024", []]
    })
    error_message = "Task sizes: runs (which transcode) and transcodes 2 vCPU / 4 GB, services 0.5 vCPU / 1 GB, the dlq task 0.25 vCPU / 0.5 GB; runs and transcodes 50 GiB of disk."
  }

  assert {
    condition = alltrue([for task in aws_ecs_task_definition.task : (
      task.requires_compatibilities == toset(["FARGATE"]) && task.network_mode == "awsvpc"
      && task.runtime_platform[0].operating_system_family == "LINUX" && task.runtime_platform[0].cpu_architecture == "X86_64"
      && task.execution_role_arn == aws_iam_role.task["execution"].arn
    )])
    error_message = "Every task is a Fargate x86-64 Linux task in awsvpc mode, started by the execution role."
  }

  # Containers: one per task, named after it, the run image (the webserver: the webserver image)
  # and the same environment, logs to its group.
  assert {
    condition = alltrue([for key, task in aws_ecs_task_definition.task : (
      length(jsondecode(task.container_definitions)) == 1
      && jsondecode(task.container_definitions)[0].name == key
      && jsondecode(task.container_definitions)[0].image == (key == "webserver"
        ? "123456789012.dkr.ecr.us-west-2.amazonaws.com/episode-pipeline-webserver:latest"
      : "123456789012.dkr.ecr.us-west-2.amazonaws.com/episode-pipeline:latest")
      && jsondecode(task.container_definitions)[0].essential
      && jsondecode(task.container_definitions)[0].user == "10001:10001"
      && jsondecode(task.container_definitions)[0].linuxParameters.initProcessEnabled
      && jsondecode(task.container_definitions)[0].environment == local.environment
    )])
    error_message = "Each task runs one container named after it: the :latest run image (the webserver its own) as user 10001, init process on, the common environment."
  }

  assert {
    condition = alltrue([for key, task in aws_ecs_task_definition.task : jsondecode(task.container_definitions)[0].logConfiguration == {
      logDriver = "awslogs"
      options = {
        awslogs-group         = aws_cloudwatch_log_group.ecs[key].name
        awslogs-region        = "us-west-2"
        awslogs-stream-prefix = key
      }
    }])
    error_message = "Every task logs with awslogs to its own group and a stream prefix (PipesECSClient reads the transcode task's messages there)."
  }

  assert {
    condition = jsonencode({ for key, task in aws_ecs_task_definition.task : key => [
      try(jsondecode(task.container_definitions)[0].command, null),
      try(jsondecode(task.container_definitions)[0].portMappings[*].containerPort, []),
      ] }) == jsonencode({
      "code-server" = [["dagster", "code-server", "start", "-h", "0.0.0.0", "-p", "4000", "-m", "episode_pipeline.definitions", "--location-name", "episode_pipeline"], [4000]]
      daemon        = [["dagster-daemon", "run", "-w", "/opt/dagster/dagster_home/workspace.yaml"], []]
      dlq           = [["episode-pipeline", "dlq", "list"], []]
      run           = [null, []]
      transcode     = [["python", "-m", "episode_pipeline.transcode"], []]
      webserver     = [["dagster-webserver", "-h", "0.0.0.0", "-p", "3000", "-w", "/opt/dagster/dagster_home/workspace.yaml"], [3000]]
    })
    error_message = "Commands: the code server serves the code location, the transcode task runs episode_pipeline.transcode, a run gets its command from EcsRunLauncher, the dlq task lists the dead-letter queue unless run-task overrides the command."
  }

  assert {
    condition     = jsondecode(aws_ecs_task_definition.task["code-server"].container_definitions)[0].healthCheck.command == ["CMD", "dagster", "api", "grpc-health-check", "-p", "4000"]
    error_message = "The code server is healthy when its gRPC server answers."
  }

  # The environment: what the pipeline code, dagster.yaml, workspace.yaml and the transcode
  # launcher read (episode_pipeline_tests/test_deploy_infra.py checks that no name is missing).
  assert {
    condition = output.environment == {
      AWS_REGION                  = "us-west-2"
      AWS_DEFAULT_REGION          = "us-west-2"
      DATA_BUCKET                 = "toborverse-dev-data"
      SQS_QUEUE_URL               = aws_sqs_queue.uploads.url
      SQS_DLQ_URL                 = aws_sqs_queue.dlq.url
      DB_HOST                     = "toborverse-dev.cluster-abc.us-west-2.rds.amazonaws.com"
      DB_PORT                     = "5432"
      DB_NAME                     = "toborverse"
      DB_USER                     = "app_user"
      DB_SSL                      = "true"
      DB_IAM_AUTH                 = "true"
      DAGSTER_PG_HOST             = "toborverse-dev.cluster-abc.us-west-2.rds.amazonaws.com"
      DAGSTER_PG_PORT             = "5432"
      DAGSTER_PG_DB               = "dagster"
      DAGSTER_PG_USER             = "dagster"
      DAGSTER_RUN_TASK_DEFINITION = aws_ecs_task_definition.task["run"].family
      DAGSTER_RUN_CONTAINER_NAME  = "run"
      DAGSTER_COMPUTE_LOG_BUCKET  = "episode-pipeline-dagster-123456789012"
      DAGSTER_CODE_SERVER_HOST    = "code-server.episode-pipeline.internal"
      DAGSTER_CODE_SERVER_PORT    = "4000"
      ECS_CLUSTER                 = aws_ecs_cluster.main.name
      ECS_SUBNETS                 = "subnet-aaa,subnet-bbb"
      ECS_SECURITY_GROUPS         = aws_security_group.tasks.id
      TRANSCODE_TASK_DEFINITION   = aws_ecs_task_definition.task["transcode"].family
      TRANSCODE_CONTAINER_NAME    = "transcode"
      TRANSCODE_TASK_ABOVE_BYTES  = ""
      METRICS_DEPLOYMENT          = "episode-pipeline"
    }
    error_message = "The tasks' environment: ${jsonencode(output.environment)}"
  }

  assert {
    condition = alltrue([for task in aws_ecs_task_definition.task : jsondecode(task.container_definitions)[0].secrets == [
      { name = "DB_PASSWORD", valueFrom = "arn:aws:secretsmanager:us-west-2:123456789012:secret:toborverse-db-AbCdEf:password::" }
    ]])
    error_message = "DB_PASSWORD is a secret from Secrets Manager (key password), never plain environment."
  }

  # Services.
  assert {
    condition = jsonencode({ for key, service in aws_ecs_service.service : key => [
      service.name, service.desired_count, service.launch_type, service.deployment_minimum_healthy_percent, service.deployment_maximum_percent,
      service.service_registries[*].registry_arn,
      ] }) == jsonencode({
      "code-server" = ["episode-pipeline-code-server", 1, "FARGATE", null, null, [aws_service_discovery_service.code_server.arn]]
      daemon        = ["episode-pipeline-daemon", 1, "FARGATE", 0, 100, []]
      webserver     = ["episode-pipeline-webserver", 1, "FARGATE", null, null, []]
    })
    error_message = "Three services, <prefix>-<process>; the daemon never runs twice (AWS defaults elsewhere); the code server is in service discovery."
  }

  # No documented command needs a shell in a running task: the dlq task is started on its own.
  assert {
    condition     = alltrue([for service in aws_ecs_service.service : !coalesce(service.enable_execute_command, false)]) && !contains(keys(aws_ecs_service.service), "dlq")
    error_message = "ECS Exec stays off on every service, and the dlq task is a one-off task, not a service."
  }

  assert {
    condition = output.dlq_run_task_command == join(" ", [
      "aws ecs run-task --region us-west-2 --cluster episode-pipeline --task-definition episode-pipeline-dlq --launch-type FARGATE",
      "--network-configuration 'awsvpcConfiguration={subnets=[subnet-aaa,subnet-bbb],securityGroups=[${aws_security_group.tasks.id}],assignPublicIp=DISABLED}'",
    ])
    error_message = "The output gives the run-task command of the dlq task in the tasks' subnets and security group: ${output.dlq_run_task_command}"
  }

  assert {
    condition = alltrue([for key, service in aws_ecs_service.service : (
      service.cluster == aws_ecs_cluster.main.id && service.task_definition == aws_ecs_task_definition.task[key].arn
      && service.network_configuration[0].subnets == toset(["subnet-aaa", "subnet-bbb"])
      && service.network_configuration[0].security_groups == toset([aws_security_group.tasks.id])
      && !service.network_configuration[0].assign_public_ip
      && service.deployment_circuit_breaker[0].enable && service.deployment_circuit_breaker[0].rollback
    )])
    error_message = "Services run in the private subnets without public IPs, and roll back a failed deployment."
  }

  assert {
    condition     = aws_ecs_cluster.main.name == "episode-pipeline" && one(aws_ecs_cluster.main.setting).value == "enabled"
    error_message = "The cluster is named <prefix> (the deploy workflow's ECS_CLUSTER) with Container Insights."
  }

  # Network: what the tasks may reach, and who may reach them.
  assert {
    condition = jsonencode({ for key, rule in aws_vpc_security_group_egress_rule.tasks : key => [rule.security_group_id, rule.from_port, rule.to_port, rule.cidr_ipv4, rule.referenced_security_group_id] }) == jsonencode({
      code_server = [aws_security_group.tasks.id, 4000, 4000, null, aws_security_group.tasks.id]
      https       = [aws_security_group.tasks.id, 443, 443, "0.0.0.0/0", null]
      postgres    = [aws_security_group.tasks.id, 5432, 5432, null, "sg-0bbbbbbbbbbbbbbbb"]
    })
    error_message = "Egress: HTTPS to AWS APIs, PostgreSQL to the database's group, gRPC to the code server."
  }

  assert {
    condition = jsonencode({ for key, rule in aws_vpc_security_group_ingress_rule.tasks : key => [rule.security_group_id, rule.from_port, rule.to_port, rule.cidr_ipv4, rule.referenced_security_group_id] }) == jsonencode({
      code_server             = [aws_security_group.tasks.id, 4000, 4000, null, aws_security_group.tasks.id]
      database                = ["sg-0bbbbbbbbbbbbbbbb", 5432, 5432, null, aws_security_group.tasks.id]
      "webserver 10.8.0.0/16" = [aws_security_group.tasks.id, 3000, 3000, "10.8.0.0/16", null]
    })
    error_message = "Ingress: gRPC among the tasks, PostgreSQL on the database from the tasks, the UI from webserver_ingress_cidrs."
  }

  assert {
    condition     = alltrue([for rule in concat(values(aws_vpc_security_group_egress_rule.tasks), values(aws_vpc_security_group_ingress_rule.tasks)) : rule.ip_protocol == "tcp" && length(rule.description) > 10])
    error_message = "Every rule is TCP and described."
  }

  # Logs: 7 days, encrypted with the stack's key.
  assert {
    condition = { for key, group in aws_cloudwatch_log_group.ecs : key => [group.name, group.retention_in_days, group.kms_key_id] } == {
      "code-server" = ["/ecs/episode-pipeline-code-server", 7, aws_kms_key.pipeline.arn]
      daemon        = ["/ecs/episode-pipeline-daemon", 7, aws_kms_key.pipeline.arn]
      dlq           = ["/ecs/episode-pipeline-dlq", 7, aws_kms_key.pipeline.arn]
      run           = ["/ecs/episode-pipeline-run", 7, aws_kms_key.pipeline.arn]
      transcode     = ["/ecs/episode-pipeline-transcode", 7, aws_kms_key.pipeline.arn]
      webserver     = ["/ecs/episode-pipeline-webserver", 7, aws_kms_key.pipeline.arn]
    }
    error_message = "One log group per process, /ecs/<prefix>-<process>, kept 7 days."
  }

  assert {
    condition     = aws_kms_key.pipeline.enable_key_rotation && aws_kms_alias.pipeline.name == "alias/episode-pipeline"
    error_message = "The stack's key rotates and is aliased alias/<prefix>."
  }

  assert {
    condition = jsonencode([for statement in data.aws_iam_policy_document.kms.statement : [statement.sid, statement.principals, statement.condition]]) == jsonencode([
      ["AccountAdministration", [{ identifiers = ["arn:aws:iam::123456789012:root"], type = "AWS" }], []],
      ["CloudWatchAlarmsPublishToEncryptedTopic", [{ identifiers = ["cloudwatch.amazonaws.com"], type = "Service" }], [{ test = "StringEquals", values = ["123456789012"], variable = "aws:SourceAccount" }]],
      ["CloudWatchLogsEncryptLogGroups", [{ identifiers = ["logs.us-west-2.amazonaws.com"], type = "Service" }], [{ test = "ArnLike", values = ["arn:aws:logs:us-west-2:123456789012:log-group:/ecs/episode-pipeline-*"], variable = "kms:EncryptionContext:aws:logs:arn" }]],
    ])
    error_message = "The key serves the account, CloudWatch alarms of this account, and this stack's log groups only."
  }

  # Each registry keeps its three most recent images.
  assert {
    condition = alltrue([for policy in aws_ecr_lifecycle_policy.image : jsondecode(policy.policy) == {
      rules = [{
        rulePriority = 1
        description  = "Keep the three most recent images"
        selection    = { tagStatus = "any", countType = "imageCountMoreThan", countNumber = 3 }
        action       = { type = "expire" }
      }]
    }])
    error_message = "ECR expires all but the 3 most recent images of each repository."
  }

  assert {
    condition = ({ for key, repository in aws_ecr_repository.image : key => repository.name } == { run = "episode-pipeline", webserver = "episode-pipeline-webserver" }
      && alltrue([for key, repository in aws_ecr_repository.image : (
        aws_ecr_lifecycle_policy.image[key].repository == repository.name
        && repository.image_scanning_configuration[0].scan_on_push && repository.encryption_configuration[0].encryption_type == "KMS"
        && repository.image_tag_mutability == "MUTABLE"
    )]))
    error_message = "The repositories <prefix> (run image) and <prefix>-webserver scan on push, are KMS-encrypted, and let each deploy move :latest."
  }

  assert {
    condition     = output.ecr_repository_url == aws_ecr_repository.image["run"].repository_url && output.webserver_ecr_repository_url == aws_ecr_repository.image["webserver"].repository_url && output.resources.ecs_services["daemon"] == "episode-pipeline-daemon"
    error_message = "The outputs name the two repositories and the services."
  }
}
