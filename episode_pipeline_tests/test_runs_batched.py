"""Run bookkeeping a sensor tick does for hundreds of uploads at once, in one query each."""

from __future__ import annotations

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus

from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME
from episode_pipeline.instance.run_tags import UPLOAD_TAG
from episode_pipeline.orchestration.runs import (
    known_partitions,
    latest_runs_of_uploads,
    new_partitions_request,
)


def add_run(instance: DagsterInstance, upload: str, run_id: str, status: DagsterRunStatus) -> None:
    instance.add_run(
        DagsterRun(
            job_name="process_episode", run_id=run_id, status=status, tags={UPLOAD_TAG: upload}
        )
    )


def test_each_upload_gets_its_newest_run_and_uploads_without_runs_are_absent(
    instance: DagsterInstance,
) -> None:
    add_run(instance, "acme/ep-1@v1", "failed-first", DagsterRunStatus.FAILURE)
    add_run(instance, "acme/ep-2@v1", "only-run", DagsterRunStatus.SUCCESS)
    add_run(instance, "acme/ep-1@v1", "retried", DagsterRunStatus.SUCCESS)

    latest = latest_runs_of_uploads(
        instance, ["acme/ep-1@v1", "acme/ep-2@v1", "acme/ep-3@v1", "acme/ep-1@v1"]
    )

    assert {upload: run.run_id for upload, run in latest.items()} == {
        "acme/ep-1@v1": "retried",
        "acme/ep-2@v1": "only-run",
    }
    # The same answer as asking one upload at a time.
    for upload in ("acme/ep-1@v1", "acme/ep-2@v1", "acme/ep-3@v1"):
        one = latest_runs_of_uploads(instance, [upload]).get(upload)
        batched = latest.get(upload)
        assert (one and one.run_id) == (batched and batched.run_id)
    assert latest_runs_of_uploads(instance, []) == {}


def test_only_unknown_partitions_are_requested_each_once(instance: DagsterInstance) -> None:
    instance.add_dynamic_partitions(EPISODES_PARTITION_NAME, ["acme/ep-1"])

    keys = ["acme/ep-1", "acme/ep-2", "acme/ep-2", "zeta/ep-9"]
    known = known_partitions(instance, keys)
    [request] = new_partitions_request(keys, known)

    assert known == {"acme/ep-1"}
    assert list(request.partition_keys) == ["acme/ep-2", "zeta/ep-9"]
    assert new_partitions_request(["acme/ep-1"], known) == []
    assert new_partitions_request([], known_partitions(instance, [])) == []
