"""A batch run on the real stack: three episodes in one run, the middle one a bad archive.

The two good episodes end `processed`, each by its own run of `process_episode` with its own
checks; the bad one ends `failed` by its own failed run, with its cause; the batch run succeeds
and its metadata lists all three. A private bucket keeps the uploads off the stack's queue.
"""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter

from episode_pipeline.config.settings import Settings
from episode_pipeline.db.batches import create_batch
from episode_pipeline.db.connection import connect
from episode_pipeline.db.episodes import ensure_episode_row, episode_row
from episode_pipeline.definitions import build_definitions
from episode_pipeline.defs.batches import BATCH_JOB_NAME
from episode_pipeline.defs.partitions import BATCHES_PARTITION_NAME
from episode_pipeline.defs.runs import BATCH_RUN_TAG, BATCH_TAG, PARTITION_TAG
from episode_pipeline.episodes.batches import batch_key
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline_tests.support import new_ref
from episode_pipeline_tests.support.graph import check_evaluation

pytestmark = pytest.mark.integration

CAMPAIGN_TAG = "episode_pipeline/campaign"


@pytest.mark.slow(seconds=40)
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
    runs = {
        run.tags[PARTITION_TAG]: run for run in instance.get_runs(RunsFilter(tags={BATCH_TAG: key}))
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
