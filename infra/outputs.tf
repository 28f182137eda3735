output "data_bucket_name" {
  description = "Bucket robots upload to (DATA_BUCKET); archives go under orgs/<org_id>/episodes/<episode_id>/."
  value       = aws_s3_bucket.data.bucket
}

output "dagster_bucket_name" {
  description = "Bucket of Dagster's compute logs (DAGSTER_COMPUTE_LOG_BUCKET)."
  value       = aws_s3_bucket.dagster.bucket
}

output "uploads_queue_url" {
  description = "URL of the upload queue (SQS_QUEUE_URL)."
  value       = aws_sqs_queue.uploads.url
}

output "dead_letter_queue_url" {
  description = "URL of the dead-letter queue (SQS_DLQ_URL); inspect and redrive from here."
  value       = aws_sqs_queue.dlq.url
}

output "alerts_topic_arn" {
  description = "SNS topic the dead-letter alarm notifies; subscribe more endpoints here."
  value       = aws_sns_topic.alerts.arn
}

output "ecr_repository_url" {
  description = "ECR repository the deploy workflow pushes :latest and :<git sha> to."
  value       = aws_ecr_repository.app.repository_url
}

output "ecs_cluster_name" {
  description = "ECS cluster of the services and of the run and transcode tasks."
  value       = aws_ecs_cluster.main.name
}

output "ecs_service_names" {
  description = "The three long-running services, to force a new deployment after an image push."
  value = {
    webserver   = aws_ecs_service.webserver.name
    daemon      = aws_ecs_service.daemon.name
    code_server = aws_ecs_service.code_server.name
  }
}

output "run_task_family" {
  description = "Task definition family EcsRunLauncher starts for each run (DAGSTER_RUN_TASK_DEFINITION)."
  value       = aws_ecs_task_definition.run.family
}

output "transcode_task_family" {
  description = "Task definition family the transcode step starts (TRANSCODE_TASK_DEFINITION)."
  value       = aws_ecs_task_definition.transcode.family
}

output "code_server_host" {
  description = "DNS name of the code server inside the VPC (DAGSTER_CODE_SERVER_HOST)."
  value       = local.code_server_host
}

output "tasks_security_group_id" {
  description = "Security group of every ECS task (already admitted on the database security group)."
  value       = aws_security_group.tasks.id
}

output "log_group_names" {
  description = "CloudWatch log groups of the services and tasks (7-day retention by default)."
  value       = { for name, group in aws_cloudwatch_log_group.ecs : name => group.name }
}

output "task_role_arns" {
  description = "IAM task roles, one per process."
  value = {
    webserver   = aws_iam_role.webserver.arn
    daemon      = aws_iam_role.daemon.arn
    code_server = aws_iam_role.code_server.arn
    run         = aws_iam_role.run.arn
    transcode   = aws_iam_role.transcode.arn
  }
}
