variable "region" {
  description = "AWS region for every resource (the replaced worker's deployment uses us-west-2). An adopted data bucket must be in this region."
  type        = string
  default     = "us-west-2"
}

variable "environment" {
  description = "Environment name (dev, staging, prod); tagged on every resource."
  type        = string
  default     = "dev"
}

variable "name_prefix" {
  description = "Prefix of every resource name, e.g. toborverse-dev-episode-pipeline. At most 32 characters; lowercase letters, digits and hyphens."
  type        = string
  default     = "episode-pipeline"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,31}$", var.name_prefix))
    error_message = "name_prefix must be 2-32 characters of lowercase letters, digits and hyphens, starting with a letter."
  }
}

variable "tags" {
  description = "Extra tags applied to every resource (merged into the provider's default_tags)."
  type        = map(string)
  default     = {}
}

# --- Network -----------------------------------------------------------------------------------

variable "vpc_id" {
  description = "VPC that holds the Aurora cluster and the private subnets the tasks run in."
  type        = string
}

variable "private_subnet_ids" {
  description = "Private subnets (with a NAT gateway or VPC endpoints for S3, SQS, ECR, Logs, STS, RDS) for every ECS task. Tasks get no public IP."
  type        = list(string)

  validation {
    condition     = length(var.private_subnet_ids) > 0
    error_message = "private_subnet_ids needs at least one subnet."
  }
}

variable "webserver_ingress_cidrs" {
  description = "CIDR blocks (VPN, bastion) allowed to reach the Dagster UI on port 3000 of the webserver task. Empty: nobody outside the tasks' security group."
  type        = list(string)
  default     = []
}

# --- Data bucket, alerts -----------------------------------------------------------------------

variable "create_data_bucket" {
  description = "false (the default): adopt the application's existing data bucket `data_bucket_name` without changing its settings, and route its uploads to the queue through EventBridge. true: create a new data bucket owned by this stack, with an S3 event notification to the queue."
  type        = bool
  default     = false
}

variable "data_bucket_name" {
  description = "Name of the data bucket robots upload to (orgs/<org_id>/episodes/<episode_id>/...). Required when adopting the existing bucket (create_data_bucket = false); with create_data_bucket it defaults to <name_prefix>-data-<account id>."
  type        = string
  default     = null

  validation {
    condition     = var.create_data_bucket || var.data_bucket_name != null
    error_message = "data_bucket_name is required unless create_data_bucket = true: name the application's existing bucket."
  }

  validation {
    condition     = var.data_bucket_name == null || can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.data_bucket_name))
    error_message = "data_bucket_name must be a valid S3 bucket name (3-63 lowercase letters, digits, dots and hyphens)."
  }
}

variable "upload_route" {
  description = "How S3 announces an upload to the queue (docs/deploy-aws.md, Upload routes): \"s3\" (an S3 event notification straight to the queue; a created bucket only), \"sns\" (S3 notifies an SNS topic, the queue subscribes to it with raw message delivery off), or \"eventbridge\" (an EventBridge rule delivers S3's Object Created events to the queue as they are). Null (the default): \"s3\" for a created bucket, \"eventbridge\" for an adopted one."
  type        = string
  default     = null

  validation {
    condition     = var.upload_route == null || contains(["s3", "sns", "eventbridge"], coalesce(var.upload_route, "s3"))
    error_message = "upload_route must be \"s3\", \"sns\", \"eventbridge\" or null."
  }

  validation {
    condition     = var.upload_route != "s3" || var.create_data_bucket
    error_message = "upload_route = \"s3\" needs create_data_bucket = true: the stack never rewrites an adopted bucket's notification configuration. Use \"eventbridge\", or \"sns\" with the topic the bucket already notifies (upload_topic_arn)."
  }

  validation {
    condition     = var.upload_route != "sns" || var.create_data_bucket || var.upload_topic_arn != null
    error_message = "upload_route = \"sns\" on an adopted bucket needs upload_topic_arn: the existing topic the bucket notifies of its uploads."
  }

  validation {
    condition     = var.upload_topic_arn == null || var.upload_route == "sns"
    error_message = "upload_topic_arn is used only with upload_route = \"sns\"."
  }
}

variable "upload_topic_arn" {
  description = "With upload_route = \"sns\": an existing SNS topic, in this account and region, that the data bucket notifies of objects created under orgs/; the queue subscribes to it. Null: the stack creates the topic <prefix>-uploads and the created bucket's notification to it."
  type        = string
  default     = null

}

variable "alerts_topic_arn" {
  description = "ARN of an existing SNS topic (the application's alerts topic) that the dead-letter queue alarm notifies. It must let cloudwatch.amazonaws.com publish, and CloudWatch use its KMS key if it has one. Null (the default): the stack creates <prefix>-alerts and subscribes alert_emails to it."
  type        = string
  default     = null

  validation {
    condition     = var.alerts_topic_arn == null || can(regex("^arn:[a-z-]+:sns:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]{1,256}$", var.alerts_topic_arn))
    error_message = "alerts_topic_arn must be an SNS topic ARN (arn:aws:sns:<region>:<account>:<name>)."
  }
}

variable "alert_emails" {
  description = "Email addresses subscribed to the alerts topic the stack creates (dead-letter queue not empty). Each must confirm the subscription email. Must be empty with alerts_topic_arn: subscribe people to that topic where it is managed."
  type        = list(string)
  default     = []

  validation {
    condition     = var.alerts_topic_arn == null || length(var.alert_emails) == 0
    error_message = "alert_emails subscribe to the topic this stack creates; with alerts_topic_arn, subscribe them on that topic instead."
  }
}

# --- Image -------------------------------------------------------------------------------------

variable "image_tag" {
  description = "Tag of the image in the ECR repository that every task runs. `latest` (the default) follows each push of the deploy workflow; pin a git sha to freeze a deployment."
  type        = string
  default     = "latest"
}

# --- Database (existing Aurora PostgreSQL cluster) ---------------------------------------------

variable "db_host" {
  description = "Writer endpoint of the Aurora PostgreSQL cluster (DB_HOST and DAGSTER_PG_HOST)."
  type        = string
}

variable "db_port" {
  description = "PostgreSQL port (DB_PORT and DAGSTER_PG_PORT)."
  type        = number
  default     = 5432
}

variable "db_name" {
  description = "Database holding the episodes, frames, episode_metadata and entity_versions tables (DB_NAME)."
  type        = string
}

variable "db_user" {
  description = "Database user of the pipeline code (DB_USER). With db_iam_auth it must have the rds_iam role."
  type        = string
}

variable "db_iam_auth" {
  description = "Connect the pipeline code with an RDS IAM token instead of the password (DB_IAM_AUTH). Required when db_user has rds_iam."
  type        = bool
  default     = true
}

variable "db_cluster_resource_id" {
  description = "Aurora cluster resource id (cluster-XXXXXXXX), used in the rds-db:connect permission for IAM authentication."
  type        = string
}

variable "db_password_secret_arn" {
  description = "ARN of the Secrets Manager secret of the Aurora user (JSON with a `password` key). Injected as DB_PASSWORD; unused when db_iam_auth is true. Null: no password is injected."
  type        = string
  default     = null
}

variable "db_secret_kms_key_arn" {
  description = "KMS key encrypting db_password_secret_arn, when it is a customer managed key (the execution role gets kms:Decrypt on it). Null for the AWS managed key."
  type        = string
  default     = null
}

variable "db_security_group_id" {
  description = "Security group of the Aurora cluster. The tasks' egress to PostgreSQL is limited to it, and an ingress rule on it admits the tasks."
  type        = string
}

variable "dagster_db_name" {
  description = "Database of Dagster's own run, event-log and schedule storage on the same cluster (DAGSTER_PG_DB). Create it once before the first deploy."
  type        = string
  default     = "dagster"
}

variable "dagster_db_user" {
  description = "User of Dagster's storage (DAGSTER_PG_USER); always connects with an RDS IAM token, so it must have the rds_iam role."
  type        = string
  default     = "dagster"
}

# --- Task sizes (Fargate CPU units / MiB) ------------------------------------------------------

variable "webserver_cpu" {
  description = "CPU units of the webserver task."
  type        = number
  default     = 512
}

variable "webserver_memory" {
  description = "Memory (MiB) of the webserver task."
  type        = number
  default     = 1024
}

variable "daemon_cpu" {
  description = "CPU units of the daemon task."
  type        = number
  default     = 512
}

variable "daemon_memory" {
  description = "Memory (MiB) of the daemon task."
  type        = number
  default     = 1024
}

variable "code_server_cpu" {
  description = "CPU units of the code server task (evaluates the sensors)."
  type        = number
  default     = 512
}

variable "code_server_memory" {
  description = "Memory (MiB) of the code server task."
  type        = number
  default     = 1024
}

variable "run_cpu" {
  description = "CPU units of a run worker task (one episode's run, transcode included) when its run has no size tags; the uploads sensor sizes each run with the `ecs/cpu` run tag."
  type        = number
  default     = 2048
}

variable "run_memory" {
  description = "Memory (MiB) of a run worker task without size tags; the uploads sensor sets the `ecs/memory` run tag."
  type        = number
  default     = 4096
}

variable "transcode_task_above_bytes" {
  description = "Archives larger than this (bytes) transcode in a transcode task of their own (a second cold start); null: every episode transcodes in its run's task (docs/deploy-aws.md#cold-starts)."
  type        = number
  default     = null

  validation {
    condition     = var.transcode_task_above_bytes == null ? true : var.transcode_task_above_bytes >= 1
    error_message = "transcode_task_above_bytes must be null or at least 1."
  }
}

variable "transcode_cpu" {
  description = "CPU units of the transcode task (FFmpeg, started by a run through PipesECSClient for archives over transcode_task_above_bytes)."
  type        = number
  default     = 2048
}

variable "transcode_memory" {
  description = "Memory (MiB) of the transcode task."
  type        = number
  default     = 4096
}

variable "task_ephemeral_storage_gib" {
  description = "Ephemeral storage (GiB, 21-200) of the run and transcode tasks, for archive members and HLS segments in flight."
  type        = number
  default     = 50

  validation {
    condition     = var.task_ephemeral_storage_gib >= 21 && var.task_ephemeral_storage_gib <= 200
    error_message = "task_ephemeral_storage_gib must be between 21 and 200."
  }
}

variable "log_retention_days" {
  description = "Retention of the ECS log groups, in days (the replaced worker kept its logs 7 days)."
  type        = number
  default     = 7
}
