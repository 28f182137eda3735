"""Reconciliation: what the event-driven path can miss is found by looking at the stores.

- No episode stays `processing` after the run that owned it is gone: `orphaned_runs` fails
  in-process runs whose process died (see `defs.failures`); daemon-launched runs are watched by
  Dagster's run monitoring.
- No upload waits forever. An episode still `uploaded` well after the queue should have handed it
  over (a lost or misfiltered S3 notification, a message purged by hand), whose archive is in the
  bucket and which no run is working on — queued runs included — gets a run.
"""

from dagster import (
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from episode_pipeline.db.episodes import waiting_uploads as waiting_upload_refs
from episode_pipeline.defs.failures import fail_orphaned_runs
from episode_pipeline.defs.jobs import EPISODE_JOB_NAME
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.defs.runs import (
    RECONCILED_TAG,
    episode_tags,
    has_run_in_flight,
    new_partitions_request,
    reconciled_run_key,
)
from episode_pipeline.extraction import ArchiveNotFound, find_archive


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


# Longer than the queue's 15-minute visibility timeout plus a queued run's wait: by then the
# event-driven path has had its chance.
WAITING_UPLOAD_SECONDS = 45 * 60
WAITING_UPLOADS_PER_TICK = 50


@sensor(
    job_name=EPISODE_JOB_NAME,
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=300,
    description="Runs episodes still `uploaded` 45 minutes after their last change whose archive "
    "is in the bucket and that no run is working on (a lost S3 notification).",
)
def waiting_uploads(
    context: SensorEvaluationContext, postgres: PostgresResource, s3: S3BucketResource
):
    bucket = s3.get_client()
    with postgres.connect() as conn:
        waiting = waiting_upload_refs(conn, WAITING_UPLOAD_SECONDS, WAITING_UPLOADS_PER_TICK)
    requests = []
    for ref in waiting:
        if has_run_in_flight(context.instance, ref):
            continue
        try:
            archive = find_archive(bucket, ref)
        except ArchiveNotFound:
            continue  # the application made the row; the robot has not uploaded yet
        context.log.warning(f"{ref}: still uploaded, no run: requesting one for {archive.key}")
        requests.append(
            RunRequest(
                partition_key=ref.partition_key,
                run_key=reconciled_run_key(ref.partition_key, archive.version),
                tags={**episode_tags(ref.partition_key), RECONCILED_TAG: "true"},
            )
        )
    if not requests:
        return SkipReason(f"{len(waiting)} waiting upload(s), none needing a run")
    return SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=new_partitions_request(
            context.instance, [r.partition_key for r in requests if r.partition_key]
        ),
    )
