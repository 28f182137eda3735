# ECS on Fargate: three long-running services (webserver, daemon, code server), two task families
# launched on demand (a run worker per Dagster run, which transcodes the episode itself: one cold
# start; a transcode task only for archives over var.transcode_task_above_bytes) and one an
# operator starts by hand (dlq: `episode-pipeline dlq list|redrive`). All but the webserver run the
# run image (no UI: what every episode's cold start pulls), the webserver the webserver image
# (infra/ecr.tf, docs/deploy-aws.md#image-size), each with its own command.

locals {
  images = { for name, repository in aws_ecr_repository.image : name => "${repository.repository_url}:${var.image_tag}" }

  code_server_port = 4000
  webserver_port   = 3000

  code_server_host = "code-server.${aws_service_discovery_private_dns_namespace.main.name}"

  log_groups = {
    webserver   = "/ecs/${local.prefix}-webserver"
    daemon      = "/ecs/${local.prefix}-daemon"
    code-server = "/ecs/${local.prefix}-code-server"
    run         = "/ecs/${local.prefix}-run"
    transcode   = "/ecs/${local.prefix}-transcode"
    dlq         = "/ecs/${local.prefix}-dlq"
  }

  # The environment every container gets: the variables the pipeline code reads (config/settings.py),
  # the ones dagster.yaml and workspace.yaml read, and the ones the transcode launcher reads.
  environment = [
    for name, value in {
      AWS_REGION                  = var.region
      AWS_DEFAULT_REGION          = var.region
      DATA_BUCKET                 = local.data_bucket_id
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
      DAGSTER_COMPUTE_LOG_BUCKET  = module.bucket["dagster"].name
      DAGSTER_CODE_SERVER_HOST    = local.code_server_host
      DAGSTER_CODE_SERVER_PORT    = tostring(local.code_server_port)
      ECS_CLUSTER                 = aws_ecs_cluster.main.name
      ECS_SUBNETS                 = join(",", var.private_subnet_ids)
      ECS_SECURITY_GROUPS         = aws_security_group.tasks.id
      TRANSCODE_TASK_DEFINITION   = local.transcode_family
      TRANSCODE_CONTAINER_NAME    = "transcode"
      TRANSCODE_TASK_ABOVE_BYTES  = var.transcode_task_above_bytes == null ? "" : tostring(var.transcode_task_above_bytes)
      # The Deployment dimension of every EMF metric line the daemon, code server and runs print
      # (infra/alarms.tf reads the metrics by it).
      METRICS_DEPLOYMENT = local.prefix
    } : { name = name, value = value }
  ]

  secrets = var.db_password_secret_arn == null ? [] : [
    { name = "DB_PASSWORD", valueFrom = "${var.db_password_secret_arn}:password::" },
  ]

  # Container definition shared by all six task definitions; each adds name, command, ports
  # (and the webserver its image).
  container_base = {
    image       = local.images.run
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
  #checkov:skip=CKV_AWS_338:The replaced worker kept its task logs 7 days; run history and step logs live in Dagster's storage and the compute-log bucket.
  for_each = local.log_groups

  name              = each.value
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.pipeline.arn
  # CloudWatch extracts the tasks' EMF metric lines from these groups (infra/alarms.tf): the
  # Standard class has every feature; Infrequent Access only a subset.
  log_group_class = "STANDARD"
}

# --- Network -------------------------------------------------------------------------------------

resource "aws_security_group" "tasks" {
  name        = "${local.prefix}-tasks"
  description = "Episode pipeline ECS tasks (webserver, daemon, code server, runs, transcode)"
  vpc_id      = var.vpc_id
}

locals {
  # What the tasks may reach (egress from their security group) and who may reach what (ingress,
  # on the tasks' group or on the database's): a port and either a CIDR or a security group.
  task_egress = {
    https       = { port = 443, cidr = "0.0.0.0/0", group = null, description = "AWS APIs (S3, SQS, ECS, ECR, Logs, STS, RDS auth) over HTTPS" }
    postgres    = { port = var.db_port, cidr = null, group = var.db_security_group_id, description = "Aurora PostgreSQL" }
    code_server = { port = local.code_server_port, cidr = null, group = aws_security_group.tasks.id, description = "Dagster code server gRPC" }
  }
  task_ingress = merge(
    {
      code_server = { on = aws_security_group.tasks.id, port = local.code_server_port, cidr = null, description = "Dagster code server gRPC from the webserver, daemon and run workers" }
      database    = { on = var.db_security_group_id, port = var.db_port, cidr = null, description = "PostgreSQL from the episode pipeline tasks" }
    },
    { for cidr in var.webserver_ingress_cidrs : "webserver ${cidr}" => { on = aws_security_group.tasks.id, port = local.webserver_port, cidr = cidr, description = "Dagster UI from ${cidr}" } },
  )
}

resource "aws_vpc_security_group_egress_rule" "tasks" {
  for_each = local.task_egress

  security_group_id            = aws_security_group.tasks.id
  description                  = each.value.description
  ip_protocol                  = "tcp"
  from_port                    = each.value.port
  to_port                      = each.value.port
  cidr_ipv4                    = each.value.cidr
  referenced_security_group_id = each.value.group
}

# From a CIDR, or else from the tasks' own security group.
resource "aws_vpc_security_group_ingress_rule" "tasks" {
  for_each = local.task_ingress

  security_group_id            = each.value.on
  description                  = each.value.description
  ip_protocol                  = "tcp"
  from_port                    = each.value.port
  to_port                      = each.value.port
  cidr_ipv4                    = each.value.cidr
  referenced_security_group_id = each.value.cidr == null ? aws_security_group.tasks.id : null
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

locals {
  # The six task definitions, family <prefix>-<key>, each running one container named <key> as
  # the task role of the same key: its size, its scratch disk (null: Fargate's default 20 GiB) and
  # what its container adds to container_base (the awslogs configuration is added for all).
  tasks = {
    "code-server" = {
      cpu     = var.code_server_cpu
      memory  = var.code_server_memory
      storage = null
      container = {
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
      }
    }
    webserver = {
      cpu     = var.webserver_cpu
      memory  = var.webserver_memory
      storage = null
      container = {
        image = local.images.webserver
        command = [
          "dagster-webserver", "-h", "0.0.0.0", "-p", tostring(local.webserver_port),
          "-w", "/opt/dagster/dagster_home/workspace.yaml",
        ]
        portMappings = [{ containerPort = local.webserver_port, protocol = "tcp" }]
      }
    }
    daemon = {
      cpu       = var.daemon_cpu
      memory    = var.daemon_memory
      storage   = null
      container = { command = ["dagster-daemon", "run", "-w", "/opt/dagster/dagster_home/workspace.yaml"] }
    }
    # Run workers: EcsRunLauncher starts this family (DAGSTER_RUN_TASK_DEFINITION) with the run's
    # command. A run transcodes in its own task, so the default size can run FFmpeg; the uploads
    # sensor sizes each run from its upload with the `ecs/cpu` and `ecs/memory` run tags.
    run = {
      cpu       = var.run_cpu
      memory    = var.run_memory
      storage   = var.task_ephemeral_storage_gib
      container = {}
    }
    # Transcode: started through PipesECSClient by a run tagged `episode_pipeline/transcoder=ecs`
    # (archives over var.transcode_task_above_bytes), which reads the task's Pipes messages from
    # CloudWatch Logs, hence the awslogs driver with a stream prefix.
    transcode = {
      cpu       = var.transcode_cpu
      memory    = var.transcode_memory
      storage   = var.task_ephemeral_storage_gib
      container = { command = ["python", "-m", "episode_pipeline.transcode"] }
    }
    # The dead-letter queue, by hand: `aws ecs run-task` lists it (the default command), or
    # redrives with a command override (docs/deploy-aws.md). No service, no ECS Exec.
    dlq = {
      cpu       = 256
      memory    = 512
      storage   = null
      container = { command = ["episode-pipeline", "dlq", "list"] }
    }
  }
}

resource "aws_ecs_task_definition" "task" {
  #checkov:skip=CKV_AWS_336:Dagster writes instance state under DAGSTER_HOME, runs stream archive members through /tmp and FFmpeg writes HLS segments there; every container runs as a non-root user instead.
  for_each = local.tasks

  family                   = "${local.prefix}-${each.key}"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = each.value.cpu
  memory                   = each.value.memory
  execution_role_arn       = aws_iam_role.task["execution"].arn
  task_role_arn            = aws_iam_role.task[each.key].arn

  dynamic "ephemeral_storage" {
    for_each = each.value.storage[*]
    content {
      size_in_gib = ephemeral_storage.value
    }
  }

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = "X86_64"
  }

  container_definitions = jsonencode([
    merge(local.container_base, each.value.container, {
      name = each.key
      logConfiguration = {
        logDriver = "awslogs"
        options = {
          awslogs-group         = aws_cloudwatch_log_group.ecs[each.key].name
          awslogs-region        = var.region
          awslogs-stream-prefix = each.key
        }
      }
    })
  ])
}

# --- Services ------------------------------------------------------------------------------------

locals {
  # The long-running services, <prefix>-<key>, each from the task definition of the same key. The
  # webserver and the daemon find the code server through its service discovery name.
  services = {
    "code-server" = { registries = [aws_service_discovery_service.code_server.arn], min_healthy_percent = null, max_percent = null }
    webserver     = { registries = [], min_healthy_percent = null, max_percent = null }
    # Exactly one daemon may run: stop the old task before starting the new one on deploys.
    daemon = { registries = [], min_healthy_percent = 0, max_percent = 100 }
  }
}

resource "aws_ecs_service" "service" {
  for_each = local.services

  name                               = "${local.prefix}-${each.key}"
  cluster                            = aws_ecs_cluster.main.id
  task_definition                    = aws_ecs_task_definition.task[each.key].arn
  desired_count                      = 1
  launch_type                        = "FARGATE"
  propagate_tags                     = "SERVICE"
  deployment_minimum_healthy_percent = each.value.min_healthy_percent
  deployment_maximum_percent         = each.value.max_percent

  network_configuration {
    subnets          = var.private_subnet_ids
    security_groups  = [aws_security_group.tasks.id]
    assign_public_ip = false
  }

  dynamic "service_registries" {
    for_each = each.value.registries
    content {
      registry_arn = service_registries.value
    }
  }

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }
}
