# The alarms (infra/alarms.tf) and the dashboard: each alarm's metric, threshold, missing-data
# rule and action; the thresholds follow their variables and refuse values that could never
# fire; the tasks give their metrics the Deployment dimension the alarms read.

mock_provider "aws" {
  source = "./tests/mocks"

  # Alarms of their own ARN, so that the dashboard's list of alarms can be told apart (the
  # per-sensor ones share the mock's).
  override_resource {
    target = aws_cloudwatch_metric_alarm.upload_age
    values = { arn = "arn:aws:cloudwatch:us-west-2:123456789012:alarm:upload_age" }
  }

  override_resource {
    target = aws_cloudwatch_metric_alarm.no_processing
    values = { arn = "arn:aws:cloudwatch:us-west-2:123456789012:alarm:no_processing" }
  }

  override_resource {
    target = aws_cloudwatch_metric_alarm.failure_rate
    values = { arn = "arn:aws:cloudwatch:us-west-2:123456789012:alarm:failure_rate" }
  }

  override_resource {
    target = aws_cloudwatch_metric_alarm.uploads_sensor_silent
    values = { arn = "arn:aws:cloudwatch:us-west-2:123456789012:alarm:uploads_sensor_silent" }
  }

  override_resource {
    target = aws_cloudwatch_metric_alarm.lost_uploads
    values = { arn = "arn:aws:cloudwatch:us-west-2:123456789012:alarm:lost_uploads" }
  }

  override_resource {
    target = aws_cloudwatch_metric_alarm.dlq_not_empty
    values = { arn = "arn:aws:cloudwatch:us-west-2:123456789012:alarm:dlq_not_empty" }
  }

  override_resource {
    target = aws_cloudwatch_metric_alarm.campaign_stalled
    values = { arn = "arn:aws:cloudwatch:us-west-2:123456789012:alarm:campaign_stalled" }
  }
}

variables {
  db_password_secret_arn = "arn:aws:secretsmanager:us-west-2:123456789012:secret:toborverse-db-AbCdEf"
}

run "each_alarm_watches_its_metric_and_the_dashboard_shows_them" {
  # The queue's oldest message, from AWS/SQS.
  assert {
    condition = (aws_cloudwatch_metric_alarm.upload_age.alarm_name == "episode-pipeline-upload-queue-oldest-message-age"
      && aws_cloudwatch_metric_alarm.upload_age.namespace == "AWS/SQS"
      && aws_cloudwatch_metric_alarm.upload_age.metric_name == "ApproximateAgeOfOldestMessage"
      && aws_cloudwatch_metric_alarm.upload_age.dimensions == tomap({ QueueName = "episode-pipeline-uploads" })
      && aws_cloudwatch_metric_alarm.upload_age.statistic == "Maximum"
      && aws_cloudwatch_metric_alarm.upload_age.period == 300
      && aws_cloudwatch_metric_alarm.upload_age.evaluation_periods == 1
      && aws_cloudwatch_metric_alarm.upload_age.comparison_operator == "GreaterThanThreshold"
      && aws_cloudwatch_metric_alarm.upload_age.threshold == 3600
      && aws_cloudwatch_metric_alarm.upload_age.treat_missing_data == "notBreaching"
    )
    error_message = "The upload queue's oldest message older than 1 h (the maximum over 5 min) alarms; no data is no backlog."
  }

  # No episode processed in 2 hours in a row, each with uploads sent.
  assert {
    condition = jsonencode({ for query in aws_cloudwatch_metric_alarm.no_processing.metric_query : query.id => [
      query.expression, query.return_data, [for m in query.metric : [m.namespace, m.metric_name, m.dimensions, m.stat, m.period]]
      ] }) == jsonencode({
      processed = [null, false, [["EpisodePipeline", "EpisodesProcessed", { Deployment = "episode-pipeline" }, "Sum", 3600]]]
      stalled   = ["uploads > 0 AND FILL(processed, 0) == 0", true, []]
      uploads   = [null, false, [["AWS/SQS", "NumberOfMessagesSent", { QueueName = "episode-pipeline-uploads" }, "Sum", 3600]]]
    })
    error_message = "An hour breaches when uploads were sent to the queue and EpisodesProcessed has none (FILL: no point is 0)."
  }

  assert {
    condition = (aws_cloudwatch_metric_alarm.no_processing.alarm_name == "episode-pipeline-no-episode-processed"
      && aws_cloudwatch_metric_alarm.no_processing.comparison_operator == "GreaterThanOrEqualToThreshold"
      && aws_cloudwatch_metric_alarm.no_processing.threshold == 1
      && aws_cloudwatch_metric_alarm.no_processing.evaluation_periods == 2
      && aws_cloudwatch_metric_alarm.no_processing.datapoints_to_alarm == 2
      && aws_cloudwatch_metric_alarm.no_processing.treat_missing_data == "notBreaching"
      && aws_cloudwatch_metric_alarm.no_processing.metric_name == null
    )
    error_message = "2 such hours in a row alarm; an hour with neither uploads nor episodes is fine."
  }

  # The failure rate over an hour, from 5 episodes, guarded against dividing by zero.
  assert {
    condition = jsonencode({ for query in aws_cloudwatch_metric_alarm.failure_rate.metric_query : query.id => [
      query.expression, query.return_data, [for m in query.metric : [m.namespace, m.metric_name, m.dimensions, m.stat, m.period]]
      ] }) == jsonencode({
      ended        = ["processed + failed", false, []]
      failed       = [null, false, [["EpisodePipeline", "EpisodesFailed", { Deployment = "episode-pipeline" }, "Sum", 3600]]]
      failure_rate = ["IF(ended >= 5, 100 * failed / ended, 0)", true, []]
      processed    = [null, false, [["EpisodePipeline", "EpisodesProcessed", { Deployment = "episode-pipeline" }, "Sum", 3600]]]
    })
    error_message = "The rate is failed / (processed + failed) in % over 60 min, judged from 5 episodes on (never a division by 0)."
  }

  assert {
    condition = (aws_cloudwatch_metric_alarm.failure_rate.alarm_name == "episode-pipeline-failure-rate"
      && aws_cloudwatch_metric_alarm.failure_rate.comparison_operator == "GreaterThanThreshold"
      && aws_cloudwatch_metric_alarm.failure_rate.threshold == 20
      && aws_cloudwatch_metric_alarm.failure_rate.evaluation_periods == 1
      && aws_cloudwatch_metric_alarm.failure_rate.treat_missing_data == "notBreaching"
    )
    error_message = "More than 20% failed in the window alarms."
  }

  # Every sensor failing every tick, per sensor, in periods of its own interval.
  assert {
    condition = { for name, alarm in aws_cloudwatch_metric_alarm.sensor_failing : name => [
      alarm.alarm_name, one([for query in alarm.metric_query : query.metric[0].period if query.id == "ticks"]),
      ] } == {
      episode_uploads               = ["episode-pipeline-sensor-episode_uploads-failing", 60]
      episode_upload_done           = ["episode-pipeline-sensor-episode_upload_done-failing", 60]
      episode_upload_heartbeat      = ["episode-pipeline-sensor-episode_upload_heartbeat-failing", 240]
      episode_failed_on_run_failure = ["episode-pipeline-sensor-episode_failed_on_run_failure-failing", 60]
      orphaned_runs                 = ["episode-pipeline-sensor-orphaned_runs-failing", 60]
      waiting_uploads               = ["episode-pipeline-sensor-waiting_uploads-failing", 300]
      stale_processing              = ["episode-pipeline-sensor-stale_processing-failing", 120]
      dagster_retention             = ["episode-pipeline-sensor-dagster_retention-failing", 600]
      campaign_driver               = ["episode-pipeline-sensor-campaign_driver-failing", 60]
    }
    error_message = "One alarm per sensor, its period the sensor's interval rounded up to a minute."
  }

  assert {
    condition = alltrue([for name, alarm in aws_cloudwatch_metric_alarm.sensor_failing : (
      jsonencode({ for query in alarm.metric_query : query.id => [
        query.expression, query.return_data, [for m in query.metric : [m.namespace, m.metric_name, m.dimensions, m.stat, m.period]]
        ] }) == jsonencode({
        failed_share = ["failures / ticks", true, []]
        failures     = [null, false, [["EpisodePipeline", "SensorTickFailures", { Deployment = "episode-pipeline", Sensor = name }, "Sum", local.sensor_periods[name]]]]
        ticks        = [null, false, [["EpisodePipeline", "SensorTicks", { Deployment = "episode-pipeline", Sensor = name }, "Sum", local.sensor_periods[name]]]]
      })
      && alarm.comparison_operator == "GreaterThanOrEqualToThreshold" && alarm.threshold == 1
      && alarm.evaluation_periods == 3 && alarm.datapoints_to_alarm == 3
      && alarm.treat_missing_data == "missing"
    )])
    error_message = "A sensor's alarm fires when all its ticks failed (failures / ticks >= 1) in 3 periods in a row; a period without ticks is skipped."
  }

  # The uploads sensor not ticking at all.
  assert {
    condition = (aws_cloudwatch_metric_alarm.uploads_sensor_silent.alarm_name == "episode-pipeline-uploads-sensor-not-ticking"
      && aws_cloudwatch_metric_alarm.uploads_sensor_silent.namespace == "EpisodePipeline"
      && aws_cloudwatch_metric_alarm.uploads_sensor_silent.metric_name == "SensorTicks"
      && aws_cloudwatch_metric_alarm.uploads_sensor_silent.dimensions == tomap({ Deployment = "episode-pipeline", Sensor = "episode_uploads" })
      && aws_cloudwatch_metric_alarm.uploads_sensor_silent.statistic == "Sum"
      && aws_cloudwatch_metric_alarm.uploads_sensor_silent.period == 60
      && aws_cloudwatch_metric_alarm.uploads_sensor_silent.evaluation_periods == 10
      && aws_cloudwatch_metric_alarm.uploads_sensor_silent.datapoints_to_alarm == 10
      && aws_cloudwatch_metric_alarm.uploads_sensor_silent.comparison_operator == "LessThanThreshold"
      && aws_cloudwatch_metric_alarm.uploads_sensor_silent.threshold == 1
      && aws_cloudwatch_metric_alarm.uploads_sensor_silent.treat_missing_data == "breaching"
    )
    error_message = "10 minutes without a tick of episode_uploads alarm: a missing SensorTicks point breaches."
  }

  # Lost uploads: the notifications are broken.
  assert {
    condition = (aws_cloudwatch_metric_alarm.lost_uploads.alarm_name == "episode-pipeline-lost-uploads-found"
      && aws_cloudwatch_metric_alarm.lost_uploads.namespace == "EpisodePipeline"
      && aws_cloudwatch_metric_alarm.lost_uploads.metric_name == "LostUploadsFound"
      && aws_cloudwatch_metric_alarm.lost_uploads.dimensions == tomap({ Deployment = "episode-pipeline", Sensor = "waiting_uploads" })
      && aws_cloudwatch_metric_alarm.lost_uploads.statistic == "Sum"
      && aws_cloudwatch_metric_alarm.lost_uploads.period == 300
      && aws_cloudwatch_metric_alarm.lost_uploads.comparison_operator == "GreaterThanThreshold"
      && aws_cloudwatch_metric_alarm.lost_uploads.threshold == 0
      && aws_cloudwatch_metric_alarm.lost_uploads.treat_missing_data == "notBreaching"
    )
    error_message = "One lost upload found by reconciliation's tick (5 min) alarms."
  }

  # A campaign that cannot go on by itself: one driver tick counting one alarms.
  assert {
    condition = (aws_cloudwatch_metric_alarm.campaign_stalled.alarm_name == "episode-pipeline-campaign-stalled"
      && aws_cloudwatch_metric_alarm.campaign_stalled.namespace == "EpisodePipeline"
      && aws_cloudwatch_metric_alarm.campaign_stalled.metric_name == "CampaignsStalled"
      && aws_cloudwatch_metric_alarm.campaign_stalled.dimensions == tomap({ Deployment = "episode-pipeline", Sensor = "campaign_driver" })
      && aws_cloudwatch_metric_alarm.campaign_stalled.statistic == "Maximum"
      && aws_cloudwatch_metric_alarm.campaign_stalled.period == 60
      && aws_cloudwatch_metric_alarm.campaign_stalled.evaluation_periods == 1
      && aws_cloudwatch_metric_alarm.campaign_stalled.comparison_operator == "GreaterThanOrEqualToThreshold"
      && aws_cloudwatch_metric_alarm.campaign_stalled.threshold == 1
      && aws_cloudwatch_metric_alarm.campaign_stalled.treat_missing_data == "notBreaching"
    )
    error_message = "A campaign_driver tick counting one stalled campaign (the maximum over its minute) alarms."
  }

  # Every alarm, the dead-letter queue's included, notifies the alerts topic, and again when OK.
  assert {
    condition = alltrue([for alarm in concat(
      [aws_cloudwatch_metric_alarm.upload_age, aws_cloudwatch_metric_alarm.no_processing, aws_cloudwatch_metric_alarm.failure_rate,
        aws_cloudwatch_metric_alarm.uploads_sensor_silent, aws_cloudwatch_metric_alarm.lost_uploads,
      aws_cloudwatch_metric_alarm.dlq_not_empty, aws_cloudwatch_metric_alarm.campaign_stalled],
      values(aws_cloudwatch_metric_alarm.sensor_failing),
      ) : (alarm.alarm_actions == toset([aws_sns_topic.alerts[0].arn]) && alarm.ok_actions == toset([aws_sns_topic.alerts[0].arn])
      && (strcontains(alarm.alarm_description, "docs/operations.md#alarms") || alarm.alarm_name == "episode-pipeline-uploads-dlq-not-empty")
    )])
    error_message = "Every alarm notifies the alerts topic on ALARM and on OK, and its description points at the runbook."
  }

  # The tasks that print metrics carry the deployment's name as their Deployment dimension, in
  # log groups of the Standard class (the class CloudWatch extracts EMF from).
  assert {
    condition = alltrue([for key in ["daemon", "code-server", "run"] : contains(
      jsondecode(aws_ecs_task_definition.task[key].container_definitions)[0].environment,
      { name = "METRICS_DEPLOYMENT", value = "episode-pipeline" },
    )]) && output.environment.METRICS_DEPLOYMENT == "episode-pipeline"
    error_message = "The daemon, code server and run tasks get METRICS_DEPLOYMENT = <prefix>."
  }

  assert {
    condition     = alltrue([for group in aws_cloudwatch_log_group.ecs : group.log_group_class == "STANDARD"])
    error_message = "The tasks' log groups are of the Standard class."
  }

  # The dashboard (in this run: one apply serves both).
  assert {
    condition     = aws_cloudwatch_dashboard.main.dashboard_name == "episode-pipeline"
    error_message = "The dashboard is named <prefix>."
  }

  assert {
    condition = (jsondecode(aws_cloudwatch_dashboard.main.dashboard_body).widgets[0].type == "alarm"
      && jsondecode(aws_cloudwatch_dashboard.main.dashboard_body).widgets[0].properties.alarms == concat(
        [for name in ["upload_age", "no_processing", "failure_rate", "uploads_sensor_silent", "lost_uploads", "dlq_not_empty", "campaign_stalled"] :
        "arn:aws:cloudwatch:us-west-2:123456789012:alarm:${name}"],
        [for alarm in aws_cloudwatch_metric_alarm.sensor_failing : alarm.arn],
    ) && length(aws_cloudwatch_metric_alarm.sensor_failing) == 9)
    error_message = "The top widget shows the 16 alarms (7, and one per sensor)."
  }

  assert {
    condition = [for widget in slice(jsondecode(aws_cloudwatch_dashboard.main.dashboard_body).widgets, 1, 12) : widget.properties.title] == [
      "Throughput (per 5 min)",
      "Latency (s): upload to processed, and the run's wall time",
      "Failures by cause (per 5 min)",
      "Failure rate (%) per 5 min; the alarm counts over its own window",
      "Backlog: the oldest upload message's age (s)",
      "Backlog: messages waiting, in flight, dead-lettered",
      "Sensors: failed ticks (per 5 min)",
      "Sensors: the slowest tick (s); a tick must end within 60 s",
      "Retention's working set: live partitions",
      "Retention: episodes pruned (per 5 min)",
      "Output: WARN findings (sync, duration drift), bytes in and out",
    ]
    error_message = "The graphs: throughput, latency, failures by cause and rate, backlog age and depth, sensors, retention, output."
  }

  # The latency graph: p50 and p95 of both durations.
  assert {
    condition = [for line in jsondecode(aws_cloudwatch_dashboard.main.dashboard_body).widgets[2].properties.metrics : [line[1], line[4].stat]] == [
      ["EpisodeLatencySeconds", "p50"], ["EpisodeLatencySeconds", "p95"], ["RunWallSeconds", "p50"], ["RunWallSeconds", "p95"],
    ]
    error_message = "Latency shows upload-to-processed and run wall time, p50 and p95."
  }

  # Failures by cause: every Cause of this deployment, found by SEARCH.
  assert {
    condition     = jsondecode(aws_cloudwatch_dashboard.main.dashboard_body).widgets[3].properties.metrics[0][0].expression == "SEARCH('{EpisodePipeline,Deployment,Cause} Deployment=\"episode-pipeline\" MetricName=\"EpisodesFailed\"', 'Sum', 300)"
    error_message = "Failures by cause: one line per Cause of EpisodesFailed."
  }

  # Backlog and retention lines name the upload queue, the dead-letter queue and the retention sensor.
  assert {
    condition = ([for line in jsondecode(aws_cloudwatch_dashboard.main.dashboard_body).widgets[6].properties.metrics : [line[1], line[3]]] == [
      ["ApproximateNumberOfMessagesVisible", "episode-pipeline-uploads"],
      ["ApproximateNumberOfMessagesNotVisible", "episode-pipeline-uploads"],
      ["ApproximateNumberOfMessagesVisible", "episode-pipeline-uploads-dlq"],
      ]
      && jsondecode(aws_cloudwatch_dashboard.main.dashboard_body).widgets[5].properties.annotations.horizontal[0].value == 3600
      && [for index in [9, 10] : slice(jsondecode(aws_cloudwatch_dashboard.main.dashboard_body).widgets[index].properties.metrics[0], 0, 6)] == [
        ["EpisodePipeline", "LivePartitions", "Deployment", "episode-pipeline", "Sensor", "dagster_retention"],
        ["EpisodePipeline", "EpisodesPruned", "Deployment", "episode-pipeline", "Sensor", "dagster_retention"],
    ])
    error_message = "Backlog depth: waiting and in flight on the upload queue, visible on the dead-letter queue (age with the alarm's line); retention's LivePartitions and EpisodesPruned."
  }

  # Laid out on the 24-column grid without overlaps: two graphs a row under the alarms.
  assert {
    condition = [for widget in jsondecode(aws_cloudwatch_dashboard.main.dashboard_body).widgets : [widget.x, widget.y, widget.width, widget.height]] == [
      [0, 0, 24, 4], [0, 4, 12, 6], [12, 4, 12, 6], [0, 10, 12, 6], [12, 10, 12, 6], [0, 16, 12, 6], [12, 16, 12, 6],
      [0, 22, 12, 6], [12, 22, 12, 6], [0, 28, 12, 6], [12, 28, 12, 6], [0, 34, 12, 6],
    ]
    error_message = "The alarms across the top, then the graphs two a row."
  }
}

# The thresholds are the variables'.
run "thresholds_follow_their_variables" {
  command = plan

  variables {
    alarm_upload_age_seconds            = 7200
    alarm_no_processing_hours           = 4
    alarm_failure_rate_percent          = 50
    alarm_failure_rate_window_minutes   = 30
    alarm_failure_rate_min_episodes     = 10
    alarm_sensor_failed_ticks           = 5
    alarm_uploads_sensor_silent_minutes = 20
    alarm_lost_uploads_threshold        = 3
  }

  assert {
    condition = (aws_cloudwatch_metric_alarm.upload_age.threshold == 7200
      && aws_cloudwatch_metric_alarm.no_processing.evaluation_periods == 4 && aws_cloudwatch_metric_alarm.no_processing.datapoints_to_alarm == 4
      && aws_cloudwatch_metric_alarm.failure_rate.threshold == 50
      && aws_cloudwatch_metric_alarm.uploads_sensor_silent.evaluation_periods == 20 && aws_cloudwatch_metric_alarm.uploads_sensor_silent.datapoints_to_alarm == 20
      && aws_cloudwatch_metric_alarm.lost_uploads.threshold == 3
      && alltrue([for alarm in aws_cloudwatch_metric_alarm.sensor_failing : alarm.evaluation_periods == 5 && alarm.datapoints_to_alarm == 5])
    )
    error_message = "Each threshold is its variable."
  }

  assert {
    condition = ({ for query in aws_cloudwatch_metric_alarm.failure_rate.metric_query : query.id => query.expression if query.return_data }
      == { failure_rate = "IF(ended >= 10, 100 * failed / ended, 0)" }
    && alltrue([for query in aws_cloudwatch_metric_alarm.failure_rate.metric_query : query.metric[0].period == 1800 if length(query.metric) > 0]))
    error_message = "The failure rate's window (30 min) and minimum of episodes (10) are the variables'."
  }
}

run "the_alarms_notify_an_existing_alerts_topic" {
  command = plan

  variables {
    alerts_topic_arn = "arn:aws:sns:us-west-2:123456789012:toborverse-alerts"
    alert_emails     = []
  }

  assert {
    condition = alltrue([for alarm in concat(
      [aws_cloudwatch_metric_alarm.upload_age, aws_cloudwatch_metric_alarm.no_processing, aws_cloudwatch_metric_alarm.failure_rate,
        aws_cloudwatch_metric_alarm.uploads_sensor_silent, aws_cloudwatch_metric_alarm.lost_uploads,
      aws_cloudwatch_metric_alarm.campaign_stalled],
      values(aws_cloudwatch_metric_alarm.sensor_failing),
      ) : alarm.alarm_actions == toset(["arn:aws:sns:us-west-2:123456789012:toborverse-alerts"])
    && alarm.ok_actions == toset(["arn:aws:sns:us-west-2:123456789012:toborverse-alerts"])])
    error_message = "With alerts_topic_arn every alarm notifies that topic."
  }
}

# Thresholds an alarm could never reach, or CloudWatch would refuse, are refused at plan.
run "thresholds_below_their_range_are_refused" {
  command = plan

  variables {
    alarm_upload_age_seconds            = 60
    alarm_no_processing_hours           = 0
    alarm_failure_rate_percent          = 0
    alarm_failure_rate_window_minutes   = 1
    alarm_failure_rate_min_episodes     = 0
    alarm_sensor_failed_ticks           = 0
    alarm_uploads_sensor_silent_minutes = 1
    alarm_lost_uploads_threshold        = -1
  }

  expect_failures = [
    var.alarm_upload_age_seconds, var.alarm_no_processing_hours, var.alarm_failure_rate_percent,
    var.alarm_failure_rate_window_minutes, var.alarm_failure_rate_min_episodes, var.alarm_sensor_failed_ticks,
    var.alarm_uploads_sensor_silent_minutes, var.alarm_lost_uploads_threshold,
  ]
}

run "thresholds_above_their_range_or_fractional_are_refused" {
  command = plan

  variables {
    alarm_upload_age_seconds            = 345600 # the queue has deleted the message by then
    alarm_no_processing_hours           = 1.5
    alarm_failure_rate_percent          = 101
    alarm_failure_rate_window_minutes   = 1441
    alarm_failure_rate_min_episodes     = 2.5
    alarm_sensor_failed_ticks           = 21
    alarm_uploads_sensor_silent_minutes = 1441
    alarm_lost_uploads_threshold        = 0.5
  }

  expect_failures = [
    var.alarm_upload_age_seconds, var.alarm_no_processing_hours, var.alarm_failure_rate_percent,
    var.alarm_failure_rate_window_minutes, var.alarm_failure_rate_min_episodes, var.alarm_sensor_failed_ticks,
    var.alarm_uploads_sensor_silent_minutes, var.alarm_lost_uploads_threshold,
  ]
}
