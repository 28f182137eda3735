"""Reconciliation: what the event-driven path can miss is found by looking at the stores. Each
sensor's tick is one call: `orchestration/lost_uploads.py`, `orchestration/stale_processing.py`.

- No upload waits forever (`waiting_uploads`, `orchestration/lost_uploads.py`). Never-processed
  episodes are visited every tick or few (an index-backed query), and every episode once a day by
  a walk of the `episodes` table by id, a page per tick, starting over at the end — so no row
  (one that never got an archive, one that keeps failing) can hold the others back. An episode
  whose newest archive has had no run since it was written, and is older than the queue could
  explain (a lost or misfiltered S3 notification, a message purged by hand), gets a run;
  re-uploads of processed episodes included. A run in flight for the episode, queued ones
  included, counts as handling it. The S3 requests a tick spends are bounded and logged.
- No episode stays `processing` after the run that owned it is gone (`stale_processing`): a
  killed worker, a lost ECS task or a canceled run leaves no run in flight; the episode becomes
  `failed`, and the upload's message (back after its visibility timeout) retries it.
  `orphaned_runs` fails in-process runs whose process died (`orchestration/failures.py`);
  Dagster's run monitoring fails daemon-launched runs whose worker died or that ran past their
  deadline.
"""

from __future__ import annotations

from dagster import (
    DefaultSensorStatus,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from episode_pipeline.config.settings import ReconcileSettings
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.instance.run_tags import EPISODE_JOB_NAME
from episode_pipeline.orchestration.failures import fail_orphaned_runs
from episode_pipeline.orchestration.lost_uploads import evaluate_waiting_uploads
from episode_pipeline.orchestration.stale_processing import sweep_stale_processing

WAITING_UPLOADS_SENSOR_NAME = "waiting_uploads"
STALE_PROCESSING_SENSOR_NAME = "stale_processing"


@sensor(
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=60,
    description="Fails in-process runs whose process died, so their episodes become `failed`.",
)
def orphaned_runs(context: SensorEvaluationContext):
    failed = fail_orphaned_runs(context.instance)
    if not failed:
        return SkipReason("no orphaned runs")
    context.log.warning(f"reported {len(failed)} orphaned run(s) failed: {', '.join(failed)}")
    return SkipReason(f"reported {len(failed)} orphaned run(s) failed")


def reconciliation_sensors(settings: ReconcileSettings | None = None) -> list[SensorDefinition]:
    settings = settings or ReconcileSettings()

    @sensor(
        name=WAITING_UPLOADS_SENSOR_NAME,
        job_name=EPISODE_JOB_NAME,
        default_status=DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=settings.interval_seconds,
        description="Runs every upload that no run has handled "
        f"{settings.lost_upload_after_seconds // 60} minutes after it was written (a lost S3 "
        "notification): never-processed episodes every tick or few, and every episode once per "
        f"{settings.walk_cycle_seconds / 3600:g} h, within {settings.s3_requests_per_hour} S3 "
        "requests an hour (orchestration/lost_uploads.py).",
    )
    def waiting_uploads(
        context: SensorEvaluationContext, postgres: PostgresResource, s3: S3BucketResource
    ):
        return evaluate_waiting_uploads(context, postgres, s3.get_client(), settings)

    @sensor(
        name=STALE_PROCESSING_SENSOR_NAME,
        default_status=DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=120,
        description="Marks `failed` an episode left `processing` "
        f"{settings.stale_processing_after_seconds // 60} minutes after its last change by a "
        "run that is no longer alive (killed worker, lost ECS task, canceled run).",
    )
    def stale_processing_episodes(context: SensorEvaluationContext, postgres: PostgresResource):
        failed = sweep_stale_processing(context, postgres, settings)
        if not failed:
            return SkipReason("no episode left processing by a dead run")
        return SkipReason(f"marked {len(failed)} episode(s) failed: {', '.join(failed)}")

    return [waiting_uploads, stale_processing_episodes]


RECONCILIATION_SENSORS = reconciliation_sensors()
waiting_uploads, stale_processing_episodes = RECONCILIATION_SENSORS
