"""The campaign driver's work, one tick (docs/operations.md#reprocess-the-fleet).

Per campaign: (1) reconcile the finished runs of its waves into the ledger and feed the governor;
(2) repair a wave whose backfill a crash left unrecorded, release claims whose run never came;
(3) prune the partitions the campaign added once their run ended, by retention's rules; (4) judge
the canary wave; (5) claim the next wave and hand it to the run queue as one backfill titled
`<campaign> · wave N`. Every step is idempotent: a tick killed at any point is finished by the
next one — the ledger is committed before the backfill, whose id is derived from
(campaign, wave), and runs are matched to episodes by their campaign and wave tags.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    RunRecord,
    RunsFilter,
)

from episode_pipeline.campaign import canary, ledger, progress
from episode_pipeline.campaign.config import CampaignConfig
from episode_pipeline.campaign.governor import GovernorState, Observation, observe
from episode_pipeline.campaign.waves import measured_rate, next_wave_size, runs_to_keep_in_flight
from episode_pipeline.config.settings import RetentionSettings
from episode_pipeline.dagster_compat import (
    AUTO_RETRY_RUN_ID_TAG,
    BULK_ACTION_TERMINAL_STATUSES,
    PARENT_RUN_ID_TAG,
    PRIORITY_TAG,
    WILL_RETRY_TAG,
    BulkActionStatus,
)
from episode_pipeline.db import campaigns as db
from episode_pipeline.db.batches import create_batch
from episode_pipeline.defs.partitions import BATCHES_PARTITION_NAME, EPISODES_PARTITION_NAME
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.instance.app_state import publish_limits, registered
from episode_pipeline.instance.run_tags import (
    BATCH_JOB_NAME,
    CAMPAIGN_TAG,
    CAMPAIGN_WAVE_TAG,
    EPISODE_JOB_NAME,
    IN_FLIGHT_STATUSES,
    PARTITION_TAG,
    assets_tags,
)
from episode_pipeline.orchestration.backfills import record_backfill
from episode_pipeline.orchestration.failures import fail_episode_of_run, failure_cause
from episode_pipeline.orchestration.retention import prune_campaign_partitions
from episode_pipeline.orchestration.run_errors import run_error
from episode_pipeline.orchestration.runs import add_partitions, missing_partitions
from episode_pipeline.runtime.failure_causes import (
    BACKPRESSURE,
    BAD_ARCHIVE,
    classify_error,
    retry_after_seconds,
)
from episode_pipeline.runtime.injection_points import reach

# Below the uploads' (Dagster's default 0): a fresh upload's run is dequeued first.
CAMPAIGN_PRIORITY = "-10"
AFTER_CLAIM = "campaign.after_claim"  # injection point: the wave committed, no backfill yet
# Injection point: a stale wave's backfill canceled, its claims not yet released.
AFTER_STALE_CANCEL = "campaign.after_stale_cancel"
PRUNE_PER_TICK = 2_000
# A claim's way to the run queue beyond the driver's own tick: the backfill daemon's iteration
# (Dagster's 30 s) and a dequeue (dagster.yaml's 5 s). The runs queued cover it (waves.py).
BACKFILL_LEAD_SECONDS = 35.0
DEFAULT_TICK_SECONDS = 30.0
NOT_LAUNCHED = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED]
CANARY_WAVE = 0
log = logging.getLogger(__name__)
# How long a failed run tagged `dagster/will_retry=true` with no retry yet counts as in flight.
# run_retries decides within an iteration of the daemon's event log consumer (5 s) and tags the
# failed run with its retry's id; it never clears the tag when it does not retry (its backfill
# ended, the job is gone, the retry failed to launch): past this the failure settles the episode.
# Ten minutes cover a daemon restart.
RETRY_DECISION_SECONDS = 600.0
# run_retries never retries a run whose backfill has ended, yet leaves the run's `will_retry`
# tag (a launch failure's tag is only added when its consumer reads the failure, after the
# backfill may have completed). Once the wave's backfill has been over this long, a failure
# with no retry decides: the consumer's decision and the retry's launch are one iteration.
RETRY_AFTER_BACKFILL_SECONDS = 15.0


def wave_backfill_id(campaign_id: str, wave: int) -> str:
    """The wave's backfill id, the same on every tick: a repeated tick finds it."""
    return "c" + hashlib.sha256(f"{campaign_id}.w{wave}".encode()).hexdigest()[:11]


def wave_title(name: str, wave: int) -> str:
    return f"{name} · wave {wave}" + (" (canary)" if wave == CANARY_WAVE else "")


def campaign_tags(campaign_id: str, wave: int) -> dict[str, str]:
    return {
        CAMPAIGN_TAG: campaign_id,
        CAMPAIGN_WAVE_TAG: str(wave),
        PRIORITY_TAG: CAMPAIGN_PRIORITY,
    }


@dataclass
class TickReport:
    """What one tick did to one campaign: the sensor's log line and metadata."""

    campaign: str
    state: str = ""
    reconciled: dict[str, int] = field(default_factory=dict)
    released: int = 0
    repaired_waves: list[int] = field(default_factory=list)
    pruned: int = 0
    claimed: int = 0
    wave: int | None = None
    limit: int = 0
    launch_limit: int = 0  # what the run queue may launch now (0: paused, stopped, canceled)
    counts: dict[str, int] = field(default_factory=dict)
    decisions: list[str] = field(default_factory=list)
    error: str = ""  # the tick failed for this campaign (the others were driven)
    live_budget_full: bool = False  # no wave: the campaign's live partitions fill its budget
    stalled: str | None = None  # the stall's cause (campaign/progress.py), None: progressing

    def describe(self) -> str:
        if self.error:
            return f"campaign {self.campaign} ({self.state}): tick failed, held: {self.error}"
        done = self.counts.get(ledger.SUCCEEDED, 0)
        total = sum(self.counts.values())
        parts = [f"campaign {self.campaign} ({self.state}): {done}/{total} succeeded"]
        if self.reconciled:
            parts.append("reconciled " + ", ".join(f"{n} {s}" for s, n in self.reconciled.items()))
        if self.claimed:
            parts.append(f"wave {self.wave}: {self.claimed} episode(s)")
        if self.repaired_waves:
            parts.append(f"repaired wave(s) {self.repaired_waves}")
        if self.released:
            parts.append(f"released {self.released} stale claim(s)")
        if self.pruned:
            parts.append(f"pruned {self.pruned} partition(s)")
        parts.append(f"concurrency {self.limit}")
        if self.stalled:
            parts.append(f"STALLED ({self.stalled}): campaign status names the cause")
        return "; ".join(parts + self.decisions)


def _runs_by_episode(
    instance: DagsterInstance, campaign_id: str, waves: Iterable[int]
) -> dict[tuple[str, int], list[RunRecord]]:
    """The campaign's runs of `waves` by (partition, wave). A run's wave tag is looked up among
    the tags the waves are written as, never parsed: a tag no wave wrote (a run tagged by hand)
    is no run of these waves and cannot fail the tick (issue 27's rule)."""
    wave_of_tag = {str(wave): wave for wave in waves}
    if not wave_of_tag:
        return {}
    records = instance.get_run_records(
        RunsFilter(tags={CAMPAIGN_TAG: campaign_id, CAMPAIGN_WAVE_TAG: sorted(wave_of_tag)})
    )
    found: dict[tuple[str, int], list[RunRecord]] = defaultdict(list)
    for record in records:  # newest first
        run = record.dagster_run
        partition = run.tags.get(PARTITION_TAG)
        wave = wave_of_tag.get(run.tags.get(CAMPAIGN_WAVE_TAG, ""))
        if partition and wave is not None:
            found[(partition, wave)].append(record)
    return found


def _settled_run(
    records: list[RunRecord], now: datetime, backfill_ended: float | None = None
) -> DagsterRun | None:
    """The run that decides the episode, or None while one may still do work. Read from the run
    lineage: a run whose retry exists (run_retries tags the retry with its parent's id and the
    parent with the retry's) is superseded by it; a failure run_retries said it will retry, with
    no retry yet, is in flight for `RETRY_DECISION_SECONDS` after it ended, then settled — or
    `RETRY_AFTER_BACKFILL_SECONDS` after its wave's backfill ended (`backfill_ended`, a
    timestamp), since run_retries retries no run of an ended backfill."""
    retry_ruled_out = (
        backfill_ended is not None
        and now.timestamp() - backfill_ended >= RETRY_AFTER_BACKFILL_SECONDS
    )
    retried = {record.dagster_run.tags.get(PARENT_RUN_ID_TAG) for record in records}
    current = [
        record
        for record in records
        if record.dagster_run.run_id not in retried
        and AUTO_RETRY_RUN_ID_TAG not in record.dagster_run.tags
    ]
    # A success decides at once: a batch child abandoned by its killed batch run stays tagged
    # `will_retry` with no retry of its own, while the batch's retry ran the episode again (the
    # soak waited RETRY_DECISION_SECONDS for nothing).
    succeeded = [r.dagster_run for r in current if r.dagster_run.status == DagsterRunStatus.SUCCESS]
    if succeeded:
        return succeeded[0]
    for record in current:
        run = record.dagster_run
        if run.status in IN_FLIGHT_STATUSES:
            return None
        if (
            run.status == DagsterRunStatus.FAILURE
            and run.tags.get(WILL_RETRY_TAG) == "true"
            and not retry_ruled_out
        ):
            ended = record.end_time or record.update_timestamp.timestamp()
            if now.timestamp() - ended < RETRY_DECISION_SECONDS:
                return None  # run_retries will make another
    # Every run superseded and none left (a retry deleted): the newest decides.
    runs = [record.dagster_run for record in current or records]
    succeeded = [run for run in runs if run.status == DagsterRunStatus.SUCCESS]
    return succeeded[0] if succeeded else (runs[0] if runs else None)


def ended_wave_backfills(
    instance: DagsterInstance, campaign_id: str, waves: Iterable[int]
) -> dict[int, float]:
    """When each of these waves' backfills ended, for those that have (one read per wave with
    runs in flight: a handful)."""
    ended = {}
    for wave in waves:
        backfill = instance.get_backfill(wave_backfill_id(campaign_id, wave))
        if (
            backfill is not None
            and backfill.status in BULK_ACTION_TERMINAL_STATUSES
            and backfill.backfill_end_timestamp is not None
        ):
            ended[wave] = backfill.backfill_end_timestamp
    return ended


def cancel_wave_backfill(instance: DagsterInstance, campaign_id: str, wave: int) -> bool:
    """Cancel the wave's backfill if it is still requested (Dagster's backfill cancel: its daemon
    cancels the queued runs, terminates the started ones, then marks it CANCELED)."""
    backfill = instance.get_backfill(wave_backfill_id(campaign_id, wave))
    if backfill is None or backfill.status != BulkActionStatus.REQUESTED:
        return False
    instance.update_backfill(backfill.with_status(BulkActionStatus.CANCELING))
    return True


def stop_canceled_runs(instance: DagsterInstance, campaign_id: str) -> list[str]:
    """A canceled campaign's runs that could still run its episodes, stopped. A failure
    run_retries said it will retry, its retry not made yet, is told not to be (the tag
    run_retries reads, set as run_retries sets it when it decides against a retry): the ledger
    settles it now. A run still queued or not started (a retry run_retries made after its
    wave's backfill cancel had ended, which nothing else cancels) is canceled as the run queue
    cancels a queued run; the ledger reconciles it. The campaign's limit is 0 meanwhile."""
    awaiting = [
        run.run_id
        for run in instance.get_runs(
            RunsFilter(
                tags={CAMPAIGN_TAG: campaign_id, WILL_RETRY_TAG: "true"},
                statuses=[DagsterRunStatus.FAILURE],
            )
        )
        if AUTO_RETRY_RUN_ID_TAG not in run.tags
    ]
    for run_id in awaiting:
        instance.add_run_tags(run_id, {WILL_RETRY_TAG: "false"})
    queued = instance.get_runs(RunsFilter(tags={CAMPAIGN_TAG: campaign_id}, statuses=NOT_LAUNCHED))
    for run in queued:
        instance.report_run_canceled(run, message=f"campaign {campaign_id} was canceled")
    decisions = []
    if awaiting:
        decisions.append(f"canceled: no retry of {len(awaiting)} failed run(s) (run_retries)")
    if queued:
        decisions.append(f"canceled: {len(queued)} queued run(s) canceled")
    return decisions


def has_unfinished_runs(instance: DagsterInstance, campaign_id: str) -> bool:
    filters = RunsFilter(tags={CAMPAIGN_TAG: campaign_id}, statuses=IN_FLIGHT_STATUSES)
    return bool(instance.get_run_ids(filters, limit=1))


def drive(
    instance: DagsterInstance,
    postgres: PostgresResource,
    now: datetime | None = None,
    rng: random.Random | None = None,
    tick_seconds: float = DEFAULT_TICK_SECONDS,
    retention: RetentionSettings | None = None,
) -> list[TickReport]:
    """One tick over every campaign not finished (running ones also claim), then the launch
    limits published for the run queue (instance/campaign_queue.py). `retention`: the code
    location's (the sensor's settings), by whose rules the campaigns' partitions are pruned."""
    now = now or datetime.now(UTC)
    rng = rng or random.Random()
    retention = retention or RetentionSettings()
    with postgres.transaction() as conn:
        active = db.campaigns_in(
            conn, (ledger.RUNNING, ledger.PAUSED, ledger.STOPPED, ledger.CANCELED)
        )
    ours = registered(instance, [campaign.id for campaign in active])
    lead_seconds = 2 * tick_seconds + BACKFILL_LEAD_SECONDS
    reports = []
    limits: dict[str, int] = {}
    for campaign in (c for c in active if c.id in ours):
        if campaign.state in (ledger.STOPPED, ledger.CANCELED):
            # A canceled one's run unfinished (a retry made after its claims settled): to cancel.
            unfinished = campaign.state == ledger.CANCELED and has_unfinished_runs(
                instance, campaign.id
            )
            with postgres.transaction() as conn:
                idle = ledger.is_settled_out(
                    campaign.state,
                    db.has_requested(conn, campaign.id),
                    bool(db.settled_added_partitions(conn, campaign.id, 1)),
                    unfinished,
                )
            quiet = (now - campaign.updated_at).total_seconds()
            if idle:
                if ledger.holds_launches_at_zero(campaign.state, quiet, RETRY_DECISION_SECONDS):
                    limits[campaign.id] = 0  # nothing of it may launch
                continue
        try:
            report = drive_campaign(
                instance, postgres, campaign.id, now, rng, lead_seconds, retention
            )
        except Exception as error:  # one campaign's failure stops neither the others nor the limits
            log.exception(f"campaign {campaign.id}: tick failed")
            failed = f"{type(error).__name__}: {error}"[:1000]
            report = TickReport(campaign.id, state=campaign.state, error=failed)  # limit 0
        reports.append(report)
        limits[report.campaign] = report.launch_limit
    # An operator's cancel during the tick (after its campaign was driven) holds it at 0 now,
    # not at the next tick: the states are read again, and the rows read as running stay locked
    # until the limits are published, so a cancel committed later waits and writes its 0 last.
    with postgres.transaction() as conn:
        running = db.lock_running(conn, limits)
        publish_limits(instance, {key: n if key in running else 0 for key, n in limits.items()})
    return reports


def drive_campaign(
    instance: DagsterInstance,
    postgres: PostgresResource,
    campaign_id: str,
    now: datetime,
    rng: random.Random,
    lead_seconds: float = 2 * DEFAULT_TICK_SECONDS + BACKFILL_LEAD_SECONDS,
    retention: RetentionSettings | None = None,
) -> TickReport:
    """One tick of one campaign, then whether it is making progress (`note_progress`)."""
    retention = retention or RetentionSettings()
    report = _drive_campaign(instance, postgres, campaign_id, now, rng, lead_seconds, retention)
    note_progress(postgres, report, now)
    return report


def fails_every_run(instance: DagsterInstance, run: DagsterRun) -> bool:
    """A run of the episode job that failed on its archive (`BAD_ARCHIVE`): every run
    of that archive fails the same way, so the ledger rejects it at once, its cause named. A
    fixed archive comes back as an upload, by the upload path."""
    return run.job_name == EPISODE_JOB_NAME and failure_cause(instance, run.run_id) == BAD_ARCHIVE


def failures_awaiting_retry(records: list[RunRecord], since: datetime | None) -> list[DagsterRun]:
    """Runs that failed since the last tick and that run_retries says it will retry: the episode
    is not settled yet, but a launch refused by ECS (throttled, no capacity) must reach the
    governor now, not after Dagster's retries (each relaunched into the same throttle)."""
    return [
        record.dagster_run
        for record in records
        if record.dagster_run.status == DagsterRunStatus.FAILURE
        and record.dagster_run.tags.get(WILL_RETRY_TAG) == "true"
        and (since is None or (record.end_time or 0.0) > since.timestamp())
    ]


def _drive_campaign(
    instance: DagsterInstance,
    postgres: PostgresResource,
    campaign_id: str,
    now: datetime,
    rng: random.Random,
    lead_seconds: float,
    retention: RetentionSettings,
) -> TickReport:
    """One campaign's tick, the steps the module's docstring lists, in order."""
    report = TickReport(campaign_id)
    tick = _reconcile(instance, postgres, campaign_id, now, rng, report)  # (1)
    if tick.campaign.state == ledger.CANCELED:
        _stop_canceled(instance, postgres, campaign_id, tick.requested, report)
    _repair_waves(instance, postgres, tick, now, rng, report)  # (2)
    # (3) The run-failure sensor marks a failed run's episode `failed`; the prune deletes a
    # settled episode's runs, often in this tick, before that sensor read them (the soak left
    # a rejected episode `processing`). The same policy first, for an episode still unmarked.
    for run in tick.failed_runs:
        fail_episode_of_run(instance, run, postgres, still_processing=True)
    report.pruned = prune_settled(instance, postgres, campaign_id, retention)
    claimed = _judge_and_claim(postgres, campaign_id, tick, now, lead_seconds, report)  # (4), (5)
    if claimed is None:
        return report
    campaign, wave, rows = claimed
    report.claimed, report.wave = len(rows), wave
    reach(AFTER_CLAIM, about=f"{campaign_id}.w{wave}")
    launch_wave(instance, postgres, campaign, wave, rows)
    return report


@dataclass
class _Reconciled:
    """What step (1) read and settled, for the steps after it."""

    campaign: db.Campaign
    config: CampaignConfig
    governor: GovernorState
    requested: list[db.LedgerRow]
    runs: dict[tuple[str, int], list[RunRecord]]
    repair: dict[int, list[db.LedgerRow]]
    failed_runs: list[DagsterRun]  # the episodes' own runs that ended without success


def _reconcile(
    instance: DagsterInstance,
    postgres: PostgresResource,
    campaign_id: str,
    now: datetime,
    rng: random.Random,
    report: TickReport,
) -> _Reconciled:
    """(1) The finished runs of the campaign's waves into the ledger, the governor fed; the rows
    whose run never came, for (2). One transaction, under the campaign's lock."""
    repair: dict[int, list[db.LedgerRow]] = defaultdict(list)
    with postgres.transaction() as conn:
        campaign = db.lock_campaign(conn, campaign_id)
        assert campaign is not None
        config = CampaignConfig.from_json(campaign.settings)
        governor = GovernorState.from_json(campaign.governor)
        requested = db.requested_rows(conn, campaign_id)
        runs = _runs_by_episode(
            instance, campaign_id, {row.wave for row in requested if row.wave is not None}
        )
        backfills_ended = ended_wave_backfills(instance, campaign_id, {wave for _, wave in runs})
        recorded = db.recorded_since_claim(conn, campaign_id, campaign.target_code_version)
        observations = []
        failed_runs: list[DagsterRun] = []
        for row in requested:
            assert row.wave is not None
            episode_runs = runs.get((row.ref.partition_key, row.wave), [])
            batch_runs = runs.get((row.batch_key or "", row.wave), [])
            if not episode_runs and not batch_runs and row.ref in recorded:
                # Its run succeeded and is gone from Dagster (retention pruned the settled
                # episode before this tick): the durable record decides, never a second run.
                transition = ledger.after_outcome(
                    row.attempts, ledger.Outcome(succeeded=True), now, config.retry, rng
                )
                db.apply_outcome(conn, campaign_id, row.ref, transition, recorded[row.ref])
                observations.append(Observation(succeeded=True))
                report.reconciled[transition.state] = report.reconciled.get(transition.state, 0) + 1
                continue
            if not episode_runs and not batch_runs:
                repair[row.wave].append(row)
                continue
            # K > 1 and no run of the episode yet: its batch run has not reached it (wait), or
            # ended before it (a failure of the episode's).
            run = _settled_run(episode_runs or batch_runs, now, backfills_ended.get(row.wave))
            if run is None:
                for retrying in failures_awaiting_retry(episode_runs, governor.measured_at):
                    error = run_error(instance, retrying)
                    if (error_class := classify_error(error)) in BACKPRESSURE:
                        observations.append(
                            Observation(False, error_class, retry_after_seconds(error))
                        )
                continue
            if run.status == DagsterRunStatus.SUCCESS and episode_runs:
                outcome = ledger.Outcome(succeeded=True)
                observations.append(Observation(succeeded=True))
            else:
                error = run_error(instance, run)
                if not episode_runs:
                    error = f"its batch run {run.run_id} ended before it ran: {error}"
                error_class = classify_error(error)
                outcome = ledger.Outcome(
                    False, error, error_class, retryable=not fails_every_run(instance, run)
                )
                if episode_runs:
                    failed_runs.append(run)
                observations.append(Observation(False, error_class, retry_after_seconds(error)))
            transition = ledger.after_outcome(row.attempts, outcome, now, config.retry, rng)
            db.apply_outcome(conn, campaign_id, row.ref, transition, run.run_id)
            report.reconciled[transition.state] = report.reconciled.get(transition.state, 0) + 1
        governor, decisions = observe(governor, observations, config.governor, now)
        settled = sum(report.reconciled.values())
        governor = dataclasses.replace(
            governor,
            episodes_per_second=measured_rate(
                governor.episodes_per_second, governor.measured_at, settled, now
            ),
            measured_at=now,
        )
        for decision in decisions:
            db.log_decision(conn, campaign_id, "governor", decision.message, decision.details())
            report.decisions.append(decision.message)
        db.update_campaign(conn, campaign_id, governor=governor.to_json())

    return _Reconciled(campaign, config, governor, requested, runs, repair, failed_runs)


def _stop_canceled(
    instance: DagsterInstance,
    postgres: PostgresResource,
    campaign_id: str,
    requested: list[db.LedgerRow],
    report: TickReport,
) -> None:
    # `campaign cancel` cancels the backfills recorded when it ran; a wave recorded by a tick
    # racing it (claimed before the cancel, recorded after) is canceled here, so its runs
    # never wait at limit 0 forever: they end CANCELED and are reconciled.
    for wave in sorted({row.wave for row in requested if row.wave is not None}):
        if cancel_wave_backfill(instance, campaign_id, wave):
            message = f"canceled wave {wave}'s backfill, recorded after the campaign's cancel"
            with postgres.transaction() as conn:
                db.log_decision(conn, campaign_id, "ledger", message)
            report.decisions.append(message)
    stopped = stop_canceled_runs(instance, campaign_id)
    if stopped:
        with postgres.transaction() as conn:
            for message in stopped:
                db.log_decision(conn, campaign_id, "ledger", message)
        report.decisions.extend(stopped)


def _repair_waves(
    instance: DagsterInstance,
    postgres: PostgresResource,
    tick: _Reconciled,
    now: datetime,
    rng: random.Random,
    report: TickReport,
) -> None:
    campaign, config, runs, campaign_id = tick.campaign, tick.config, tick.runs, tick.campaign.id
    # (2) A wave whose rows have no run: its backfill missing (a crash after the claim) is
    # recorded now; once its backfill has ended without their run they are released (an
    # attempt each). A stale claim's backfill still requested is canceled first, and its rows
    # released once the cancel has ended it: it never submits runs beside a later wave's.
    in_flight_waves = {
        wave
        for (_, wave), records in runs.items()
        if any(record.dagster_run.status in IN_FLIGHT_STATUSES for record in records)
    }
    for wave, rows in sorted(tick.repair.items()):
        backfill = instance.get_backfill(wave_backfill_id(campaign_id, wave))
        if backfill is None and campaign.state == ledger.RUNNING:
            launch_wave(instance, postgres, campaign, wave, rows)
            report.repaired_waves.append(wave)
            continue
        if backfill is not None and backfill.status not in BULK_ACTION_TERMINAL_STATUSES:
            stale_before = now - timedelta(seconds=config.stale_claim_seconds)
            if (
                backfill.status == BulkActionStatus.REQUESTED
                and wave not in in_flight_waves  # a backfill with runs under way is alive
                and any(row.updated_at < stale_before for row in rows)
                and cancel_wave_backfill(instance, campaign_id, wave)
            ):
                reach(AFTER_STALE_CANCEL, about=f"{campaign_id}.w{wave}")
                with postgres.transaction() as conn:
                    message = (
                        f"canceled wave {wave}'s backfill: no run of {len(rows)} claim(s) after"
                        f" {config.stale_claim_seconds:.0f} s; released once it has ended"
                    )
                    db.log_decision(conn, campaign_id, "ledger", message)
                report.decisions.append(message)
            continue  # requested, canceling or failing: it may still submit their runs
        # Ended (or never recorded: paused, stopped or canceled before it was). The backfill may
        # have made their runs, and ended, since this tick read the runs: read them again now
        # that its status is known, so a row with a run stays claimed.
        made = _runs_by_episode(instance, campaign_id, [wave])
        stale = [
            row
            for row in rows
            if not made.get((row.ref.partition_key, wave))
            and not made.get((row.batch_key or "", wave))
        ]
        if not stale:
            continue
        # Never handed to the run queue is no attempt; a backfill that ended without the run is.
        cause = (
            f"wave {wave}'s backfill {backfill.backfill_id} ended {backfill.status.value}"
            if backfill is not None
            else None
        )
        released = [
            (row.ref, ledger.after_release(row.attempts, cause, now, config.retry, rng))
            for row in stale
        ]
        rejected = sum(transition.state == ledger.REJECTED for _, transition in released)
        with postgres.transaction() as conn:
            report.released += db.release(conn, campaign_id, released)
            db.log_decision(
                conn,
                campaign_id,
                "ledger",
                f"released {len(stale)} claim(s) of wave {wave}: no run came "
                f"(backfill {backfill.status.value if backfill else 'never recorded'})"
                + (f"; {rejected} rejected, out of attempts" if rejected else ""),
            )


def _judge_and_claim(
    postgres: PostgresResource,
    campaign_id: str,
    tick: _Reconciled,
    now: datetime,
    lead_seconds: float,
    report: TickReport,
) -> tuple[db.Campaign, int, list[db.LedgerRow]] | None:
    """(4) Judge the canary, (5) claim the next wave: the campaign, the wave and its rows, or
    None when no wave is claimed (done, canceled, stopped, paused, waiting, no room)."""
    config, governor = tick.config, tick.governor
    with postgres.transaction() as conn:
        campaign = db.lock_campaign(conn, campaign_id)
        assert campaign is not None
        counts = db.fold_counts(conn, campaign_id)  # under the lock: folds the counters
        report.counts, report.state, report.limit = counts, campaign.state, governor.limit
        if campaign.state == ledger.RUNNING and not governor.is_paused(now):
            report.launch_limit = governor.limit
        if campaign.state == ledger.CANCELED:
            return None
        if ledger.is_finished(counts):
            if campaign.state == ledger.RUNNING:
                db.update_campaign(conn, campaign_id, state=ledger.DONE)
                db.log_decision(conn, campaign_id, "state", f"done: {counts}")
                report.state = ledger.DONE
            return None
        if campaign.state != ledger.RUNNING:
            return None
        verdict, canary_size = judge_canary(conn, campaign, config, sum(counts.values()))
        if verdict == "stopped":
            report.state, report.launch_limit = ledger.STOPPED, 0
            report.decisions.append("canary stopped the campaign")
            return None
        if governor.is_paused(now):
            return None
        in_flight = db.requested_rows(conn, campaign_id)
        runs_in_flight = len({row.batch_key for row in in_flight})
        claimable = db.claimable_count(conn, campaign_id, now, config.waves.wave_size)
        per_run = config.waves.episodes_per_run
        live = db.live_added_partitions(conn, campaign_id) + len(in_flight)
        report.live_budget_full = claimable > 0 and live >= config.waves.max_live_partitions
        size = next_wave_size(
            settings=config.waves,
            limit=governor.limit,
            runs_budget=runs_to_keep_in_flight(
                governor.limit, governor.episodes_per_second / per_run, lead_seconds
            ),
            runs_in_flight=runs_in_flight,
            campaign_live_partitions=live,
            claimable=claimable,
            canary_size=canary_size,
        )
        if verdict == "waiting":
            size = 0
        if size <= 0:
            return None
        wave = campaign.next_wave
        claimed = db.claim_wave(conn, campaign_id, wave, size, config.waves.episodes_per_run, now)
        if config.waves.episodes_per_run > 1:
            create_batches(conn, claimed)
        db.update_campaign(conn, campaign_id, next_wave=wave + 1)
        db.log_decision(
            conn,
            campaign_id,
            "wave",
            f"wave {wave}: {len(claimed)} episode(s) at concurrency {governor.limit}",
            {
                "wave": wave,
                "episodes": len(claimed),
                "backfill": wave_backfill_id(campaign_id, wave),
            },
        )
    return campaign, wave, claimed


def launch_wave(
    instance: DagsterInstance,
    postgres: PostgresResource,
    campaign: db.Campaign,
    wave: int,
    rows: list[db.LedgerRow],
) -> str:
    """Remember the wave's missing partitions as the campaign's (to prune) and, at K = 1, add
    them; then record its backfill under the wave's id, of the campaign's asset selection
    (`wave_assets`: every asset for a wave of whole-graph episodes), in runs of K episodes.

    At K > 1 the batch run adds its episodes' partitions when it starts (`batches.run_batch`),
    so Dagster holds the running batches' episodes, not every claimed one: the UI's pages grow
    with the live count (docs/scale.md#the-ui-during-a-campaign)."""
    name, campaign_id = campaign.name, campaign.id
    episodes_per_run = CampaignConfig.from_json(campaign.settings).waves.episodes_per_run
    keys = [row.ref.partition_key for row in rows]
    missing = missing_partitions(instance, keys)
    if missing:
        # Marked before they are added: a crash between leaves them the campaign's to prune.
        missing_keys = set(missing)
        with postgres.transaction() as conn:
            db.mark_partitions_added(
                conn,
                campaign_id,
                [row.ref for row in rows if row.ref.partition_key in missing_keys],
            )
        if episodes_per_run == 1:  # the backfill's partitions must exist: those found above
            instance.add_dynamic_partitions(EPISODES_PARTITION_NAME, missing)
    # K = 1: the episode job over the episodes; K > 1: the batch job over the wave's batches.
    batch_keys = list(dict.fromkeys(row.batch_key for row in rows if row.batch_key))
    partition_keys, job_name = keys, EPISODE_JOB_NAME
    if episodes_per_run > 1:
        add_partitions(instance, batch_keys, BATCHES_PARTITION_NAME)
        partition_keys, job_name = batch_keys, BATCH_JOB_NAME
    selection = wave_assets(campaign_assets(campaign), rows)
    tags = {**campaign_tags(campaign_id, wave), **assets_tags(selection)}
    backfill_id = wave_backfill_id(campaign_id, wave)
    if instance.get_backfill(backfill_id) is None:
        record_backfill(
            instance,
            partition_keys,
            title=wave_title(name, wave),
            description=f"campaign {campaign_id}: {len(keys)} episode(s) in "
            f"{len(partition_keys)} run(s), {len(missing)} partition(s) added "
            "(episode-pipeline campaign status)",
            tags=tags,
            backfill_id=backfill_id,
            job_name=job_name,
            # K > 1: the batch job has no assets to select; its op reads the tag
            # (orchestration/batches.py).
            asset_selection=selection if job_name == EPISODE_JOB_NAME else None,
        )
    return backfill_id


def campaign_assets(campaign: db.Campaign) -> list[str] | None:
    """The campaign's asset selection as `start` recorded it (None: the whole graph; a
    campaign started before selections were recorded runs the whole graph too)."""
    return (campaign.selection or {}).get("assets") or None


def wave_assets(assets: Sequence[str] | None, rows: list[db.LedgerRow]) -> list[str] | None:
    """A wave's selection: the campaign's, unless its episodes run the whole graph (a claim
    takes one kind; a repaired wave's rows say which)."""
    if not assets or any(row.whole_graph for row in rows):
        return None
    return list(assets)


def create_batches(conn: Any, rows: list[db.LedgerRow]) -> None:
    """The wave's batches (`episode_batches`), in the transaction that claims the wave."""
    by_batch: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        assert row.batch_key is not None
        by_batch[row.batch_key].append(row.ref)
    for key, refs in by_batch.items():
        create_batch(conn, key, refs)


def prune_settled(
    instance: DagsterInstance,
    postgres: PostgresResource,
    campaign_id: str,
    retention: RetentionSettings,
) -> int:
    """Delete what Dagster holds of the partitions this campaign added once their run ended
    (succeeded, rejected, or failed until its retry is claimed) by retention's rules
    (`prune_campaign_partitions`): the campaign's live partitions stay within a wave. The
    campaign forgets a partition once it is deleted, or once retention owns it (another run of
    the episode is within its window: retention prunes it, the campaign's runs with it); one kept
    for a wait (a run in flight, an upload waiting for its run, another backfill) stays the
    campaign's, counted in its live partitions, and is tried again next tick."""
    with postgres.transaction() as conn:
        refs = db.settled_added_partitions(conn, campaign_id, PRUNE_PER_TICK)
    if not refs:
        return 0
    pruned = prune_campaign_partitions(
        instance, campaign_id, [ref.partition_key for ref in refs], retention
    )
    done = {*pruned.deleted, *pruned.retained}
    with postgres.transaction() as conn:
        db.forget_partitions(conn, campaign_id, [ref for ref in refs if ref.partition_key in done])
    return pruned.counts.get("partitions", 0)


def canary_waves(campaign: db.Campaign) -> list[int]:
    """The canary's waves: wave 0, and each that ran it again after its claims were released."""
    return [int(w) for w in (campaign.report or {}).get("canary_waves", [CANARY_WAVE])]


def judge_canary(
    conn: Any, campaign: db.Campaign, config: CampaignConfig, selected: int
) -> tuple[str, int | None]:
    """(`passed` | `waiting` | `claim` | `stopped`, the canary wave's size to claim).

    `claim`: the canary's wave is the next one — the first, or another after its claims were
    all (or too many) released: a canary passes only having compared enough episodes
    (canary.judge). `stopped`: the campaign is now stopped, the verdict (findings, or no
    baseline) its report. An operator's resume counts as passed."""
    report = campaign.report or {}
    if report.get("canary") in (canary.PASSED, "resumed"):
        return "passed", None
    waves = canary_waves(campaign)
    verdict = canary.judge(
        config.canary.wave_size(selected),
        db.canary_episodes(conn, campaign.id, waves),
        campaign.target_code_version,
        config.canary,
        accept_no_baseline=bool(report.get("accept_no_baseline")),
    )
    if verdict.outcome == canary.WAITING:
        return "waiting", None
    if verdict.outcome == canary.RERUN:
        if campaign.next_wave not in waves:  # its claims were released: run it again
            report = {**report, "canary_waves": [*waves, campaign.next_wave]}
            db.update_campaign(conn, campaign.id, report=report)
            db.log_decision(conn, campaign.id, "canary", verdict.message(), verdict.as_json())
        return "claim", verdict.rerun_size
    report = {**report, **verdict.as_json()}
    if verdict.outcome == canary.PASSED:
        db.update_campaign(conn, campaign.id, report=report)
        db.log_decision(conn, campaign.id, "canary", verdict.message(), verdict.as_json())
        return "passed", None
    db.update_campaign(conn, campaign.id, state=ledger.STOPPED, report=report)
    db.log_decision(conn, campaign.id, "canary", verdict.message(), verdict.as_json())
    return "stopped", None


def note_progress(
    postgres: PostgresResource, report: TickReport, now: datetime
) -> progress.Stall | None:
    """After the tick: is the campaign making progress? Its stall (or None) is recorded on the
    campaign's report, where `campaign status` reads it, a decision logged when it changes."""
    settled = sum(report.reconciled.values())
    with postgres.transaction() as conn:
        campaign = db.lock_campaign(conn, report.campaign)
        assert campaign is not None
        old = campaign.report or {}
        config = CampaignConfig.from_json(campaign.settings)
        seen = old.get("progress") or {}
        at = datetime.fromisoformat(seen["at"]) if seen.get("at") else now  # the first note
        released = int(seen.get("released", 0))
        if settled:
            at, released = now, 0
        released += report.released
        found = progress.stall(
            progress.Facts(
                state=campaign.state,
                counts=report.counts,
                settled=settled,
                live_budget_full=report.live_budget_full,
                canary=old.get("canary"),
                seconds_since_progress=(now - at).total_seconds(),
                released_since_progress=released,
                stall_after_seconds=progress.stall_seconds(config.stale_claim_seconds),
            )
        )
        new = {
            **old,
            "progress": {"at": at.isoformat(), "released": released},
            "stall": found.as_json() if found else None,
        }
        if new != old:
            db.update_campaign(conn, campaign.id, report=new)
        was = (old.get("stall") or {}).get("cause")
        if found and found.cause != was:
            db.log_decision(conn, campaign.id, "stall", f"stalled ({found.cause}): {found.message}")
        elif was and not found:
            db.log_decision(conn, campaign.id, "stall", f"no longer stalled ({was})")
    report.stalled = found.cause if found else None
    return found
