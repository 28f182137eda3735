"""`campaign_driver`: paces every reprocessing campaign, one tick at a time
(`orchestration/campaigns.py`)."""

from __future__ import annotations

from dagster import (
    DefaultSensorStatus,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from episode_pipeline.config.settings import CampaignSettings, RetentionSettings
from episode_pipeline.db import campaigns as db
from episode_pipeline.db.outputs import has_outputs_table
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.orchestration.campaigns import drive, registered
from episode_pipeline.runtime import metrics

CAMPAIGN_SENSOR_NAME = "campaign_driver"


def campaign_driver(
    settings: CampaignSettings | None = None, retention: RetentionSettings | None = None
) -> SensorDefinition:
    """`retention`: the code location's, by whose rules the driver prunes the partitions its
    campaigns added (taken once, as the retention sensor takes them)."""
    settings = settings or CampaignSettings()
    retention = retention or RetentionSettings()

    @sensor(
        name=CAMPAIGN_SENSOR_NAME,
        default_status=DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=settings.tick_seconds,
        description="Drives `episode-pipeline campaign` reprocessing: reconciles each wave's "
        "runs into the ledger, applies the governor and the canary, prunes settled partitions "
        "and records the next wave as a backfill titled `<campaign> · wave N`.",
    )
    def campaign_driver_sensor(
        context: SensorEvaluationContext, postgres: PostgresResource
    ) -> SkipReason:
        with postgres.connect() as conn:
            if not has_outputs_table(conn):
                return SkipReason("no campaigns table (migration 004): nothing to drive")
        reports = drive(
            context.instance, postgres, tick_seconds=settings.tick_seconds, retention=retention
        )
        for report in reports:
            if report.stalled:
                context.log.warning(report.describe())
            else:
                context.log.info(report.describe())
        # Every tick: the campaigns that cannot go on (a stopped one too, driven or not) and
        # those this tick found so (one done with every episode rejected), for the alarm.
        with postgres.connect() as conn:
            recorded = db.stalled_campaigns(conn)
        stalled = registered(context.instance, recorded) | {
            r.campaign for r in reports if r.stalled
        }
        metrics.gauge(metrics.CAMPAIGNS_STALLED, len(stalled))
        failed = [report.describe() for report in reports if report.error]
        if failed:  # after the others were driven and the limits published: a failed tick
            raise RuntimeError(" | ".join(failed))  # counted in SensorTickFailures (alarmed)
        if not reports:
            return SkipReason("no campaign running")
        # A SkipReason still records the tick, with each campaign's progress in the tick log.
        return SkipReason(" | ".join(report.describe() for report in reports))

    return campaign_driver_sensor
