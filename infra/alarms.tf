# The fleet's alarms, each to the alerts topic (queue.tf: local.alerts_topic_arn, where the
# dead-letter queue's alarm also lives), and the dashboard. What each one means and what to do:
# docs/operations.md#alarms. Thresholds are variables (variables.tf, "Alarms").
#
# The EpisodePipeline metrics are embedded-metric-format (EMF) lines the tasks print to stdout
# (METRICS_DEPLOYMENT, ecs.tf, gives them the Deployment dimension). The awslogs driver ships
# them to the tasks' log groups (ecs.tf), and CloudWatch extracts EMF from any log group of the
# Standard class: no metric filter, no x-amzn-logs-format header (optional since 2023, the
# PutLogEvents page of the EMF guide; awslabs/aws-embedded-metrics-python#73, a maintainer: "any
# EMF logs that can reach CloudWatch Logs will now be parsed"). The queue's metrics are AWS/SQS's.
#
# Missing data is chosen per alarm: an EMF metric has no data point in a period where nothing
# happened. Metric math (docs: "Using metric math") reads a missing value as 0 where the other
# series of an operation has a point, drops a point that divides by zero, and FILL(m, 0) gives
# every period a value.

locals {
  metric_namespace = "EpisodePipeline"
  deployment       = { Deployment = local.prefix }
  alarm_actions    = [local.alerts_topic_arn]
  runbook          = "Runbook: docs/operations.md#alarms."

  # The sensors by Dagster name, with the code's minimum_interval_seconds
  # (episode_pipeline_tests/test_deploy_infra.py checks both against the definitions). A
  # sensor's alarm period is its interval rounded up to whole minutes, so that a period holds
  # about one tick (several for the fast ones).
  sensor_intervals = {
    episode_uploads               = 10
    episode_upload_done           = 10
    episode_upload_heartbeat      = 240
    episode_failed_on_run_failure = 15
    orphaned_runs                 = 60
    waiting_uploads               = 300
    stale_processing              = 120
    dagster_retention             = 600
    campaign_driver               = 30
  }
  sensor_periods = { for name, seconds in local.sensor_intervals : name => max(60, ceil(seconds / 60) * 60) }
}

# --- The upload queue's oldest message ----------------------------------------------------------
# Messages sit unreceived when the daemon stops receiving (hung, a wedged sensor, a broken
# deploy); none reaches 3 receives, so the dead-letter queue's alarm stays silent. A received
# message stays on the queue (hidden) until its run succeeds, so the age also counts the run.

resource "aws_cloudwatch_metric_alarm" "upload_age" {
  alarm_name        = "${local.prefix}-upload-queue-oldest-message-age"
  alarm_description = "The oldest message on ${aws_sqs_queue.uploads.name} is older than ${var.alarm_upload_age_seconds} s: uploads wait unreceived or unfinished (daemon stopped, a sensor failing, runs not keeping up). SQS deletes a message after 4 days. ${local.runbook}"

  namespace           = "AWS/SQS"
  metric_name         = "ApproximateAgeOfOldestMessage"
  dimensions          = { QueueName = aws_sqs_queue.uploads.name }
  statistic           = "Maximum"
  period              = 300
  evaluation_periods  = 1
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.alarm_upload_age_seconds
  # SQS reports every minute while the queue holds messages or is polled; no data is no backlog.
  treat_missing_data = "notBreaching"

  alarm_actions = local.alarm_actions
  ok_actions    = local.alarm_actions
}

# --- No episode processed while uploads arrive --------------------------------------------------
# Hour by hour: an hour breaches when uploads were sent to the queue and no episode was
# processed. N such hours in a row alarm, so an upload late in one hour, processed in the next,
# never does.

resource "aws_cloudwatch_metric_alarm" "no_processing" {
  alarm_name        = "${local.prefix}-no-episode-processed"
  alarm_description = "${var.alarm_no_processing_hours} hour(s) in a row with uploads sent to ${aws_sqs_queue.uploads.name} and no episode processed. ${local.runbook}"

  comparison_operator = "GreaterThanOrEqualToThreshold"
  threshold           = 1
  evaluation_periods  = var.alarm_no_processing_hours
  datapoints_to_alarm = var.alarm_no_processing_hours
  # An hour with neither uploads nor processed episodes has no data point: nothing to process.
  treat_missing_data = "notBreaching"

  # FILL: an hour without EpisodesProcessed counts 0. Without it `processed == 0` would have no
  # point in that hour, and AND would read the missing point as false.
  metric_query {
    id          = "stalled"
    label       = "uploads arrived, none processed (1 = true)"
    expression  = "uploads > 0 AND FILL(processed, 0) == 0"
    return_data = true
  }

  metric_query {
    id          = "uploads"
    return_data = false
    metric {
      namespace   = "AWS/SQS"
      metric_name = "NumberOfMessagesSent"
      dimensions  = { QueueName = aws_sqs_queue.uploads.name }
      stat        = "Sum"
      period      = 3600
    }
  }

  metric_query {
    id          = "processed"
    return_data = false
    metric {
      namespace   = local.metric_namespace
      metric_name = "EpisodesProcessed"
      dimensions  = local.deployment
      stat        = "Sum"
      period      = 3600
    }
  }

  alarm_actions = local.alarm_actions
  ok_actions    = local.alarm_actions
}

# --- The failure rate ---------------------------------------------------------------------------

resource "aws_cloudwatch_metric_alarm" "failure_rate" {
  alarm_name        = "${local.prefix}-failure-rate"
  alarm_description = "More than ${var.alarm_failure_rate_percent}% of the episodes that ended in ${var.alarm_failure_rate_window_minutes} min failed (counted from ${var.alarm_failure_rate_min_episodes} episodes). ${local.runbook}"

  comparison_operator = "GreaterThanThreshold"
  threshold           = var.alarm_failure_rate_percent
  evaluation_periods  = 1
  # A window in which no episode ended has no data point: no rate to judge.
  treat_missing_data = "notBreaching"

  metric_query {
    id          = "failure_rate"
    label       = "failed, % of episodes ended"
    expression  = "IF(ended >= ${var.alarm_failure_rate_min_episodes}, 100 * failed / ended, 0)"
    return_data = true
  }

  metric_query {
    id          = "ended"
    label       = "episodes ended"
    expression  = "processed + failed" # a missing one counts 0; 0 ended never divides (IF)
    return_data = false
  }

  dynamic "metric_query" {
    for_each = { processed = "EpisodesProcessed", failed = "EpisodesFailed" }
    content {
      id          = metric_query.key
      return_data = false
      metric {
        namespace   = local.metric_namespace
        metric_name = metric_query.value
        dimensions  = local.deployment # EpisodesFailed without Cause: all causes
        stat        = "Sum"
        period      = var.alarm_failure_rate_window_minutes * 60
      }
    }
  }

  alarm_actions = local.alarm_actions
  ok_actions    = local.alarm_actions
}

# --- A sensor failing every tick ----------------------------------------------------------------
# Per sensor: the share of its ticks that raised, per period of its own interval. M periods in a
# row in which every tick failed alarm. A period without a tick has no data point (0 ticks
# divides by zero) and is skipped: CloudWatch then evaluates the most recent periods that had
# ticks. A sensor that stops ticking altogether: the uploads sensor's silence alarm below.

resource "aws_cloudwatch_metric_alarm" "sensor_failing" {
  for_each = local.sensor_periods

  alarm_name        = "${local.prefix}-sensor-${each.key}-failing"
  alarm_description = "Every tick of the sensor ${each.key} failed in ${var.alarm_sensor_failed_ticks} period(s) of ${each.value} s in a row. ${local.runbook}"

  comparison_operator = "GreaterThanOrEqualToThreshold"
  threshold           = 1
  evaluation_periods  = var.alarm_sensor_failed_ticks
  datapoints_to_alarm = var.alarm_sensor_failed_ticks
  treat_missing_data  = "missing"

  metric_query {
    id          = "failed_share"
    label       = "failed ticks / ticks"
    expression  = "failures / ticks" # no failures: 0; no ticks: no point
    return_data = true
  }

  dynamic "metric_query" {
    for_each = { ticks = "SensorTicks", failures = "SensorTickFailures" }
    content {
      id          = metric_query.key
      return_data = false
      metric {
        namespace   = local.metric_namespace
        metric_name = metric_query.value
        dimensions  = merge(local.deployment, { Sensor = each.key })
        stat        = "Sum"
        period      = each.value
      }
    }
  }

  alarm_actions = local.alarm_actions
  ok_actions    = local.alarm_actions
}

# The uploads sensor not ticking at all: the daemon or the code server is down or wedged. Every
# minute should hold ticks (its interval is 10 s), so a minute without one breaches.
resource "aws_cloudwatch_metric_alarm" "uploads_sensor_silent" {
  alarm_name        = "${local.prefix}-uploads-sensor-not-ticking"
  alarm_description = "The sensor episode_uploads has not ticked for ${var.alarm_uploads_sensor_silent_minutes} min: nothing receives the upload queue. ${local.runbook}"

  namespace           = local.metric_namespace
  metric_name         = "SensorTicks"
  dimensions          = merge(local.deployment, { Sensor = "episode_uploads" })
  statistic           = "Sum"
  period              = 60
  evaluation_periods  = var.alarm_uploads_sensor_silent_minutes
  datapoints_to_alarm = var.alarm_uploads_sensor_silent_minutes
  comparison_operator = "LessThanThreshold"
  threshold           = 1
  treat_missing_data  = "breaching" # no tick is the failure this alarm exists for

  alarm_actions = local.alarm_actions
  ok_actions    = local.alarm_actions
}

# --- Lost uploads: the bucket's notifications are broken ----------------------------------------
# Reconciliation (waiting_uploads) runs an archive no run handled 45 min after it was written:
# its notification never reached the queue.

resource "aws_cloudwatch_metric_alarm" "lost_uploads" {
  alarm_name        = "${local.prefix}-lost-uploads-found"
  alarm_description = "Reconciliation found more than ${var.alarm_lost_uploads_threshold} upload(s) no notification announced: the upload route (${local.upload_route}) is losing events. ${local.runbook}"

  namespace           = local.metric_namespace
  metric_name         = "LostUploadsFound"
  dimensions          = merge(local.deployment, { Sensor = "waiting_uploads" })
  statistic           = "Sum"
  period              = local.sensor_periods["waiting_uploads"]
  evaluation_periods  = 1
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.alarm_lost_uploads_threshold
  treat_missing_data  = "notBreaching" # a tick that found none may print no value

  alarm_actions = local.alarm_actions
  ok_actions    = local.alarm_actions
}

# --- A reprocessing campaign that cannot go on ----------------------------------------------------
# The campaign driver's tick writes how many campaigns cannot go on by themselves (stopped by
# the canary, no wave because their live partitions fill the budget, every claim released, no
# episode settled for two stale-claim windows, done with every episode rejected). The cause is in
# `episode-pipeline campaign status <id>`; the rule: episode_pipeline/campaign/progress.py.

resource "aws_cloudwatch_metric_alarm" "campaign_stalled" {
  alarm_name        = "${local.prefix}-campaign-stalled"
  alarm_description = "A reprocessing campaign cannot go on by itself: `episode-pipeline campaign status <id>` names the cause (canary without baseline or with findings, live-partition budget full, claims released, no progress, every episode rejected). ${local.runbook}"

  namespace           = local.metric_namespace
  metric_name         = "CampaignsStalled"
  dimensions          = merge(local.deployment, { Sensor = "campaign_driver" })
  statistic           = "Maximum"
  period              = local.sensor_periods["campaign_driver"]
  evaluation_periods  = 1
  comparison_operator = "GreaterThanOrEqualToThreshold"
  threshold           = 1
  # No point: the driver did not tick (its sensor's own alarms) or found no campaign table.
  treat_missing_data = "notBreaching"

  alarm_actions = local.alarm_actions
  ok_actions    = local.alarm_actions
}

# --- The dashboard ------------------------------------------------------------------------------
# One page: the alarms, then two graphs a row: throughput, latency, failures by cause, the
# backlog, the sensors, retention's working set and the output. A metric line is
# [namespace, name, dimension, value, ..., {options}]; an expression line is [{expression, id}].

locals {
  dashboard_period = 300
  graph = {
    view    = "timeSeries"
    stacked = false
    region  = var.region
    period  = local.dashboard_period
    stat    = "Sum"
  }

  episode_metric = { for name in [
    "EpisodesProcessed", "EpisodesFailed", "EpisodeLatencySeconds", "RunWallSeconds", "BytesIn",
    "BytesOut", "SyncFindings", "DriftFindings",
  ] : name => [local.metric_namespace, name, "Deployment", local.prefix] }
  retention_metric = { for name in ["LivePartitions", "EpisodesPruned"] : name => [
    local.metric_namespace, name, "Deployment", local.prefix, "Sensor", "dagster_retention",
  ] }
  queue_metric = { for name in [
    "ApproximateAgeOfOldestMessage", "ApproximateNumberOfMessagesVisible",
    "ApproximateNumberOfMessagesNotVisible", "NumberOfMessagesSent",
  ] : name => ["AWS/SQS", name, "QueueName", aws_sqs_queue.uploads.name] }

  # One line per value of a dimension, found by SEARCH: a new cause or sensor appears by itself.
  search = { for metric, by in {
    "EpisodesFailed"     = ["Cause", "Sum"]
    "SensorTickFailures" = ["Sensor", "Sum"]
    "TickSeconds"        = ["Sensor", "Maximum"]
    } : metric => "SEARCH('{${local.metric_namespace},Deployment,${by[0]}} Deployment=\"${local.prefix}\" MetricName=\"${metric}\"', '${by[1]}', ${local.dashboard_period})"
  }

  alarm_arns = concat(
    [for alarm in [
      aws_cloudwatch_metric_alarm.upload_age, aws_cloudwatch_metric_alarm.no_processing,
      aws_cloudwatch_metric_alarm.failure_rate, aws_cloudwatch_metric_alarm.uploads_sensor_silent,
      aws_cloudwatch_metric_alarm.lost_uploads, aws_cloudwatch_metric_alarm.dlq_not_empty,
      aws_cloudwatch_metric_alarm.campaign_stalled,
    ] : alarm.arn],
    [for alarm in aws_cloudwatch_metric_alarm.sensor_failing : alarm.arn],
  )

  graphs = [
    merge(local.graph, {
      title = "Throughput (per 5 min)"
      metrics = [
        concat(local.queue_metric["NumberOfMessagesSent"], [{ label = "uploads sent to the queue" }]),
        concat(local.episode_metric["EpisodesProcessed"], [{ label = "processed" }]),
        concat(local.episode_metric["EpisodesFailed"], [{ label = "failed" }]),
      ]
    }),
    merge(local.graph, {
      title = "Latency (s): upload to processed, and the run's wall time"
      metrics = [
        concat(local.episode_metric["EpisodeLatencySeconds"], [{ stat = "p50", label = "upload to processed p50" }]),
        concat(local.episode_metric["EpisodeLatencySeconds"], [{ stat = "p95", label = "upload to processed p95" }]),
        concat(local.episode_metric["RunWallSeconds"], [{ stat = "p50", label = "run wall time p50" }]),
        concat(local.episode_metric["RunWallSeconds"], [{ stat = "p95", label = "run wall time p95" }]),
      ]
    }),
    merge(local.graph, {
      title   = "Failures by cause (per 5 min)"
      metrics = [[{ expression = local.search["EpisodesFailed"], id = "causes", label = "" }]]
    }),
    merge(local.graph, {
      title = "Failure rate (%) per 5 min; the alarm counts over its own window"
      metrics = [
        [{ expression = "IF(processed + failed > 0, 100 * failed / (processed + failed), 0)", id = "rate", label = "failed %" }],
        concat(local.episode_metric["EpisodesProcessed"], [{ id = "processed", visible = false }]),
        concat(local.episode_metric["EpisodesFailed"], [{ id = "failed", visible = false }]),
      ]
      annotations = { horizontal = [{ label = "alarm", value = var.alarm_failure_rate_percent }] }
    }),
    merge(local.graph, {
      title       = "Backlog: the oldest upload message's age (s)"
      stat        = "Maximum"
      metrics     = [concat(local.queue_metric["ApproximateAgeOfOldestMessage"], [{ label = "oldest message" }])]
      annotations = { horizontal = [{ label = "alarm", value = var.alarm_upload_age_seconds }] }
    }),
    merge(local.graph, {
      title = "Backlog: messages waiting, in flight, dead-lettered"
      stat  = "Maximum"
      metrics = [
        concat(local.queue_metric["ApproximateNumberOfMessagesVisible"], [{ label = "waiting" }]),
        concat(local.queue_metric["ApproximateNumberOfMessagesNotVisible"], [{ label = "in flight (runs)" }]),
        ["AWS/SQS", "ApproximateNumberOfMessagesVisible", "QueueName", aws_sqs_queue.dlq.name, { label = "dead-letter queue" }],
      ]
    }),
    merge(local.graph, {
      title   = "Sensors: failed ticks (per 5 min)"
      metrics = [[{ expression = local.search["SensorTickFailures"], id = "failures", label = "" }]]
    }),
    merge(local.graph, {
      title   = "Sensors: the slowest tick (s); a tick must end within 60 s"
      metrics = [[{ expression = local.search["TickSeconds"], id = "ticks", label = "" }]]
    }),
    merge(local.graph, {
      title   = "Retention's working set: live partitions"
      stat    = "Maximum"
      metrics = [concat(local.retention_metric["LivePartitions"], [{ label = "live partitions" }])]
    }),
    merge(local.graph, {
      title   = "Retention: episodes pruned (per 5 min)"
      metrics = [concat(local.retention_metric["EpisodesPruned"], [{ label = "pruned" }])]
    }),
    merge(local.graph, {
      title = "Output: WARN findings (sync, duration drift), bytes in and out"
      metrics = [
        concat(local.episode_metric["SyncFindings"], [{ label = "sync findings" }]),
        concat(local.episode_metric["DriftFindings"], [{ label = "drift findings" }]),
        concat(local.episode_metric["BytesIn"], [{ label = "bytes in", yAxis = "right" }]),
        concat(local.episode_metric["BytesOut"], [{ label = "bytes out", yAxis = "right" }]),
      ]
    }),
  ]
}

resource "aws_cloudwatch_dashboard" "main" {
  dashboard_name = local.prefix

  # The alarms across the top (24 columns), then the graphs two a row, 12 x 6 each.
  dashboard_body = jsonencode({
    widgets = concat(
      [{ type = "alarm", x = 0, y = 0, width = 24, height = 4, properties = { title = "Alarms", alarms = local.alarm_arns } }],
      [for index, graph in local.graphs : {
        type       = "metric"
        x          = (index % 2) * 12
        y          = 4 + floor(index / 2) * 6
        width      = 12
        height     = 6
        properties = graph
      }],
    )
  })
}
