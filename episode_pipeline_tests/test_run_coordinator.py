"""Every run of an episode carries its `org`/`episode` tags once queued, however it was
launched: the run queue (`EpisodeRunCoordinator`, configured as in dagster.yaml) adds them to a
run of Dagster's implicit asset job, which carries only its partition."""

from __future__ import annotations

from dagster import DagsterRunStatus
from dagster._core.run_coordinator import SubmitRunContext
from dagster._core.test_utils import create_run_for_test, instance_for_test

from episode_pipeline.defs.run_coordinator import missing_episode_tags
from episode_pipeline.defs.runs import ORG_TAG, PARTITION_TAG
from episode_pipeline_tests.support.runs import JOB_ORIGIN

COORDINATOR = {
    "module": "episode_pipeline.defs.run_coordinator",
    "class": "EpisodeRunCoordinator",
    "config": {
        "tag_concurrency_limits": [
            {"key": "org", "value": {"applyLimitPerUniqueValue": True}, "limit": 1}
        ]
    },
}


def test_missing_tags_come_from_the_partition_and_never_override() -> None:
    assert missing_episode_tags({PARTITION_TAG: "acme/ep-1"}) == {
        "org": "acme",
        "episode": "ep-1",
    }
    assert missing_episode_tags({PARTITION_TAG: "acme/ep-1", "org": "acme"}) == {"episode": "ep-1"}
    assert missing_episode_tags({"dagster/backfill": "x"}) == {}  # not an episode run
    assert missing_episode_tags({PARTITION_TAG: "2026-12-01"}) == {}  # another partitioning


def test_an_asset_job_run_is_queued_with_the_episode_tags() -> None:
    with instance_for_test(overrides={"run_coordinator": COORDINATOR}) as instance:
        assert type(instance.run_coordinator).__name__ == "EpisodeRunCoordinator"
        run = create_run_for_test(
            instance,
            job_name="__ASSET_JOB",
            tags={PARTITION_TAG: "acme/ep-42"},
            status=DagsterRunStatus.NOT_STARTED,
            remote_job_origin=JOB_ORIGIN._replace(job_name="__ASSET_JOB"),
        )
        queued = instance.run_coordinator.submit_run(SubmitRunContext(run, None))
        assert queued.status == DagsterRunStatus.QUEUED
        stored = instance.get_run_by_id(run.run_id)
        assert stored.tags[ORG_TAG] == "acme" and stored.tags["episode"] == "ep-42"
        # The queue's per-org limit now sees it.
        limits = instance.run_coordinator.get_run_queue_config().tag_concurrency_limits
        assert limits[0]["key"] == ORG_TAG
