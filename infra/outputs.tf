output "ecr_repository_url" {
  description = "ECR repository of the run image (the Dockerfile's default target), which the deploy workflow pushes :latest and :<git sha> to; the webserver image goes to the same name with -webserver."
  value       = aws_ecr_repository.image["run"].repository_url
}

output "webserver_ecr_repository_url" {
  description = "ECR repository of the webserver image (the Dockerfile's webserver target)."
  value       = aws_ecr_repository.image["webserver"].repository_url
}

# The names and addresses the pipeline needs are exactly what its tasks get: DATA_BUCKET,
# SQS_QUEUE_URL, SQS_DLQ_URL, ECS_CLUSTER, DAGSTER_COMPUTE_LOG_BUCKET, DAGSTER_CODE_SERVER_HOST,
# DAGSTER_RUN_TASK_DEFINITION, TRANSCODE_TASK_DEFINITION, ECS_SECURITY_GROUPS, ...
output "environment" {
  description = "The environment variables every task gets, by name (README.md, Environment variables). DB_PASSWORD is a secret and is not in it."
  value       = { for variable in local.environment : variable.name => variable.value }
}

output "resources" {
  description = "What runs it, by kind: the alerts topic, the ECS services, log groups and task roles by process, how uploads reach the queue, and the operator policy."
  value = {
    alerts_topic_arn     = local.alerts_topic_arn
    ecs_services         = { for key, service in aws_ecs_service.service : key => service.name }
    log_groups           = { for key, group in aws_cloudwatch_log_group.ecs : key => group.name }
    task_roles           = { for key, role in aws_iam_role.task : key => role.arn }
    upload_route         = local.upload_route
    upload_topic_arn     = local.upload_topic_arn
    upload_rule          = one(aws_cloudwatch_event_rule.uploads[*].name)
    operator_policy_arns = { for key, policy in aws_iam_policy.operator : key => policy.arn }
  }
}

# docs/deploy-aws.md, "The dead-letter queue": list it with this command as it is; redrive with
# --overrides naming the command.
output "dlq_run_task_command" {
  description = "The aws CLI command that starts the one-off dlq task (episode-pipeline dlq list); its output is in the dlq log group."
  value = join(" ", [
    "aws ecs run-task --region ${var.region} --cluster ${aws_ecs_cluster.main.name}",
    "--task-definition ${aws_ecs_task_definition.task["dlq"].family} --launch-type FARGATE",
    "--network-configuration 'awsvpcConfiguration={subnets=[${join(",", var.private_subnet_ids)}],securityGroups=[${aws_security_group.tasks.id}],assignPublicIp=DISABLED}'",
  ])
}
