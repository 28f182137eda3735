"""An upload whose S3 event never reached the queue still gets processed (reconciliation)."""

import uuid

import pytest
from dagster import DagsterInstance, build_sensor_context

from episode_pipeline.db.episodes import ensure_episode_row
from episode_pipeline.defs.resources.aws import aws_fields
from episode_pipeline.defs.resources.postgres import PostgresResource
from episode_pipeline.defs.resources.storage import EpisodeStorage
from episode_pipeline.defs.sensors.reconcile import RECONCILED_TAG, waiting_uploads_sensor
from episode_pipeline.keys import EpisodeRef
from episode_pipeline.lerobot.sample import SampleSpec, write_sample

pytestmark = pytest.mark.integration


def test_a_long_waiting_upload_with_its_archive_gets_a_run(tmp_path, stack, settings, db_conn):
    # A bucket without a notification: as if the S3 event had been lost.
    bucket = f"lost-events-{uuid.uuid4().hex[:8]}"
    storage = EpisodeStorage(bucket=bucket, **aws_fields(settings))
    storage.client.create_bucket(
        Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": settings.aws_region}
    )
    archive = write_sample(tmp_path / "take.tar.zst", SampleSpec(seconds=1.0, cameras=1))
    lost, recent, never_uploaded = (
        EpisodeRef("test-org", f"ep-{uuid.uuid4().hex[:10]}") for _ in "123"
    )
    for ref in (lost, recent, never_uploaded):
        ensure_episode_row(db_conn, ref)
    for ref in (lost, recent):
        storage.upload_file(archive["archive"], f"{ref.prefix}take.tar.zst")
    db_conn.execute(
        "UPDATE episodes SET updated_at = now() - interval '2 hours' WHERE id = ANY(%s)",
        ([lost.episode_id, never_uploaded.episode_id],),
    )

    instance = DagsterInstance.get()
    context = build_sensor_context(
        instance=instance,
        resources={
            "postgres": PostgresResource.from_settings(settings.database),
            "storage": storage,
        },
    )
    result = waiting_uploads_sensor(context)

    (request,) = result.run_requests
    assert request.partition_key == lost.partition_key
    assert request.tags["org"] == "test-org" and request.tags[RECONCILED_TAG] == "true"
    (added,) = result.dynamic_partitions_requests
    assert list(added.partition_keys) == [lost.partition_key]
