"""The retention sensor: prunes settled episodes from Dagster's storage (docs/retention.md)."""

from __future__ import annotations

from dagster import (
    DefaultSensorStatus,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from episode_pipeline.config.settings import RetentionSettings
from episode_pipeline.orchestration.retention import prune

RETENTION_SENSOR_NAME = "dagster_retention"
RETENTION_INTERVAL_SECONDS = 600


def retention_sensor(settings: RetentionSettings | None = None) -> SensorDefinition:
    settings = settings or RetentionSettings()

    @sensor(
        name=RETENTION_SENSOR_NAME,
        default_status=DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=RETENTION_INTERVAL_SECONDS,
        description="Deletes the runs, event logs, check results and partition of episodes "
        f"settled longer than {settings.episode_days:g} days ({settings.failed_episode_days:g} "
        "when the last run failed): the application's tables and S3 keep the record. "
        "`episode-pipeline reprocess` brings an episode back.",
    )
    def dagster_retention(context: SensorEvaluationContext) -> SkipReason:
        # A SkipReason still records the tick, with the summary in the UI's tick history.
        report = prune(context.instance, settings, log=context.log)
        context.log.info(report.describe())
        context.log.info(f"retention counts: {report.as_metadata()}")
        return SkipReason(report.describe())

    return dagster_retention
