"""A backfill over several episodes from the UI, on the real local stack.

`dagster dev` (webserver + daemon, as `episode-pipeline dev` starts it) runs against the session's
stack. Two uploads reach Dagster through the SQS sensor and are processed; then the test launches
a backfill of both partitions exactly as the UI does (*Jobs → process_episode → Materialize*,
pick partitions, *Launch backfill*): the same GraphQL mutation over HTTP, with the same
parameters. The backfill daemon must run one run per partition, and the re-runs must replace
what the first runs wrote, not add to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from episode_pipeline.defs.jobs import EPISODE_ASSETS, EPISODE_JOB_NAME
from episode_pipeline.keys import EpisodeRef
from episode_pipeline.lerobot.sample import SampleSpec, write_sample
from episode_pipeline.local.stack import StackInfo
from episode_pipeline.local.upload import upload_episode
from episode_pipeline_tests.dagster_ui import STARTUP_SECONDS, DagsterDev, running_dagster_dev

pytestmark = pytest.mark.integration

PROCESS_SECONDS = 180
BACKFILL_SECONDS = 180
BACKFILL_TAG = "dagster/backfill"
PARTITION_TAG = "dagster/partition"
DONE_STATUSES = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}

# The UI's LAUNCH_PARTITION_BACKFILL_MUTATION (ui-core), minus its error fragment's stack.
LAUNCH_BACKFILL_MUTATION = """
mutation LaunchPartitionBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId launchedRunIds }
    ... on PartitionSetNotFoundError { message }
    ... on PartitionKeysNotFoundError { message }
    ... on InvalidSubsetError { message }
    ... on UnauthorizedError { message }
    ... on PythonError { message stack }
  }
}
"""
BACKFILL_QUERY = """
query Backfill($backfillId: String!) {
  partitionBackfillOrError(backfillId: $backfillId) {
    __typename
    ... on PartitionBackfill { id status numPartitions partitionNames }
    ... on PythonError { message }
  }
}
"""


@pytest.fixture
def dagster_dev(stack: StackInfo, tmp_path: Path) -> Iterator[DagsterDev]:
    with running_dagster_dev(stack, tmp_path) as dev:
        yield dev


def episode_state(conn: psycopg.Connection, ref: EpisodeRef) -> tuple[str, datetime | None]:
    row = conn.execute(
        "SELECT status, processed_at FROM episodes WHERE id = %s AND org_id = %s",
        (ref.episode_id, ref.org_id),
    ).fetchone()
    assert row is not None, f"no episodes row for {ref}"
    return row[0], row[1]


def counts(conn: psycopg.Connection, ref: EpisodeRef) -> dict[str, int]:
    return {
        table: conn.execute(
            f"SELECT count(*) FROM {table} WHERE episode_id = %s", (ref.episode_id,)
        ).fetchone()[0]
        for table in ("frames", "episode_metadata")
    }


def settled_counts(
    conn: psycopg.Connection, refs: list[EpisodeRef], timeout: float
) -> dict[EpisodeRef, dict[str, int]]:
    """Row counts once each episode's metadata is there: it is written after `processed`."""
    deadline = time.monotonic() + timeout
    while True:
        found = {ref: counts(conn, ref) for ref in refs}
        if all(c["episode_metadata"] for c in found.values()) or time.monotonic() > deadline:
            return found
        time.sleep(1)


def wait_processed(
    conn: psycopg.Connection, refs: list[EpisodeRef], dev: DagsterDev, timeout: float
) -> dict[EpisodeRef, datetime]:
    deadline = time.monotonic() + timeout
    while True:
        states = {ref: episode_state(conn, ref) for ref in refs}
        if all(status == "processed" for status, _ in states.values()):
            return {ref: processed_at for ref, (_, processed_at) in states.items()}
        failed = {ref: status for ref, (status, _) in states.items() if status == "failed"}
        assert not failed, f"uploads failed: {failed}\n{dev.tail()}"
        assert time.monotonic() < deadline, f"uploads not processed: {states}\n{dev.tail()}"
        time.sleep(1)


def backfill_runs(backfill_id: str) -> list[Any]:
    from dagster import DagsterInstance, RunsFilter

    return list(DagsterInstance.get().get_runs(RunsFilter(tags={BACKFILL_TAG: backfill_id})))


def wait_backfill(dev: DagsterDev, id_: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        backfill = dev.graphql(BACKFILL_QUERY, {"backfillId": id_})
        backfill = backfill["partitionBackfillOrError"]
        assert backfill["__typename"] == "PartitionBackfill", backfill
        if backfill["status"] in DONE_STATUSES:
            return backfill
        runs = [(run.tags.get(PARTITION_TAG), run.status.value) for run in backfill_runs(id_)]
        assert time.monotonic() < deadline, f"backfill {backfill}, runs {runs}\n{dev.tail()}"
        time.sleep(2)


def test_a_backfill_over_several_episodes_from_the_ui(
    tmp_path: Path,
    dagster_dev: DagsterDev,
    db_conn: psycopg.Connection,
    episode_ref: Callable[..., EpisodeRef],
) -> None:
    # Upload while `dagster dev` starts: the daemon's SQS sensor hands each upload to a run.
    refs = [episode_ref(), episode_ref()]
    for ref in refs:
        archive = tmp_path / f"{ref.episode_id}.tar.zst"
        write_sample(archive, SampleSpec(seconds=1.0, cameras=1))
        upload_episode(archive, ref)
    dagster_dev.wait_until_up(STARTUP_SECONDS)
    first_processed = wait_processed(db_conn, refs, dagster_dev, PROCESS_SECONDS)
    first_counts = settled_counts(db_conn, refs, PROCESS_SECONDS)
    assert all(written["frames"] > 0 for written in first_counts.values()), first_counts

    # What the UI sends from the job's Materialize dialog when several partitions are picked.
    repository = dagster_dev.repository_of(EPISODE_JOB_NAME, STARTUP_SECONDS)
    partitions = [ref.partition_key for ref in refs]
    params = {
        "selector": {
            "partitionSetName": f"{EPISODE_JOB_NAME}_partition_set",
            "repositorySelector": repository,
        },
        "assetSelection": [{"path": [name]} for name in EPISODE_ASSETS],
        "partitionNames": partitions,
        "fromFailure": False,
        "tags": [{"key": "dagster/from_ui", "value": "true"}],
    }
    launched = dagster_dev.graphql(LAUNCH_BACKFILL_MUTATION, {"backfillParams": params})
    launched = launched["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    backfill_id = launched["backfillId"]

    backfill = wait_backfill(dagster_dev, backfill_id, BACKFILL_SECONDS)
    runs = backfill_runs(backfill_id)
    assert backfill["status"] == "COMPLETED_SUCCESS", (backfill, runs, dagster_dev.tail())
    assert sorted(backfill["partitionNames"]) == sorted(partitions)
    assert sorted(run.tags[PARTITION_TAG] for run in runs) == sorted(partitions)
    assert all(run.status.value == "SUCCESS" for run in runs), [
        (run.run_id, run.status.value) for run in runs
    ]
    assert {run.job_name for run in runs} == {EPISODE_JOB_NAME}
    # The per-org run limit applies to backfills too: the job tags every run with its org.
    assert {run.tags.get("org") for run in runs} == {"test-org"}

    for ref in refs:
        status, processed_at = episode_state(db_conn, ref)
        assert status == "processed"
        assert processed_at is not None and processed_at > first_processed[ref]
        assert counts(db_conn, ref) == first_counts[ref]  # replaced, not duplicated
