"""Batch runs on the real stack.

- Three episodes in one batch run, the middle one a bad archive: the two good episodes end
  `processed`, each by its own run of `process_episode` with its own checks; the bad one ends
  `failed` by its own failed run, with its cause; the batch run succeeds and its metadata lists
  all three. A child a dead attempt left STARTED is failed first. Retention's statements then
  prune the batch's run and partition. A private bucket
  keeps the uploads off the stack's queue.
- A later attempt of a batch (run_retries' retry after its task died) runs only the episodes
  no earlier attempt ended: not one whose child succeeded or failed on its own (the campaign's
  ledger retries that one), nor their partitions (pruned since) added again.
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
from episode_pipeline.defs.partitions import BATCHES_PARTITION_NAME, EPISODES_PARTITION_NAME
from episode_pipeline.episodes.batches import batch_key, parse_batch_key
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_tags import (
    ABANDONED_TAG,
    BATCH_JOB_NAME,
    BATCH_RUN_TAG,
    BATCH_TAG,
    CAMPAIGN_TAG,
    ECS_CPU_TAG,
    ECS_MEMORY_TAG,
    PARTITION_TAG,
    TRANSCODER_TAG,
)
from episode_pipeline.local.stack_env import load_settings
from episode_pipeline.orchestration import dagster_tables
from episode_pipeline.orchestration.failures import report_abandoned
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

COORDINATOR = {
    "module": "episode_pipeline.instance.run_coordinator",
    "class": "EpisodeRunCoordinator",
}


def private_batch(settings: Settings, archives: dict[EpisodeRef, bytes]) -> tuple[Settings, str]:
    """A batch of these episodes (in this order), their archives in a bucket of its own."""
    private = dataclasses.replace(settings, bucket=f"batch-{uuid.uuid4().hex[:8]}")
    bucket = Bucket(private.bucket, private.aws)
    bucket.client.create_bucket(
        Bucket=bucket.name, CreateBucketConfiguration={"LocationConstraint": private.aws.region}
    )
    key = batch_key(f"t{uuid.uuid4().hex[:6]}", 0, 1)
    with connect(private.database) as conn:
        for ref, archive in archives.items():
            ensure_episode_row(conn, ref)
            bucket.put_bytes(f"{ref.prefix}take.tar.zst", archive)
        create_batch(conn, key, list(archives))
        conn.commit()
    DagsterInstance.get().add_dynamic_partitions(BATCHES_PARTITION_NAME, [key])
    return private, key


@pytest.mark.slow(seconds=45)
def test_a_batch_runs_each_episode_as_its_own_run_and_a_bad_one_fails_alone(
    stack, settings: Settings, tmp_path: Path
) -> None:
    sample = tmp_path / "take.tar.zst"
    write_sample(sample, SampleSpec(seconds=1.0, cameras=1))
    good_a, bad, good_b = new_ref(), new_ref(), new_ref()
    archives = {
        good_a: sample.read_bytes(),
        bad: b"not a zstd archive",
        good_b: sample.read_bytes(),
    }
    private, key = private_batch(settings, archives)
    instance = DagsterInstance.get()
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
    with dagster_tables.connect(instance) as conn:
        deleted = dagster_tables.delete_episodes(conn, [key])
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


def test_a_later_attempt_of_a_batch_runs_only_the_episodes_no_earlier_attempt_ended(
    stack, settings: Settings
) -> None:
    """The K = 5 soak's batch: its task killed mid-batch, run_retries' retry ran again an
    episode whose child had failed on S3 (the ledger had claimed it into a later wave: it ran
    twice) and one already rejected (its pruned partition came back)."""
    succeeded, failed, left_started, orphaned = new_ref(), new_ref(), new_ref(), new_ref()
    pruned = new_ref()  # failed on its own, settled by the ledger, its run deleted by the prune
    broken = b"not a zstd archive"  # a run again fails in a second, and says it ran
    refs = [succeeded, failed, pruned, left_started, orphaned]
    private, key = private_batch(settings, dict.fromkeys(refs, broken))
    with connect(private.database) as conn:  # the campaign's ledger: one row settled
        campaign_id = parse_batch_key(key).campaign_id
        conn.execute(
            "INSERT INTO campaigns (id, name, selection, target_code_version, state, settings,"
            " governor) VALUES (%s, 't', '{}', 't', 'running', '{}', '{}')",
            (campaign_id,),
        )
        for position, ref in enumerate(refs):
            conn.execute(
                "INSERT INTO campaign_episodes (campaign_id, org_id, episode_id, position,"
                " state, wave, batch_key) VALUES (%s, %s, %s, %s, %s, 0, %s)",
                (
                    campaign_id,
                    ref.org_id,
                    ref.episode_id,
                    position,
                    "rejected" if ref == pruned else "requested",
                    key,
                ),
            )
        conn.commit()
    instance = DagsterInstance.get()
    earlier = {
        succeeded: DagsterRunStatus.SUCCESS,
        failed: DagsterRunStatus.FAILURE,  # on its own: the ledger has read it
        left_started: DagsterRunStatus.STARTED,  # a dead attempt's: failed by this one
        orphaned: DagsterRunStatus.STARTED,  # a dead attempt's, failed by `orphaned_runs`
    }
    children = {
        ref: create_run_for_test(
            instance,
            job_name="process_episode",
            tags={BATCH_TAG: key, PARTITION_TAG: ref.partition_key},
            status=status,
        )
        for ref, status in earlier.items()
    }
    report_abandoned(instance, children[orphaned], "its process is gone (killed or crashed)")

    result = (
        build_definitions(private)
        .resolve_job_def(BATCH_JOB_NAME)
        .execute_in_process(partition_key=key, instance=instance, tags={CAMPAIGN_TAG: "t"})
    )

    assert result.success
    (output,) = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_OUTPUT]
    rows = {
        row.data["episode"]: (row.data["outcome"], row.data["run_id"])
        for row in output.step_output_data.metadata["outcomes"].value.records
    }
    assert rows[succeeded.partition_key] == ("already succeeded", children[succeeded].run_id)
    assert rows[failed.partition_key] == ("already failed", children[failed].run_id)
    assert rows[pruned.partition_key] == ("settled by its campaign", None)
    for ref in (left_started, orphaned):  # run again: a new child, failed on the archive
        outcome, run_id = rows[ref.partition_key]
        assert outcome == "failed" and run_id != children[ref].run_id
    new_runs = {
        run.tags[PARTITION_TAG]
        for run in instance.get_runs(RunsFilter(tags={BATCH_TAG: key}))
        if run.run_id not in {child.run_id for child in children.values()}
    }
    assert new_runs == {left_started.partition_key, orphaned.partition_key}
    # The ended episodes' partitions (pruned by their campaign) are not added back.
    for ref in (succeeded, failed, pruned):
        assert not instance.has_dynamic_partition(EPISODES_PARTITION_NAME, ref.partition_key)
    assert instance.get_run_by_id(children[left_started].run_id).tags[ABANDONED_TAG] == "true"  # type: ignore[union-attr]
