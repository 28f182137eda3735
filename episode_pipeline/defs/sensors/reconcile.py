"""Reconciliation: what the event-driven path can miss is found by looking at the stores.

- No upload waits forever (`waiting_uploads`). Every episode is visited in turn — a cursor walks
  the `episodes` table by id, a page per tick, and starts over at the end — so no row (one that
  never got an archive, one that keeps failing) can hold the others back. An episode whose newest
  archive has had no run since it was written, and is older than the queue could explain (a lost
  or misfiltered S3 notification, a message purged by hand), gets a run; re-uploads of processed
  episodes included. A run in flight for the episode, queued ones included, counts as handling it.
- No episode stays `processing` after the run that owned it is gone (`stale_processing`): a
  killed worker, a lost ECS task or a canceled run leaves no run in flight; the episode becomes
  `failed`, and the upload's message (back after its visibility timeout) retries it.
  `orphaned_runs` fails in-process runs whose process died (see `defs.failures`); Dagster's run
  monitoring fails daemon-launched runs whose worker died or that ran past their deadline.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dagster import (
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from episode_pipeline.config.settings import ReconcileSettings
from episode_pipeline.db.episodes import episodes_after, fail_if_still_processing, stale_processing
from episode_pipeline.db.schema_check import read_schema
from episode_pipeline.defs.assets.archive import report_archive_version
from episode_pipeline.defs.failures import fail_orphaned_runs
from episode_pipeline.defs.jobs import EPISODE_JOB_NAME
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.defs.runs import (
    RECONCILED_TAG,
    UPLOAD_TAG,
    episode_tags,
    has_run_in_flight,
    known_partitions,
    latest_run_of_episode,
    latest_run_of_upload,
    new_partitions_request,
    reconciled_run_key,
    upload_id,
)
from episode_pipeline.episodes.extraction import ArchiveNotFound, find_archive
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.storage.bucket import Bucket

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


def lost_upload(
    instance: DagsterInstance,
    bucket: Bucket,
    ref: EpisodeRef,
    processed_at: datetime | None,
    settings: ReconcileSettings,
    now: datetime,
) -> RunRequest | str:
    """The run request for the episode's lost upload, or why it needs none.

    Handled means: a run was started for the upload, or any run of the episode (a backfill,
    the UI) was made after the archive was written, or the row says it was processed after
    that (by whatever system: the worker this pipeline replaced processed the history).
    """
    if has_run_in_flight(instance, ref):
        return "a run is in flight"
    try:
        archive = find_archive(bucket, ref)
    except ArchiveNotFound:
        return "no archive yet"  # the application made the row; the robot has not uploaded
    upload = upload_id(ref.partition_key, archive.version)
    if latest_run_of_upload(instance, upload) is not None:
        return f"{upload} was handed to a run"
    written = bucket.head(archive.key)
    if written is None or written.last_modified is None:
        return f"{archive.key} vanished"
    # S3 truncates LastModified to the second: only a second later is surely after the write.
    written_by = written.last_modified + timedelta(seconds=1)
    if processed_at is not None and processed_at >= written_by:
        return f"{upload} was processed at {processed_at:%Y-%m-%d %H:%M:%S}, after it was written"
    age = (now - written.last_modified).total_seconds()
    if age < settings.lost_upload_after_seconds:
        return f"{upload} is {age:.0f} s old: the queue may still deliver it"
    latest = latest_run_of_episode(instance, ref)
    if latest is not None:
        record = instance.get_run_record_by_id(latest.run_id)
        if record is not None and record.create_timestamp >= written_by:
            return f"{upload}: run {latest.run_id} was started after it was written"
    report_archive_version(instance, ref.partition_key, archive.etag)
    return RunRequest(
        partition_key=ref.partition_key,
        run_key=reconciled_run_key(upload),
        tags={**episode_tags(ref.partition_key), UPLOAD_TAG: upload, RECONCILED_TAG: "true"},
    )


def reconciliation_sensors(settings: ReconcileSettings | None = None) -> list[SensorDefinition]:
    settings = settings or ReconcileSettings()

    @sensor(
        name=WAITING_UPLOADS_SENSOR_NAME,
        job_name=EPISODE_JOB_NAME,
        default_status=DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=300,
        description="Runs every upload that no run has handled "
        f"{settings.lost_upload_after_seconds // 60} minutes after it was written (a lost S3 "
        f"notification), visiting {settings.episodes_per_tick} episodes per tick in turn.",
    )
    def waiting_uploads(
        context: SensorEvaluationContext, postgres: PostgresResource, s3: S3BucketResource
    ):
        bucket = s3.get_client()
        with postgres.connect() as conn:
            page = episodes_after(
                conn, read_schema(conn), context.cursor or "", settings.episodes_per_tick
            )
        # The walk starts over after the last page.
        next_cursor = page[-1][0].episode_id if len(page) == settings.episodes_per_tick else ""
        now = datetime.now(UTC)
        requests = []
        for ref, processed_at in page:
            outcome = lost_upload(context.instance, bucket, ref, processed_at, settings, now)
            if isinstance(outcome, RunRequest):
                context.log.warning(f"{ref}: upload lost: requesting run {outcome.run_key}")
                requests.append(outcome)
        summary = (
            f"visited {len(page)} episode(s) after {context.cursor or 'the start'!r}: "
            f"{len(requests)} lost upload(s)"
        )
        context.log.info(summary)
        context.update_cursor(next_cursor)
        if not requests:
            return SkipReason(summary)
        return SensorResult(
            run_requests=requests,
            dynamic_partitions_requests=new_partitions_request(
                keys := [r.partition_key for r in requests if r.partition_key],
                known_partitions(context.instance, keys),
            ),
        )

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


def sweep_stale_processing(
    context: SensorEvaluationContext, postgres: PostgresResource, settings: ReconcileSettings
) -> list[str]:
    """Fail every episode left `processing` by a run no longer alive; returns their keys."""
    instance = context.instance
    failed = []
    with postgres.connect(autocommit=True) as conn:
        schema = read_schema(conn)
        for ref, seen in stale_processing(conn, schema, settings.stale_processing_after_seconds):
            if has_run_in_flight(instance, ref):
                continue
            latest = latest_run_of_episode(instance, ref)
            if latest is not None and latest.status == DagsterRunStatus.SUCCESS:
                # A partial materialization (extraction alone) succeeded: not a dead run.
                context.log.warning(f"{ref}: processing after successful run {latest.run_id}")
                continue
            if fail_if_still_processing(conn, schema, ref, seen):
                last = f"run {latest.run_id} ({latest.status.value})" if latest else "no run"
                context.log.warning(
                    f"{ref}: left processing by {last}, no run alive: marked failed"
                )
                failed.append(ref.partition_key)
    return failed


RECONCILIATION_SENSORS = reconciliation_sensors()
waiting_uploads, stale_processing_episodes = RECONCILIATION_SENSORS
