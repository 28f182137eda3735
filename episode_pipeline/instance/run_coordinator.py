"""The run queue, with every run of an episode tagged and sized as the uploads sensor's runs are.

The job `process_episode` tags its runs `org` / `episode` from the partition
(`tags_for_partition_key_fn`), but a run the UI launches from the asset graph, or a backfill of
the assets, is Dagster's implicit `__ASSET_JOB` and carries only `dagster/partition`. The per-org
limit (`tag_concurrency_limits`, key `org`) would miss it. This coordinator adds the missing
tags from the partition key when a run is submitted, before it is queued, so the limit and the
UI's run filters see every run of an episode, however it was launched.

It also places every episode run nobody placed: a run the uploads sensor requests carries the
placement of its upload (`episode_pipeline/transcoder`, `ecs/cpu`, `ecs/memory`; see
`transcode.placement`), but a UI launch, a backfill (`episode-pipeline reprocess`), a reconciled
upload or the run-failure retry of an unplaced run carries none and would get the launcher's
default task size. Such a run is placed by the same rule from its archive's size, read with one
LIST of the episode's own prefix (the listing gives the size; the run's archive key is not in
its tags). A run carrying any placement tag (the sensor's, or a user's) is left as it is; when
the bucket cannot be read, the run keeps the default and says why in its event log.

A batch run (`process_episode_batch`, a campaign's K episodes in one task) is sized by the
largest archive of its episodes, read from `episode_batches` and one LIST per episode; its
episodes transcode in its task (`transcode.placement.place_batch`).

Runs executed in-process (`dagster asset materialize`, `dg launch`, `episode-pipeline process`,
a batch run's episodes) never pass through the queue: they take no slot, obey no limit and start
no ECS task to size.

Its run queue holds each campaign to the launch limit its governor published (the tag limits of
`dagster.yaml`, plus one per campaign: instance/campaign_queue.py).

A batch run counts once and holds its episodes (`batch_queue_config`): the episode runs it starts
inside itself carry the campaign's tags, and Dagster's dequeue counts every run in progress by its
tags, so the limits they count against are raised by them; and a batch run and any queued run of
one of its episodes share a lock tag per episode (`runs.EPISODE_LOCK_TAG_PREFIX`, added here on
submit) limited to one run in progress while the batch is in flight. Both are decided inside
Dagster's dequeue (in progress, and within one dequeue), so no check-then-start window is left.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

import psycopg
from botocore.exceptions import BotoCoreError, ClientError
from dagster import DagsterRun, DagsterRunStatus, RunsFilter
from dagster._core.run_coordinator import QueuedRunCoordinator, SubmitRunContext
from dagster._core.run_coordinator.queued_run_coordinator import RunQueueConfig
from dagster._core.storage.dagster_run import ACTIVE_RUN_STATUSES

from episode_pipeline.config.settings import DatabaseSettings, Settings, TranscodeSettings
from episode_pipeline.db.batches import batch_episodes
from episode_pipeline.db.connection import connect
from episode_pipeline.episodes.keys import EpisodeRef, InvalidEpisodeKey
from episode_pipeline.instance.app_state import published_limits
from episode_pipeline.instance.campaign_queue import limit_entries
from episode_pipeline.instance.run_tags import (
    BATCH_JOB_NAME,
    BATCH_RUN_TAG,
    ECS_CPU_TAG,
    ECS_MEMORY_TAG,
    EPISODE_LOCK_TAG_PREFIX,
    IN_FLIGHT_STATUSES,
    PARTITION_TAG,
    TRANSCODER_TAG,
    episode_lock_tags,
    episode_of_run,
    episode_tags,
    placement_tags,
)
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.transcode.placement import Placement, place, place_batch
from episode_pipeline.uploads.listing import newest_raw_archive

PLACEMENT_TAGS = (TRANSCODER_TAG, ECS_CPU_TAG, ECS_MEMORY_TAG)
log = logging.getLogger(__name__)


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


def is_placed(tags: Mapping[str, str]) -> bool:
    """Someone chose where this run transcodes or how big its task is: leave it so."""
    return any(tag in tags for tag in PLACEMENT_TAGS)


def placement_from_archive(archive_bytes: int | None, transcode: TranscodeSettings) -> Placement:
    """An unplaced run's placement: the uploads sensor's rule on its archive's size."""
    return place(archive_bytes, None, transcode)


def batch_queue_config(
    config: RunQueueConfig, batch_runs: Sequence[DagsterRun], children: Sequence[DagsterRun]
) -> RunQueueConfig:
    """The run queue's limits with the batch runs in flight (`batch_runs`) and the episode runs
    in progress inside them (`children`, started outside the queue):

    - A batch takes one slot. Its children, which carry the campaign's tags (the driver finds
      them by those), are not counted again: every limit they count against is raised by them
      (`max_concurrent_runs`, a limit on a tag key or on one value, such as the campaign lane and
      each campaign's governor). A per-unique-value limit is left: the batch run carries no
      `org`, so its child is its one count there, and a child is its episode's one run.
    - Each episode of a batch in flight has one run in progress at most: the batch or a run of
      that episode (an upload's, a backfill's), by their shared lock tag
      (`runs.EPISODE_LOCK_TAG_PREFIX`). Dagster's dequeue counts it like any tag, in progress and
      within one dequeue, so neither can start beside the other.
    """
    limits: list[dict[str, Any]] = []
    for entry in config.tag_concurrency_limits:
        key, value = entry["key"], entry.get("value")
        if isinstance(value, str):
            counted = sum(child.tags.get(key) == value for child in children)
        elif not value or not value.get("applyLimitPerUniqueValue"):
            counted = sum(key in child.tags for child in children)
        else:
            counted = 0
        limits.append({**entry, "limit": entry["limit"] + counted} if counted else dict(entry))
    held = {
        key for run in batch_runs for key in run.tags if key.startswith(EPISODE_LOCK_TAG_PREFIX)
    }
    limits += [{"key": key, "limit": 1} for key in sorted(held)]
    max_runs = config.max_concurrent_runs
    if max_runs != -1:  # -1: no limit
        max_runs += len(children)
    return config._replace(max_concurrent_runs=max_runs, tag_concurrency_limits=limits)


class EpisodeRunCoordinator(QueuedRunCoordinator):
    """`QueuedRunCoordinator` (same config) that tags and places each episode run before
    queueing it."""

    def submit_run(self, context: SubmitRunContext) -> DagsterRun:
        run = context.dagster_run
        if run.status == DagsterRunStatus.NOT_STARTED:
            batch_refs = self._batch_refs(run) if run.job_name == BATCH_JOB_NAME else None
            missing = {
                **missing_episode_tags(run.tags),
                **self._lock_tags(run, batch_refs),
                **self._placement_tags(run, batch_refs),
            }
            if missing:
                self._instance.add_run_tags(run.run_id, missing)
                tagged = run.with_tags({**run.tags, **missing})
                context = SubmitRunContext(tagged, context.workspace)
        return super().submit_run(context)

    def get_run_queue_config(self) -> RunQueueConfig:
        """`dagster.yaml`'s limits and each campaign's governor's (read on every dequeue)."""
        config = super().get_run_queue_config()
        limits = published_limits(self._instance) if self.has_instance else {}
        if limits == {}:
            return self._with_batches(config)
        return self._with_batches(
            config._replace(
                tag_concurrency_limits=[*config.tag_concurrency_limits, *limit_entries(limits)]
            )
        )

    def _with_batches(self, config: RunQueueConfig) -> RunQueueConfig:
        """The config with the batch runs in flight counted once and holding their episodes
        (`batch_queue_config`); one query when there is none."""
        if not self.has_instance:
            return config
        batches = self._instance.get_runs(
            RunsFilter(job_name=BATCH_JOB_NAME, statuses=IN_FLIGHT_STATUSES)
        )
        if not batches:
            return config
        active = [run.run_id for run in batches if run.status in ACTIVE_RUN_STATUSES]
        children = (
            self._instance.get_runs(
                RunsFilter(tags={BATCH_RUN_TAG: active}, statuses=ACTIVE_RUN_STATUSES)
            )
            if active
            else []
        )
        return batch_queue_config(config, batches, children)

    def _lock_tags(self, run: DagsterRun, batch_refs: list[EpisodeRef] | None) -> dict[str, str]:
        """The run's hold on its episode, or a batch run's on each of its episodes."""
        if run.job_name == BATCH_JOB_NAME:
            keys = [ref.partition_key for ref in batch_refs or ()]
        else:
            ref = episode_of_run(run)
            keys = [ref.partition_key] if ref else []
        return {key: value for key, value in episode_lock_tags(keys).items() if key not in run.tags}

    def _batch_refs(self, run: DagsterRun) -> list[EpisodeRef] | None:
        """A batch run's episodes (`episode_batches`); None, said in its event log, when they
        cannot be read (the batch's own op then fails on the same read)."""
        if self._sizing is None:
            return None
        batch_key = run.tags.get(PARTITION_TAG, "")
        try:
            with connect(self._sizing[2]) as conn:
                return batch_episodes(conn, batch_key)
        except psycopg.Error as error:
            self._instance.report_engine_event(
                f"Episodes of batch {batch_key!r} not read ({error}): the run queue neither "
                "sizes the run from them nor holds them",
                run,
            )
            return None

    def _placement_tags(
        self, run: DagsterRun, batch_refs: list[EpisodeRef] | None = None
    ) -> dict[str, str]:
        if is_placed(run.tags) or self._sizing is None:
            return {}
        if run.job_name == BATCH_JOB_NAME:
            return self._batch_placement_tags(run, batch_refs)
        ref = episode_of_run(run)
        if ref is None:
            return {}
        bucket, transcode, _database = self._sizing
        try:
            archive, _requests = newest_raw_archive(bucket, ref)
        except (BotoCoreError, ClientError) as error:
            self._not_sized(run, f"cannot list {bucket.uri(ref.prefix)} ({error})")
            return {}
        placement = placement_from_archive(archive.size if archive else None, transcode)
        return self._placed(
            run, f"its archive ({archive.key if archive else 'none found'})", placement
        )

    def _batch_placement_tags(
        self, run: DagsterRun, refs: list[EpisodeRef] | None
    ) -> dict[str, str]:
        """A batch run's task: sized by the largest archive of its episodes (one LIST each)."""
        assert self._sizing is not None
        bucket, transcode, _database = self._sizing
        batch_key = run.tags.get(PARTITION_TAG, "")
        if refs is None:
            return {}  # _batch_refs said why
        try:
            sizes = []
            for ref in refs:
                archive, _requests = newest_raw_archive(bucket, ref)
                sizes.append(archive.size if archive else None)
        except (BotoCoreError, ClientError) as error:
            self._not_sized(run, f"cannot read batch {batch_key!r}'s archives ({error})")
            return {}
        return self._placed(
            run, f"batch {batch_key} ({len(refs)} episode(s))", place_batch(sizes, transcode)
        )

    def _not_sized(self, run: DagsterRun, why: str) -> None:
        self._instance.report_engine_event(
            f"Not sized: {why}; the run task gets the launcher's default size", run
        )

    def _placed(self, run: DagsterRun, source: str, placement: Placement) -> dict[str, str]:
        tags = placement_tags(placement)
        self._instance.report_engine_event(
            f"Placed from {source}: {placement.reason}; tags "
            + ", ".join(f"{key}={value}" for key, value in sorted(tags.items())),
            run,
        )
        return tags

    @cached_property
    def _sizing(self) -> tuple[Bucket, TranscodeSettings, DatabaseSettings] | None:
        """The data bucket, the transcode settings and the database (a batch's episodes), from
        the process's environment (the daemon's and the webserver's are the code location's,
        infra/ecs.tf; `episode-pipeline dev` exports the local stack's). None, said once, when
        they are not there."""
        try:
            settings = Settings.from_env(os.environ)
        except (RuntimeError, ValueError) as error:
            log.warning(f"episode runs are not sized from their archives: {error}")
            return None
        bucket = Bucket(settings.bucket, settings.aws, settings.s3_deadlines)
        return bucket, settings.transcode, settings.database
