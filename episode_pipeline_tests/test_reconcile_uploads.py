"""An upload whose S3 event never reached the queue still gets processed (reconciliation)."""

import dataclasses
import uuid

import pytest
from dagster import DagsterInstance, DagsterRunStatus, SkipReason, build_sensor_context
from dagster._core.test_utils import create_run_for_test

from episode_pipeline.bucket import Bucket
from episode_pipeline.db.episodes import ensure_episode_row
from episode_pipeline.defs.jobs import EPISODE_JOB_NAME
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.defs.runs import PARTITION_TAG, RECONCILED_TAG
from episode_pipeline.defs.sensors.reconcile import waiting_uploads
from episode_pipeline.keys import EpisodeRef
from episode_pipeline.lerobot.sample import SampleSpec, write_sample

pytestmark = pytest.mark.integration


def new_ref() -> EpisodeRef:
    return EpisodeRef("test-org", f"ep-{uuid.uuid4().hex[:10]}")


@pytest.fixture
def lost_events(tmp_path, stack, settings, db_conn):
    """A bucket without a notification (as if the S3 event had been lost), and an uploader."""
    settings = dataclasses.replace(settings, bucket=f"lost-events-{uuid.uuid4().hex[:8]}")
    bucket = Bucket(settings.bucket, settings.aws)
    bucket.client.create_bucket(
        Bucket=bucket.name, CreateBucketConfiguration={"LocationConstraint": settings.aws.region}
    )
    archive = write_sample(tmp_path / "take.tar.zst", SampleSpec(seconds=1.0, cameras=1))

    def upload(ref: EpisodeRef, *, hours_ago: int = 2, archive_uploaded: bool = True) -> None:
        ensure_episode_row(db_conn, ref)
        if archive_uploaded:
            bucket.upload_file(archive["archive"], f"{ref.prefix}take.tar.zst")
        db_conn.execute(
            "UPDATE episodes SET updated_at = now() - make_interval(hours => %s) WHERE id = %s",
            (hours_ago, ref.episode_id),
        )

    def tick(instance: DagsterInstance):
        context = build_sensor_context(
            instance=instance,
            resources={
                "postgres": PostgresResource.from_settings(settings.database),
                "s3": S3BucketResource.from_settings(settings),
            },
        )
        return waiting_uploads(context)

    return upload, tick


def test_a_long_waiting_upload_with_its_archive_gets_a_run(lost_events):
    upload, tick = lost_events
    lost, recent, never_uploaded = new_ref(), new_ref(), new_ref()
    upload(lost)
    upload(recent, hours_ago=0)
    upload(never_uploaded, archive_uploaded=False)

    result = tick(DagsterInstance.get())

    (request,) = result.run_requests
    assert request.partition_key == lost.partition_key
    assert request.tags["org"] == "test-org" and request.tags[RECONCILED_TAG] == "true"
    (added,) = result.dynamic_partitions_requests
    assert list(added.partition_keys) == [lost.partition_key]


@pytest.mark.parametrize("status", [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED])
def test_an_upload_whose_run_waits_in_the_queue_gets_no_second_run(lost_events, status):
    # The run is queued behind the per-org limit: it has not started, but it is not lost.
    upload, tick = lost_events
    queued = new_ref()
    upload(queued)
    with DagsterInstance.ephemeral() as instance:
        create_run_for_test(
            instance,
            job_name=EPISODE_JOB_NAME,
            status=status,
            tags={PARTITION_TAG: queued.partition_key},
        )
        result = tick(instance)

    assert isinstance(result, SkipReason), result.run_requests
