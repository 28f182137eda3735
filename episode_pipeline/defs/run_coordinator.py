"""The run queue, with every run of an episode tagged as the episode's own runs are.

The job `process_episode` tags its runs `org` / `episode` from the partition
(`tags_for_partition_key_fn`), but a run the UI launches from the asset graph, or a backfill of
the assets, is Dagster's implicit `__ASSET_JOB` and carries only `dagster/partition`. The per-org
limit (`tag_concurrency_limits`, key `org`) would miss it. This coordinator adds the missing
tags from the partition key when a run is submitted, before it is queued, so the limit and the
UI's run filters see every run of an episode, however it was launched. Runs executed in-process
(`dagster asset materialize`, `dg launch`, `episode-pipeline process`) never pass through the
queue: they take no slot and obey no limit.
"""

from __future__ import annotations

from collections.abc import Mapping

from dagster import DagsterRunStatus
from dagster._core.run_coordinator import QueuedRunCoordinator, SubmitRunContext
from dagster._core.storage.dagster_run import DagsterRun

from episode_pipeline.defs.runs import PARTITION_TAG, episode_tags
from episode_pipeline.episodes.keys import InvalidEpisodeKey


def missing_episode_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """The episode tags a run with these tags lacks ({} for a run of no episode)."""
    partition_key = tags.get(PARTITION_TAG)
    if not partition_key:
        return {}
    try:
        wanted = episode_tags(partition_key)
    except InvalidEpisodeKey:
        return {}
    return {key: value for key, value in wanted.items() if key not in tags}


class EpisodeRunCoordinator(QueuedRunCoordinator):
    """`QueuedRunCoordinator` (same config) that tags each episode run before queueing it."""

    def submit_run(self, context: SubmitRunContext) -> DagsterRun:
        run = context.dagster_run
        missing = missing_episode_tags(run.tags)
        if missing and run.status == DagsterRunStatus.NOT_STARTED:
            self._instance.add_run_tags(run.run_id, missing)
            tagged = run.with_tags({**run.tags, **missing})
            context = SubmitRunContext(tagged, context.workspace)
        return super().submit_run(context)
