"""Dagster keeps the working set, not the history (docs/retention.md).

The application's tables and S3 are the record of what was processed; Dagster's run and event
storage only need the episodes still moving. `prune` deletes, in batched statements, everything
Dagster holds about an episode that has settled — no run in flight, no newer upload waiting, its
latest run ended longer ago than the window (`RetentionSettings`) — its runs, their tags, event
logs and check results, its archive observations and its dynamic partition. The partition comes
back when the episode is uploaded again or reprocessed (`episode-pipeline reprocess`). A
campaign's batch run is pruned by the same rule on its batch partition (`episode_batches`).

Exactly once survives it: before an upload's successful run is deleted, a one-row record of it
(an upload-done record, instance/app_state.py) is kept in Dagster's key-value table for
`upload_record_days`, longer than any message of the upload can live (4 days on the queue, 14 in
the dead-letter queue). The uploads sensor reads it when an upload has no run
(`app_state.pruned_successes`): a redelivery of a pruned upload is deleted, not run a second time.

`prune(instance, settings)` is the one entry point (the retention sensor and the benchmarks call
it); `prunable` is the rule, without I/O; the statements it runs are dagster_tables.py's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from dagster import DagsterInstance, DagsterRunStatus

from episode_pipeline.config.settings import RetentionSettings
from episode_pipeline.dagster_compat import BulkActionsFilter, BulkActionStatus
from episode_pipeline.instance.run_tags import CAMPAIGN_TAG
from episode_pipeline.orchestration import dagster_tables
from episode_pipeline.runtime import metrics

DAY_SECONDS = 24 * 3600
BATCH_EPISODES = 500  # episodes per group of statements: each statement stays well under 1 s
# A pass stops starting batches after this long: it runs inside a sensor tick (60 s deadline);
# a backlog is worked off over the next ticks.
PASS_SECONDS = 30.0


# -- the rule (pure) ----------------------------------------------------------------------------


@dataclass(frozen=True)
class EpisodeRuns:
    """What Dagster's run storage says about one episode partition."""

    partition: str
    in_flight: bool
    latest_status: str  # a DagsterRunStatus value
    last_ended: float  # epoch seconds: the newest end (or last update) among its runs
    latest_created: float  # epoch seconds: when its newest run was made
    newest_observation: float | None = None  # a raw-archive version reported (a re-upload)


def cutoffs(settings: RetentionSettings, now: float) -> tuple[float, float]:
    """(succeeded, failed): an episode whose latest run ended before its cutoff may go."""
    return (
        now - settings.episode_days * DAY_SECONDS,
        now - settings.failed_episode_days * DAY_SECONDS,
    )


# Why retention keeps an episode (`kept_because`). The first three are waits: what keeps it
# ends soon. The window is retention's own: the episode is pruned when it has passed.
IN_FLIGHT = "a run of it is in flight"
WAITING_UPLOAD = "a newer upload waits for its run"
IN_BACKFILL = "a requested backfill has still to run it"
WITHIN_WINDOW = "its latest run ended within the retention window"


def kept_because(episode: EpisodeRuns, settings: RetentionSettings, now: float) -> str | None:
    """Why the episode must stay (one of the reasons above), or None: it may be pruned."""
    if episode.in_flight:
        return IN_FLIGHT
    if episode.newest_observation is not None and (
        episode.newest_observation > episode.latest_created
    ):
        return WAITING_UPLOAD  # a newer upload was seen after its last run: its run is to come
    succeeded, failed = cutoffs(settings, now)
    cutoff = succeeded if episode.latest_status == DagsterRunStatus.SUCCESS.value else failed
    return None if episode.last_ended < cutoff else WITHIN_WINDOW


def prunable(episode: EpisodeRuns, settings: RetentionSettings, now: float) -> bool:
    return kept_because(episode, settings, now) is None


@dataclass
class PruneReport:
    """What one pass deleted: shown in the retention sensor's tick log and metadata."""

    episodes: int = 0
    runs: int = 0
    run_tags: int = 0
    event_logs: int = 0
    asset_event_tags: int = 0
    check_executions: int = 0
    partitions: int = 0
    upload_records_kept: int = 0
    upload_records_expired: int = 0
    live_partitions: int = 0  # episode partitions left after the pass (idx_dynamic_partitions)
    kept_waiting: int = 0  # candidates kept: a newer upload or a backfill waits to run them
    seconds: float = 0.0
    examples: list[str] = field(default_factory=list)  # a few of the episodes pruned

    def add(self, counts: Mapping[str, int]) -> None:
        for name, value in counts.items():
            setattr(self, name, getattr(self, name) + value)

    def as_metadata(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return (
            f"pruned {self.episodes} episode(s): {self.runs} run(s), {self.run_tags} run tag(s), "
            f"{self.event_logs} event log row(s), {self.check_executions} check result(s), "
            f"{self.partitions} partition(s); kept {self.upload_records_kept} upload record(s), "
            f"expired {self.upload_records_expired}; {self.kept_waiting} kept for a waiting "
            f"upload; {self.live_partitions} live partition(s); {self.seconds:.1f} s"
        )


# -- I/O: Dagster's run and event storage (the statements: dagster_tables.py) ------------------


def candidate_episodes(
    conn: Any, settings: RetentionSettings, now: float, limit: int
) -> list[EpisodeRuns]:
    """The oldest settled episodes past their window, with their newest archive observation."""
    succeeded, failed = cutoffs(settings, now)
    rows = dagster_tables.settled_partitions(conn, succeeded, failed, limit)
    if not rows:
        return []
    observed = dagster_tables.newest_observations(conn, [row[0] for row in rows])
    return [
        EpisodeRuns(
            partition=partition,
            in_flight=False,
            latest_status=status,
            last_ended=float(ended),
            latest_created=float(created),
            newest_observation=float(observed[partition]) if partition in observed else None,
        )
        for partition, status, ended, created in rows
    ]


def partitions_of_active_backfills(
    instance: DagsterInstance, except_campaign: str | None = None
) -> set[str]:
    """Episodes a requested backfill has still to run (`reprocess`, a campaign's wave): kept,
    whatever their age. `except_campaign`: that campaign's own waves do not count (its ledger
    says which of their episodes have ended)."""
    backfills = instance.get_backfills(
        filters=BulkActionsFilter(statuses=[BulkActionStatus.REQUESTED])
    )
    return {
        key
        for backfill in backfills
        if except_campaign is None or backfill.tags.get(CAMPAIGN_TAG) != except_campaign
        for key in backfill.partition_names or ()
    }


def prune(
    instance: DagsterInstance,
    settings: RetentionSettings | None = None,
    now: float | None = None,
    log: Any = None,
) -> PruneReport:
    """One pass: up to `settings.episodes_per_tick` settled episodes, oldest first."""
    settings = settings or RetentionSettings()
    now = time.time() if now is None else now
    started = time.monotonic()
    report = PruneReport()
    busy = partitions_of_active_backfills(instance)
    with dagster_tables.connect(instance) as conn:
        remaining = settings.episodes_per_tick
        while remaining > 0:
            batch = candidate_episodes(conn, settings, now, min(BATCH_EPISODES, remaining))
            chosen = [
                e.partition for e in batch if prunable(e, settings, now) and e.partition not in busy
            ]
            report.kept_waiting += len(batch) - len(chosen)
            if chosen:
                report.add(dagster_tables.delete_episodes(conn, chosen))
                report.episodes += len(chosen)
                report.examples.extend(chosen[: max(0, 5 - len(report.examples))])
                if log is not None:
                    log.info(f"pruned {len(chosen)} episode(s): {', '.join(chosen[:20])}")
            remaining -= len(batch)
            out_of_time = time.monotonic() - started > PASS_SECONDS
            if len(batch) < BATCH_EPISODES or not chosen or out_of_time:
                break
        record_cutoff = now - settings.upload_record_days * DAY_SECONDS
        report.upload_records_expired = dagster_tables.expire_upload_records(conn, record_cutoff)
        dagster_tables.expire_dead_letter_reasons(conn, record_cutoff)
        report.live_partitions = dagster_tables.live_episode_partitions(conn)
    report.seconds = time.monotonic() - started
    metrics.count(metrics.EPISODES_PRUNED, report.episodes)
    metrics.gauge(metrics.LIVE_PARTITIONS, report.live_partitions)
    return report


# -- a campaign's partitions: the same rule, the campaign's own runs settled ---------------------

LONG_AGO = float("-inf")  # a campaign's own run, or none: past every window


def campaign_episodes(conn: Any, campaign_id: str, partitions: Sequence[str]) -> list[EpisodeRuns]:
    """The partitions as retention's rule reads them, the campaign's own runs counted as ended
    long ago: they settled its ledger row, and it prunes them at once (its live budget), not a
    window later. Every other run — an upload's, a `reprocess`'s, another campaign's — keeps
    its window."""
    runs = dagster_tables.campaign_partition_runs(conn, campaign_id, partitions)
    observed = dagster_tables.newest_observations(conn, list(partitions))
    episodes = []
    for partition in partitions:
        in_flight, status, ended, created = runs.get(partition, (False, None, None, None))
        episodes.append(
            EpisodeRuns(
                partition=partition,
                in_flight=in_flight,
                latest_status=status or DagsterRunStatus.SUCCESS.value,
                last_ended=LONG_AGO if ended is None else float(ended),
                latest_created=LONG_AGO if created is None else float(created),
                newest_observation=float(observed[partition]) if partition in observed else None,
            )
        )
    return episodes


@dataclass
class CampaignPrune:
    """What a campaign's prune did with its candidate partitions."""

    deleted: list[str] = field(default_factory=list)
    # Kept for another run's window: retention prunes them (the campaign's runs with them).
    retained: list[str] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)  # kept for now: partition → why
    counts: dict[str, int] = field(default_factory=dict)  # delete_episodes' rows by kind


def prune_campaign_partitions(
    instance: DagsterInstance,
    campaign_id: str,
    partitions: Sequence[str],
    settings: RetentionSettings | None = None,
    now: float | None = None,
) -> CampaignPrune:
    """Delete what Dagster holds of partitions the campaign added whose runs ended, by
    retention's rule (`kept_because` over `campaign_episodes`): never a run in flight, an
    upload waiting for its run, an episode another backfill has still to run, nor another
    run's history within its window (those are `retained`: retention's from now on)."""
    settings = settings or RetentionSettings()
    now = time.time() if now is None else now
    result = CampaignPrune()
    if not partitions:
        return result
    busy = partitions_of_active_backfills(instance, except_campaign=campaign_id)
    with dagster_tables.connect(instance) as conn:
        for episode in campaign_episodes(conn, campaign_id, partitions):
            reason = kept_because(episode, settings, now)
            if reason in (None, WITHIN_WINDOW) and episode.partition in busy:
                reason = IN_BACKFILL
            if reason is None:
                result.deleted.append(episode.partition)
            elif reason == WITHIN_WINDOW:
                result.retained.append(episode.partition)
            else:
                result.waiting[episode.partition] = reason
        if result.deleted:
            result.counts = dagster_tables.delete_episodes(conn, result.deleted)
    return result
