"""Batch runs on the real stack.

- Three episodes in one batch run, the middle one a bad archive: the two good episodes end
  `processed`, each by its own run of `process_episode` with its own checks; the bad one ends
  `failed` by its own failed run, with its cause; the batch run succeeds and its metadata lists
  all three. A child a dead attempt left STARTED is failed first. Retention's statements then
  prune the batch's run and partition. A private bucket
  keeps the uploads off the stack's queue.
- The run queue sizes a batch run's task by the largest archive of its episodes.
"""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

from episode_pipeline.config.settings import Settings
from episode_pipeline.db.batches import create_batch
from episode_pipeline.db.connection import connect
from episode_pipeline.db.episodes import ensure_episode_row, episode_row
from episode_pipeline.definitions import build_definitions
from episode_pipeline.defs.batches import BATCH_JOB_NAME
from episode_pipeline.defs.partitions import BATCHES_PARTITION_NAME
from episode_pipeline.defs.retention import _connect, delete_episodes
from episode_pipeline.defs.runs import (
    BATCH_RUN_TAG,
    BATCH_TAG,
    ECS_CPU_TAG,
    ECS_MEMORY_TAG,
    PARTITION_TAG,
    TRANSCODER_TAG,
)
from episode_pipeline.episodes.batches import batch_key
from episode_pipeline.local.stack_env import load_settings
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.transcode import placement
from episode_pipeline_tests.support import new_ref
from episode_pipeline_tests.support.dagster_internals import (
    SubmitRunContext,
    create_run_for_test,
    instance_for_test,
)
from episode_pipeline_tests.support.graph import check_evaluation
from episode_pipeline_tests.support.runs import JOB_ORIGIN

pytestmark = pytest.mark.integration

CAMPAIGN_TAG = "episode_pipeline/campaign"
COORDINATOR = {"module": "episode_pipeline.defs.run_coordinator", "class": "EpisodeRunCoordinator"}


@pytest.mark.slow(seconds=45)
def test_a_batch_runs_each_episode_as_its_own_run_and_a_bad_one_fails_alone(
    stack, settings: Settings, tmp_path: Path
) -> None:
    private = dataclasses.replace(settings, bucket=f"batch-{uuid.uuid4().hex[:8]}")
    bucket = Bucket(private.bucket, private.aws)
    bucket.client.create_bucket(
        Bucket=bucket.name, CreateBucketConfiguration={"LocationConstraint": private.aws.region}
    )
    sample = tmp_path / "take.tar.zst"
    write_sample(sample, SampleSpec(seconds=1.0, cameras=1))
    good_a, bad, good_b = new_ref(), new_ref(), new_ref()
    archives = {
        good_a: sample.read_bytes(),
        bad: b"not a zstd archive",
        good_b: sample.read_bytes(),
    }
    key = batch_key(f"t{uuid.uuid4().hex[:6]}", 0, 1)
    with connect(private.database) as conn:
        for ref, archive in archives.items():
            ensure_episode_row(conn, ref)
            bucket.put_bytes(f"{ref.prefix}take.tar.zst", archive)
        create_batch(conn, key, [good_a, bad, good_b])
        conn.commit()
    instance = DagsterInstance.get()
    instance.add_dynamic_partitions(BATCHES_PARTITION_NAME, [key])
    # What a dead attempt of the batch run leaves: a child of it still STARTED.
    abandoned = create_run_for_test(
        instance,
        job_name="process_episode",
        tags={BATCH_TAG: key, PARTITION_TAG: good_b.partition_key},
        status=DagsterRunStatus.STARTED,
    )

    result = (
        build_definitions(private)
        .resolve_job_def(BATCH_JOB_NAME)
        .execute_in_process(partition_key=key, instance=instance, tags={CAMPAIGN_TAG: "t"})
    )

    assert result.success
    batch_run_id = result.dagster_run.run_id
    (output,) = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_OUTPUT]
    metadata = output.step_output_data.metadata
    assert (metadata["succeeded"].value, metadata["failed"].value) == (2, 1)
    rows = {row.data["episode"]: row.data for row in metadata["outcomes"].value.records}
    assert instance.get_run_by_id(abandoned.run_id).status == DagsterRunStatus.FAILURE  # type: ignore[union-attr]
    runs = {
        run.tags[PARTITION_TAG]: run
        for run in instance.get_runs(RunsFilter(tags={BATCH_TAG: key}))
        if run.run_id != abandoned.run_id
    }
    assert set(rows) == set(runs) == {ref.partition_key for ref in archives}
    for ref in archives:
        run, row = runs[ref.partition_key], rows[ref.partition_key]
        assert row["run_id"] == run.run_id
        assert run.tags[BATCH_RUN_TAG] == batch_run_id and run.tags[CAMPAIGN_TAG] == "t"
        with connect(private.database) as conn:
            status = episode_row(conn, ref)["status"]
        if ref == bad:
            assert (row["outcome"], run.status, status) == (
                "failed",
                DagsterRunStatus.FAILURE,
                "failed",
            )
            assert row["cause"].startswith("extracted_files: "), row["cause"]
        else:
            assert (row["outcome"], run.status, status) == (
                "succeeded",
                DagsterRunStatus.SUCCESS,
                "processed",
            )
            assert check_evaluation(ref, "frames", "frames_match_parquet_rows").passed

    # Settled, the batch goes as an episode does: its run, then its partition.
    with _connect(instance) as conn:
        deleted = delete_episodes(conn, [key])
    assert (deleted["runs"], deleted["partitions"]) == (1, 1)
    assert instance.get_run_by_id(batch_run_id) is None
    assert not instance.has_dynamic_partition(BATCHES_PARTITION_NAME, key)


def test_the_queue_sizes_a_batch_task_by_its_largest_archive(stack, s3_client, monkeypatch) -> None:
    """As the daemon's run queue does, from the stack's S3 and `episode_batches`. The bytes a
    vCPU transcodes are scaled down so three small objects stand for large archives."""
    for name, value in {
        **stack.env,
        "TRANSCODE_TASK_ABOVE_BYTES": "100",  # would send any one of them to a task of its own
        "TRANSCODE_TASK_DEFINITION": "pipe-transcode",
        "ECS_CLUSTER": "pipe",
        "ECS_SUBNETS": "subnet-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(placement, "ARCHIVE_BYTES_PER_VCPU", 1000)
    refs = [new_ref(), new_ref(), new_ref()]
    for ref, size in zip(refs, (500, 2500, 1500), strict=True):
        s3_client.put_object(Bucket=stack.bucket, Key=f"{ref.prefix}take.tar.zst", Body=b"0" * size)
    key = batch_key(f"t{uuid.uuid4().hex[:6]}", 0, 0)
    with connect(load_settings().database) as conn:
        create_batch(conn, key, refs)
        conn.commit()

    with instance_for_test(overrides={"run_coordinator": COORDINATOR}) as instance:
        run = create_run_for_test(
            instance,
            job_name=BATCH_JOB_NAME,
            tags={PARTITION_TAG: key},
            status=DagsterRunStatus.NOT_STARTED,
            remote_job_origin=JOB_ORIGIN._replace(job_name=BATCH_JOB_NAME),
        )
        instance.run_coordinator.submit_run(SubmitRunContext(run, None))
        queued: DagsterRun = instance.get_run_by_id(run.run_id)  # type: ignore[assignment]

    # 2,500 bytes at 1,000 a vCPU: 3, the next Fargate size 4 (not 1 for the first, 8 for all).
    assert (queued.tags[TRANSCODER_TAG], queued.tags[ECS_CPU_TAG], queued.tags[ECS_MEMORY_TAG]) == (
        "subprocess",
        "4096",
        "8192",
    )
