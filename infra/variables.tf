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
  description = "ARN of an existing SNS topic (the application's alerts topic) that every alarm notifies (infra/alarms.tf, the dead-letter queue's in queue.tf). It must let cloudwatch.amazonaws.com publish, and CloudWatch use its KMS key if it has one. Null (the default): the stack creates <prefix>-alerts and subscribes alert_emails to it."
  type        = string
  default     = null

  validation {
    condition     = var.alerts_topic_arn == null || can(regex("^arn:[a-z-]+:sns:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]{1,256}$", var.alerts_topic_arn))
    error_message = "alerts_topic_arn must be an SNS topic ARN (arn:aws:sns:<region>:<account>:<name>)."
  }
}

variable "alert_emails" {
  description = "Email addresses subscribed to the alerts topic the stack creates (every alarm, docs/operations.md#alarms). Each must confirm the subscription email. Must be empty with alerts_topic_arn: subscribe people to that topic where it is managed."
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

# --- Alarms (infra/alarms.tf; what each means and what to do: docs/operations.md#alarms) -------

variable "alarm_upload_age_seconds" {
  description = "Alarm when the upload queue's oldest message is older than this (s). A received message stays on the queue until its run succeeds, and a failing upload takes 3 receives of 15 min to reach the dead-letter queue: keep it above 2700 s plus a run's time. 300-345599 (the queue keeps a message 4 days)."
  type        = number
  default     = 3600

  validation {
    condition     = var.alarm_upload_age_seconds >= 300 && var.alarm_upload_age_seconds < 345600
    error_message = "alarm_upload_age_seconds must be between 300 and 345599: the queue deletes a message after 4 days (345600 s), so an older threshold could never be reached."
  }
}

variable "alarm_no_processing_hours" {
  description = "Alarm when this many hours in a row each saw uploads sent to the queue and no episode processed. Whole hours, 1-24 (CloudWatch evaluates at most a day)."
  type        = number
  default     = 2

  validation {
    condition     = var.alarm_no_processing_hours >= 1 && var.alarm_no_processing_hours <= 24 && floor(var.alarm_no_processing_hours) == var.alarm_no_processing_hours
    error_message = "alarm_no_processing_hours must be a whole number of hours from 1 to 24."
  }
}

variable "alarm_failure_rate_percent" {
  description = "Alarm when more than this percentage of the episodes that ended (processed or failed) in alarm_failure_rate_window_minutes failed. Above 0, at most 100."
  type        = number
  default     = 20

  validation {
    condition     = var.alarm_failure_rate_percent > 0 && var.alarm_failure_rate_percent <= 100
    error_message = "alarm_failure_rate_percent must be above 0 and at most 100."
  }
}

variable "alarm_failure_rate_window_minutes" {
  description = "The window of the failure-rate alarm, in whole minutes (5-1440)."
  type        = number
  default     = 60

  validation {
    condition     = var.alarm_failure_rate_window_minutes >= 5 && var.alarm_failure_rate_window_minutes <= 1440 && floor(var.alarm_failure_rate_window_minutes) == var.alarm_failure_rate_window_minutes
    error_message = "alarm_failure_rate_window_minutes must be a whole number of minutes from 5 to 1440."
  }
}

variable "alarm_failure_rate_min_episodes" {
  description = "The failure-rate alarm judges a window only when at least this many episodes ended in it, so that one failure among two episodes is not a 50% rate. A whole number, at least 1."
  type        = number
  default     = 5

  validation {
    condition     = var.alarm_failure_rate_min_episodes >= 1 && floor(var.alarm_failure_rate_min_episodes) == var.alarm_failure_rate_min_episodes
    error_message = "alarm_failure_rate_min_episodes must be a whole number, at least 1."
  }
}

variable "alarm_sensor_failed_ticks" {
  description = "Alarm when a sensor's ticks all failed in this many of its periods in a row (a period is the sensor's interval rounded up to whole minutes: one tick for the slower sensors, several for the 10-15 s ones). A whole number, 1-20."
  type        = number
  default     = 3

  validation {
    condition     = var.alarm_sensor_failed_ticks >= 1 && var.alarm_sensor_failed_ticks <= 20 && floor(var.alarm_sensor_failed_ticks) == var.alarm_sensor_failed_ticks
    error_message = "alarm_sensor_failed_ticks must be a whole number from 1 to 20."
  }
}

variable "alarm_uploads_sensor_silent_minutes" {
  description = "Alarm when the uploads sensor (episode_uploads, every 10 s) has not ticked for this many minutes: the daemon or the code server is down or wedged. A deploy stops the daemon before starting the new one (a cold start of a minute or two). A whole number, 2-1440."
  type        = number
  default     = 10

  validation {
    condition     = var.alarm_uploads_sensor_silent_minutes >= 2 && var.alarm_uploads_sensor_silent_minutes <= 1440 && floor(var.alarm_uploads_sensor_silent_minutes) == var.alarm_uploads_sensor_silent_minutes
    error_message = "alarm_uploads_sensor_silent_minutes must be a whole number of minutes from 2 to 1440 (a deploy restarts the daemon within a minute or two)."
  }
}

variable "alarm_lost_uploads_threshold" {
  description = "Alarm when one reconciliation tick finds more lost uploads than this (archives no notification announced). 0, the default: any."
  type        = number
  default     = 0

  validation {
    condition     = var.alarm_lost_uploads_threshold >= 0 && floor(var.alarm_lost_uploads_threshold) == var.alarm_lost_uploads_threshold
    error_message = "alarm_lost_uploads_threshold must be a whole number, 0 or more."
  }
}
