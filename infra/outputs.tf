output "ecr_repository_url" {
  description = "ECR repository the deploy workflow pushes :latest and :<git sha> to."
  value       = aws_ecr_repository.app.repository_url
}

# The names and addresses the pipeline needs are exactly what its tasks get: DATA_BUCKET,
# SQS_QUEUE_URL, SQS_DLQ_URL, ECS_CLUSTER, DAGSTER_COMPUTE_LOG_BUCKET, DAGSTER_CODE_SERVER_HOST,
# DAGSTER_RUN_TASK_DEFINITION, TRANSCODE_TASK_DEFINITION, ECS_SECURITY_GROUPS, ...
output "environment" {
  description = "The environment variables every task gets, by name (README.md, Environment variables). DB_PASSWORD is a secret and is not in it."
  value       = { for variable in local.environment : variable.name => variable.value }
}

output "resources" {
  description = "What runs it, by kind: the alerts topic, the ECS services, log groups and task roles by process, and how uploads reach the queue."
  value = {
    alerts_topic_arn = aws_sns_topic.alerts.arn
    ecs_services     = { for key, service in aws_ecs_service.service : key => service.name }
    log_groups       = { for key, group in aws_cloudwatch_log_group.ecs : key => group.name }
    task_roles       = { for key, role in aws_iam_role.task : key => role.arn }
    upload_route     = var.create_data_bucket ? "s3-notification" : "eventbridge-rule:${one(aws_cloudwatch_event_rule.uploads[*].name)}"
  }
}
