"""Batch runs' pure rules: the batch key, a batch's task size, a batch's orphaned children, what
an earlier attempt of a batch ended."""

from __future__ import annotations

import pytest
from dagster import DagsterRun, DagsterRunStatus

from episode_pipeline.config.settings import SUBPROCESS, TranscodeSettings
from episode_pipeline.episodes.batches import BatchKey, InvalidBatchKey, batch_key, parse_batch_key
from episode_pipeline.episodes.keys import InvalidEpisodeKey, parse_partition_key
from episode_pipeline.instance.run_tags import (
    ABANDONED_TAG,
    BATCH_RUN_TAG,
    BATCH_TAG,
    PARTITION_TAG,
    TRANSCODER_TAG,
    batch_child_tags,
    episode_of_run,
)
from episode_pipeline.orchestration.batches import ALREADY_FAILED, ALREADY_SUCCEEDED, ended_children
from episode_pipeline.orchestration.failures import is_orphaned
from episode_pipeline.transcode.placement import place, place_batch

MiB = 1 << 20


def test_a_batch_key_round_trips_and_is_never_an_episode_key():
    assert batch_key("c12", 3, 7) == "c12.w3.b7"
    assert parse_batch_key("c12.w3.b7") == BatchKey("c12", 3, 7)
    assert parse_batch_key("spring-fix_2.w0.b10") == BatchKey("spring-fix_2", 0, 10)
    with pytest.raises(InvalidEpisodeKey):  # no '/': never read as ORG/EP
        parse_partition_key("c12.w3.b7")
    run = DagsterRun(job_name="process_episode_batch", tags={"dagster/partition": "c12.w3.b7"})
    assert episode_of_run(run) is None


@pytest.mark.parametrize(
    "key",
    ["", "c12", "c12.w3", "c12.w3.b", "c12.wx.b1", "c.12.w3.b7", "c12/w3/b7", "-c.w1.b1",
     "c12.w3.b7 ", "c12.w-1.b7", "c12.w1234567890.b1", "c" * 65 + ".w1.b1"],
)  # fmt: skip
def test_a_malformed_batch_key_is_refused_by_name(key):
    with pytest.raises(InvalidBatchKey, match=r"is not <campaign_id>\.w<wave>\.b<n>"):
        parse_batch_key(key)


def test_parts_that_cannot_make_a_batch_key_are_refused():
    with pytest.raises(InvalidBatchKey, match=r"campaign id 'a\.b'"):
        batch_key("a.b", 1, 1)
    with pytest.raises(InvalidBatchKey, match="wave -1"):
        batch_key("c1", -1, 1)


def test_a_batch_task_is_sized_by_its_largest_archive_and_transcodes_in_itself():
    with_task = TranscodeSettings(
        ecs_cluster="pipe",
        ecs_subnets=("subnet-1",),
        task_definition="pipe-transcode",
        task_above_bytes=100 * MiB,
    )
    sizes = [10 * MiB, 300 * MiB, None, 20 * MiB]
    placement = place_batch(sizes, with_task)
    assert placement.mode == SUBPROCESS  # the one above task_above_bytes too: no second task
    assert placement.run_size == place(300 * MiB, None, TranscodeSettings()).run_size
    assert placement.run_size is not None and placement.run_size.vcpus == 4
    assert place_batch([None, None], with_task).run_size is None  # the launcher's default


def test_a_child_of_an_ended_batch_run_is_orphaned_wherever_it_ran():
    tags = batch_child_tags("c1.w0.b0", "batch-run", {"episode_pipeline/campaign": "c1", "x": "y"})
    assert tags["episode_pipeline/campaign"] == "c1" and "x" not in tags
    assert (tags[BATCH_TAG], tags[BATCH_RUN_TAG], tags[TRANSCODER_TAG]) == (
        "c1.w0.b0",
        "batch-run",
        SUBPROCESS,
    )
    child = DagsterRun(job_name="process_episode", status=DagsterRunStatus.STARTED, tags=tags)
    assert is_orphaned(child, host="daemon-host", ended_batch_runs={"batch-run"})
    assert not is_orphaned(child, host="daemon-host", ended_batch_runs={"other-run"})
    done = DagsterRun(job_name="process_episode", status=DagsterRunStatus.SUCCESS, tags=tags)
    assert not is_orphaned(done, host="daemon-host", ended_batch_runs={"batch-run"})


def test_an_earlier_attempt_ended_an_episode_by_a_success_or_a_failure_of_its_own():
    def child(partition: str, status: DagsterRunStatus, abandoned: bool = False) -> DagsterRun:
        tags = {PARTITION_TAG: partition, **({ABANDONED_TAG: "true"} if abandoned else {})}
        return DagsterRun(job_name="process_episode", status=status, tags=tags)

    retried_ok = [child("o/a", DagsterRunStatus.FAILURE), child("o/a", DagsterRunStatus.SUCCESS)]
    own_failure = child("o/b", DagsterRunStatus.FAILURE)
    abandoned = child("o/c", DagsterRunStatus.FAILURE, abandoned=True)
    ended = ended_children([*retried_ok, own_failure, abandoned])
    assert ended == {
        "o/a": (ALREADY_SUCCEEDED, retried_ok[1].run_id),
        "o/b": (ALREADY_FAILED, own_failure.run_id),
    }  # o/c: its batch runs it again
