# ECS on Fargate: three long-running services (webserver, daemon, code server) and two task
# families launched on demand (a run worker per Dagster run, a transcode task per episode video).
# All five run the same image with different commands.

locals {
  image = "${aws_ecr_repository.app.repository_url}:${var.image_tag}"

  code_server_port = 4000
  webserver_port   = 3000

  code_server_host = "code-server.${aws_service_discovery_private_dns_namespace.main.name}"

  log_groups = {
    webserver   = "/ecs/${local.prefix}-webserver"
    daemon      = "/ecs/${local.prefix}-daemon"
    code-server = "/ecs/${local.prefix}-code-server"
    run         = "/ecs/${local.prefix}-run"
    transcode   = "/ecs/${local.prefix}-transcode"
  }

  # The environment every container gets: the variables the pipeline code reads (settings.py),
  # the ones dagster.yaml and workspace.yaml read, and the ones the transcode launcher reads.
  environment = [
    for name, value in {
      AWS_REGION                  = var.region
      AWS_DEFAULT_REGION          = var.region
      DATA_BUCKET                 = aws_s3_bucket.data.bucket
      SQS_QUEUE_URL               = aws_sqs_queue.uploads.url
      SQS_DLQ_URL                 = aws_sqs_queue.dlq.url
      DB_HOST                     = var.db_host
      DB_PORT                     = tostring(var.db_port)
      DB_NAME                     = var.db_name
      DB_USER                     = var.db_user
      DB_SSL                      = "true"
      DB_IAM_AUTH                 = tostring(var.db_iam_auth)
      DAGSTER_PG_HOST             = var.db_host
      DAGSTER_PG_PORT             = tostring(var.db_port)
      DAGSTER_PG_DB               = var.dagster_db_name
      DAGSTER_PG_USER             = var.dagster_db_user
      DAGSTER_RUN_TASK_DEFINITION = local.run_family
      DAGSTER_RUN_CONTAINER_NAME  = "run"
      DAGSTER_COMPUTE_LOG_BUCKET  = aws_s3_bucket.dagster.bucket
      DAGSTER_CODE_SERVER_HOST    = local.code_server_host
      DAGSTER_CODE_SERVER_PORT    = tostring(local.code_server_port)
      ECS_CLUSTER                 = aws_ecs_cluster.main.name
      ECS_SUBNETS                 = join(",", var.private_subnet_ids)
      ECS_SECURITY_GROUPS         = aws_security_group.tasks.id
      TRANSCODE_TASK_DEFINITION   = local.transcode_family
      TRANSCODE_CONTAINER_NAME    = "transcode"
    } : { name = name, value = value }
  ]

  secrets = var.db_password_secret_arn == null ? [] : [
    { name = "DB_PASSWORD", valueFrom = "${var.db_password_secret_arn}:password::" },
  ]

  # Container definition shared by all five task definitions; each adds name, command, ports.
  container_base = {
    image       = local.image
    essential   = true
    environment = local.environment
    secrets     = local.secrets
    user        = "10001:10001"
    linuxParameters = {
      initProcessEnabled = true # forwards SIGTERM to Dagster and reaps FFmpeg children
    }
  }
}

resource "aws_ecs_cluster" "main" {
  name = local.prefix

  setting {
    name  = "containerInsights"
    value = "enabled"
  }
}

resource "aws_ecs_cluster_capacity_providers" "main" {
  cluster_name       = aws_ecs_cluster.main.name
  capacity_providers = ["FARGATE", "FARGATE_SPOT"]

  default_capacity_provider_strategy {
    capacity_provider = "FARGATE"
    weight            = 1
  }
}

resource "aws_cloudwatch_log_group" "ecs" {
  #checkov:skip=CKV_AWS_338:The seed keeps task logs 7 days; run history and step logs live in Dagster's storage and the compute-log bucket.
  for_each = local.log_groups

  name              = each.value
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.pipeline.arn
}

# --- Network -------------------------------------------------------------------------------------

resource "aws_security_group" "tasks" {
  name        = "${local.prefix}-tasks"
  description = "Episode pipeline ECS tasks (webserver, daemon, code server, runs, transcode)"
  vpc_id      = var.vpc_id
}

resource "aws_vpc_security_group_egress_rule" "tasks_https" {
  security_group_id = aws_security_group.tasks.id
  description       = "AWS APIs (S3, SQS, ECS, ECR, Logs, STS, RDS auth) over HTTPS"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = "0.0.0.0/0"
}

resource "aws_vpc_security_group_egress_rule" "tasks_postgres" {
  security_group_id            = aws_security_group.tasks.id
  description                  = "Aurora PostgreSQL"
  ip_protocol                  = "tcp"
  from_port                    = var.db_port
  to_port                      = var.db_port
  referenced_security_group_id = var.db_security_group_id
}

resource "aws_vpc_security_group_egress_rule" "tasks_code_server" {
  security_group_id            = aws_security_group.tasks.id
  description                  = "Dagster code server gRPC"
  ip_protocol                  = "tcp"
  from_port                    = local.code_server_port
  to_port                      = local.code_server_port
  referenced_security_group_id = aws_security_group.tasks.id
}

resource "aws_vpc_security_group_ingress_rule" "tasks_code_server" {
  security_group_id            = aws_security_group.tasks.id
  description                  = "Dagster code server gRPC from the webserver, daemon and run workers"
  ip_protocol                  = "tcp"
  from_port                    = local.code_server_port
  to_port                      = local.code_server_port
  referenced_security_group_id = aws_security_group.tasks.id
}

resource "aws_vpc_security_group_ingress_rule" "webserver" {
  for_each = toset(var.webserver_ingress_cidrs)

  security_group_id = aws_security_group.tasks.id
  description       = "Dagster UI from ${each.value}"
  ip_protocol       = "tcp"
  from_port         = local.webserver_port
  to_port           = local.webserver_port
  cidr_ipv4         = each.value
}

resource "aws_vpc_security_group_ingress_rule" "database" {
  security_group_id            = var.db_security_group_id
  description                  = "PostgreSQL from the episode pipeline tasks"
  ip_protocol                  = "tcp"
  from_port                    = var.db_port
  to_port                      = var.db_port
  referenced_security_group_id = aws_security_group.tasks.id
}

# The webserver and daemon find the code server by name.
resource "aws_service_discovery_private_dns_namespace" "main" {
  name        = "${local.prefix}.internal"
  description = "Service discovery for ${local.prefix}"
  vpc         = var.vpc_id
}

resource "aws_service_discovery_service" "code_server" {
  name = "code-server"

  dns_config {
    namespace_id   = aws_service_discovery_private_dns_namespace.main.id
    routing_policy = "MULTIVALUE"

    dns_records {
      ttl  = 10
      type = "A"
    }
  }

  health_check_custom_config {
    failure_threshold = 1
  }
}

# --- Task definitions ----------------------------------------------------------------------------

resource "aws_ecs_task_definition" "code_server" {
  #checkov:skip=CKV_AWS_336:Dagster writes instance state under DAGSTER_HOME and scratch files under /tmp; the container runs as a non-root user instead.
  family                   = "${local.prefix}-code-server"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.code_server_cpu
  memory                   = var.code_server_memory
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.code_server.arn

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = "X86_64"
  }

  container_definitions = jsonencode([
    merge(local.container_base, {
      name = "code-server"
      # The image's default CMD serves the code location; spelled out so the task is explicit.
      command = [
        "dagster", "code-server", "start", "-h", "0.0.0.0", "-p", tostring(local.code_server_port),
        "-m", "episode_pipeline.definitions", "--location-name", "episode_pipeline",
      ]
      portMappings = [{ containerPort = local.code_server_port, protocol = "tcp" }]
      healthCheck = {
        command     = ["CMD", "dagster", "api", "grpc-health-check", "-p", tostring(local.code_server_port)]
        interval    = 30
        timeout     = 10
        retries     = 3
        startPeriod = 120
      }
      logConfiguration = {
        logDriver = "awslogs"
        options = {
          awslogs-group         = aws_cloudwatch_log_group.ecs["code-server"].name
          awslogs-region        = var.region
          awslogs-stream-prefix = "code-server"
        }
      }
    })
  ])
}

resource "aws_ecs_task_definition" "webserver" {
  #checkov:skip=CKV_AWS_336:Dagster writes instance state under DAGSTER_HOME and scratch files under /tmp; the container runs as a non-root user instead.
  family                   = "${local.prefix}-webserver"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.webserver_cpu
  memory                   = var.webserver_memory
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.webserver.arn

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = "X86_64"
  }

  container_definitions = jsonencode([
    merge(local.container_base, {
      name = "webserver"
      command = [
        "dagster-webserver", "-h", "0.0.0.0", "-p", tostring(local.webserver_port),
        "-w", "/opt/dagster/dagster_home/workspace.yaml",
      ]
      portMappings = [{ containerPort = local.webserver_port, protocol = "tcp" }]
      logConfiguration = {
        logDriver = "awslogs"
        options = {
          awslogs-group         = aws_cloudwatch_log_group.ecs["webserver"].name
          awslogs-region        = var.region
          awslogs-stream-prefix = "webserver"
        }
      }
    })
  ])
}

resource "aws_ecs_task_definition" "daemon" {
  #checkov:skip=CKV_AWS_336:Dagster writes instance state under DAGSTER_HOME and scratch files under /tmp; the container runs as a non-root user instead.
  family                   = "${local.prefix}-daemon"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.daemon_cpu
  memory                   = var.daemon_memory
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.daemon.arn

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = "X86_64"
  }

  container_definitions = jsonencode([
    merge(local.container_base, {
      name    = "daemon"
      command = ["dagster-daemon", "run", "-w", "/opt/dagster/dagster_home/workspace.yaml"]
      logConfiguration = {
        logDriver = "awslogs"
        options = {
          awslogs-group         = aws_cloudwatch_log_group.ecs["daemon"].name
          awslogs-region        = var.region
          awslogs-stream-prefix = "daemon"
        }
      }
    })
  ])
}

# Run workers: EcsRunLauncher starts this family (DAGSTER_RUN_TASK_DEFINITION) with the run's
# command; `ecs/cpu` and `ecs/memory` run tags override the size per run.
resource "aws_ecs_task_definition" "run" {
  #checkov:skip=CKV_AWS_336:Runs stream archive members and HLS segments through /tmp; the container runs as a non-root user instead.
  family                   = local.run_family
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.run_cpu
  memory                   = var.run_memory
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.run.arn

  ephemeral_storage {
    size_in_gib = var.task_ephemeral_storage_gib
  }

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = "X86_64"
  }

  container_definitions = jsonencode([
    merge(local.container_base, {
      name = "run"
      logConfiguration = {
        logDriver = "awslogs"
        options = {
          awslogs-group         = aws_cloudwatch_log_group.ecs["run"].name
          awslogs-region        = var.region
          awslogs-stream-prefix = "run"
        }
      }
    })
  ])
}

# Transcode: started by a run through PipesECSClient, which reads the task's Pipes messages from
# CloudWatch Logs, hence the awslogs driver with a stream prefix.
resource "aws_ecs_task_definition" "transcode" {
  #checkov:skip=CKV_AWS_336:FFmpeg writes HLS segments to /tmp before upload; the container runs as a non-root user instead.
  family                   = local.transcode_family
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.transcode_cpu
  memory                   = var.transcode_memory
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.transcode.arn

  ephemeral_storage {
    size_in_gib = var.task_ephemeral_storage_gib
  }

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = "X86_64"
  }

  container_definitions = jsonencode([
    merge(local.container_base, {
      name    = "transcode"
      command = ["python", "-m", "episode_pipeline.transcode"]
      logConfiguration = {
        logDriver = "awslogs"
        options = {
          awslogs-group         = aws_cloudwatch_log_group.ecs["transcode"].name
          awslogs-region        = var.region
          awslogs-stream-prefix = "transcode"
        }
      }
    })
  ])
}

# --- Services ------------------------------------------------------------------------------------

resource "aws_ecs_service" "code_server" {
  name            = "${local.prefix}-code-server"
  cluster         = aws_ecs_cluster.main.id
  task_definition = aws_ecs_task_definition.code_server.arn
  desired_count   = 1
  launch_type     = "FARGATE"
  propagate_tags  = "SERVICE"

  network_configuration {
    subnets          = var.private_subnet_ids
    security_groups  = [aws_security_group.tasks.id]
    assign_public_ip = false
  }

  service_registries {
    registry_arn = aws_service_discovery_service.code_server.arn
  }

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }
}

resource "aws_ecs_service" "webserver" {
  name            = "${local.prefix}-webserver"
  cluster         = aws_ecs_cluster.main.id
  task_definition = aws_ecs_task_definition.webserver.arn
  desired_count   = 1
  launch_type     = "FARGATE"
  propagate_tags  = "SERVICE"

  network_configuration {
    subnets          = var.private_subnet_ids
    security_groups  = [aws_security_group.tasks.id]
    assign_public_ip = false
  }

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  depends_on = [aws_ecs_service.code_server]
}

# Exactly one daemon may run: stop the old task before starting the new one on deploys.
resource "aws_ecs_service" "daemon" {
  name                               = "${local.prefix}-daemon"
  cluster                            = aws_ecs_cluster.main.id
  task_definition                    = aws_ecs_task_definition.daemon.arn
  desired_count                      = 1
  launch_type                        = "FARGATE"
  propagate_tags                     = "SERVICE"
  deployment_minimum_healthy_percent = 0
  deployment_maximum_percent         = 100

  network_configuration {
    subnets          = var.private_subnet_ids
    security_groups  = [aws_security_group.tasks.id]
    assign_public_ip = false
  }

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  depends_on = [aws_ecs_service.code_server]
}
