"""Reconciliation on the real stack: lost uploads are found without starvation, and episodes left
`processing` by a dead run become `failed` (docs/contract.md#reconciliation)."""

import dataclasses
import uuid

import pytest
from dagster import (
    DagsterRunStatus,
    SensorResult,
    SkipReason,
    build_sensor_context,
)

from episode_pipeline.config.settings import ReconcileSettings
from episode_pipeline.db.episodes import (
    ensure_episode_row,
    episode_row,
    fail_if_still_processing,
    stale_processing,
)
from episode_pipeline.db.schema_check import read_schema
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.defs.sensors.reconcile import reconciliation_sensors
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_tags import (
    EPISODE_JOB_NAME,
    PARTITION_TAG,
    RECONCILED_TAG,
    UPLOAD_TAG,
)
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.uploads.lost_uploads import Cursor
from episode_pipeline_tests.support import new_ref
from episode_pipeline_tests.support.dagster_internals import create_run_for_test
from episode_pipeline_tests.support.runs import JOB_ORIGIN

pytestmark = pytest.mark.integration

LOST_AT_ONCE = ReconcileSettings(lost_upload_after_seconds=0, episodes_per_tick=100_000)


@pytest.fixture
def lost_events(tmp_path, stack, settings, db_conn):
    """A bucket without a notification (as if every S3 event had been lost), and an uploader."""
    settings = dataclasses.replace(settings, bucket=f"lost-events-{uuid.uuid4().hex[:8]}")
    bucket = Bucket(settings.bucket, settings.aws)
    bucket.client.create_bucket(
        Bucket=bucket.name, CreateBucketConfiguration={"LocationConstraint": settings.aws.region}
    )
    archive = write_sample(tmp_path / "take.tar.zst", SampleSpec(seconds=1.0, cameras=1))
    resources = {
        "postgres": PostgresResource.from_settings(settings.database),
        "s3": S3BucketResource.from_settings(settings),
    }

    def upload(
        ref: EpisodeRef,
        *,
        status: str = "uploaded",
        archive_uploaded: bool = True,
        processed_minutes_from_now: int | None = None,
    ):
        ensure_episode_row(db_conn, ref)
        db_conn.execute("UPDATE episodes SET status = %s WHERE id = %s", (status, ref.episode_id))
        if processed_minutes_from_now is not None:
            db_conn.execute(
                "UPDATE episodes SET processed_at = now() + make_interval(mins => %s)"
                " WHERE id = %s",
                (processed_minutes_from_now, ref.episode_id),
            )
        if archive_uploaded:
            bucket.upload_file(archive["archive"], f"{ref.prefix}take.tar.zst")

    def tick(instance, reconcile=LOST_AT_ONCE, cursor=None):
        waiting, _ = reconciliation_sensors(reconcile)
        context = build_sensor_context(instance=instance, resources=resources, cursor=cursor)
        return waiting(context), context.cursor

    return upload, tick


def requested(result) -> list[str]:
    if not isinstance(result, SensorResult):
        return []
    return [r.partition_key for r in result.run_requests]


def make_run(instance, ref: EpisodeRef, status: DagsterRunStatus) -> None:
    create_run_for_test(
        instance,
        job_name=EPISODE_JOB_NAME,
        status=status,
        tags={PARTITION_TAG: ref.partition_key},
        remote_job_origin=JOB_ORIGIN,
    )


def test_a_lost_upload_gets_one_run_and_a_fresh_or_missing_one_none(lost_events, instance):
    upload, tick = lost_events
    lost, never_uploaded = new_ref(), new_ref()
    upload(lost)
    upload(never_uploaded, archive_uploaded=False)

    # Written moments ago: the queue may still deliver it.
    result, _ = tick(instance, ReconcileSettings(episodes_per_tick=100_000))
    assert lost.partition_key not in requested(result)

    result, _ = tick(instance)
    (request,) = [r for r in result.run_requests if r.partition_key == lost.partition_key]
    assert request.tags["org"] == "test-org" and request.tags[RECONCILED_TAG] == "true"
    assert request.tags[UPLOAD_TAG] in request.run_key
    assert never_uploaded.partition_key not in requested(result)
    assert lost.partition_key in result.dynamic_partitions_requests[0].partition_keys


def test_a_reupload_of_a_processed_episode_whose_event_was_lost_is_found(lost_events, instance):
    upload, tick = lost_events
    reuploaded = new_ref()
    # An earlier upload was processed by a run; then the robot uploaded again, event lost.
    make_run(instance, reuploaded, DagsterRunStatus.SUCCESS)
    upload(reuploaded, status="processed", processed_minutes_from_now=-120)
    result, _ = tick(instance)
    assert reuploaded.partition_key in requested(result)


def test_an_upload_processed_after_it_was_written_is_not_run_again(lost_events, instance):
    # The history: processed by the worker this pipeline replaced, so no run exists anywhere.
    upload, tick = lost_events
    history = new_ref()
    upload(history, status="processed", processed_minutes_from_now=10)
    result, _ = tick(instance)
    assert history.partition_key not in requested(result)


@pytest.mark.parametrize("status", [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED])
def test_an_upload_whose_run_waits_in_the_queue_gets_no_second_run(lost_events, instance, status):
    # The run is queued behind the per-org limit: it has not started, but it is not lost.
    upload, tick = lost_events
    queued = new_ref()
    upload(queued)
    make_run(instance, queued, status)
    result, _ = tick(instance)
    assert queued.partition_key not in requested(result)


def test_episodes_without_an_archive_never_hold_back_a_lost_upload(lost_events, instance):
    # Pages of two episodes, while the table holds many rows that never had an archive (and
    # every other test's episodes): the walk reaches the lost one within one pass.
    upload, tick = lost_events
    for _ in range(5):
        upload(new_ref(), archive_uploaded=False)
    lost = new_ref()
    upload(lost)
    # The walk alone (the pending pass would find it at once; see test_reconcile_scale.py).
    small_pages = dataclasses.replace(
        LOST_AT_ONCE, episodes_per_tick=2, pending_per_tick=0, walk_cycle_seconds=10**9
    )
    cursor, found, ticks = None, [], 0
    while True:
        result, cursor = tick(instance, small_pages, cursor)
        found += requested(result)
        ticks += 1
        if not Cursor.parse(cursor).walk:  # the walk is back at the start: one full pass
            break
    assert found.count(lost.partition_key) == 1
    assert ticks > 3  # it really paged


# -- episodes left processing --------------------------------------------------------------------


@pytest.fixture
def sweep(settings, db_conn):
    resources = {"postgres": PostgresResource.from_settings(settings.database)}

    def left_processing(minutes_ago: int = 30) -> EpisodeRef:
        ref = new_ref()
        ensure_episode_row(db_conn, ref)
        db_conn.execute(
            "UPDATE episodes SET status = 'processing', "
            "updated_at = now() - make_interval(mins => %s) WHERE id = %s",
            (minutes_ago, ref.episode_id),
        )
        return ref

    def run(instance):
        _, sweeper = reconciliation_sensors(ReconcileSettings())
        return sweeper(build_sensor_context(instance=instance, resources=resources))

    def status(ref: EpisodeRef) -> str:
        return episode_row(db_conn, ref)["status"]

    return left_processing, run, status


def test_an_episode_left_processing_by_a_dead_or_canceled_run_becomes_failed(sweep, instance):
    left_processing, run, status = sweep
    canceled, vanished, alive = (left_processing() for _ in range(3))
    recent = left_processing(minutes_ago=1)
    make_run(instance, canceled, DagsterRunStatus.CANCELED)
    make_run(instance, alive, DagsterRunStatus.STARTED)

    result = run(instance)

    assert isinstance(result, SkipReason)
    assert status(canceled) == "failed"  # the run-failure sensor never sees a canceled run
    assert status(vanished) == "failed"  # its run record is gone (a lost ECS task, a purge)
    assert status(alive) == "processing"  # its run is still working
    assert status(recent) == "processing"  # within the grace period
    assert canceled.partition_key in (result.skip_message or "")


def test_an_episode_that_a_new_run_picked_up_meanwhile_is_left_alone(sweep, db_conn):
    left_processing, _, status = sweep
    ref = left_processing()
    schema = read_schema(db_conn)
    (seen,) = [s for r, s in stale_processing(db_conn, schema, 600).rows if r == ref]
    # Between the sweeper's read and its update, a new run marked the episode processing.
    db_conn.execute("UPDATE episodes SET updated_at = now() WHERE id = %s", (ref.episode_id,))
    assert not fail_if_still_processing(db_conn, schema, ref, seen)
    assert status(ref) == "processing"
