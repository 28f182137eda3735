"""`episode-pipeline health`: is the pipeline working, in one answer (docs/operations.md).

It reads what `status` reads — the Settings, Dagster's instance, the queues — on the local stack
and in production alike, and only keyed, bounded queries, so it costs the same at a million
episodes (Dagster's storage holds retention's working set; the application's tables are not read):

- the window's episode runs: `runs` by status and update time (Dagster's `idx_run_range`), at most
  `RUNS_READ`; their latency from the `episode` materializations after the window's first event
  (`idx_events_by_asset`, a range on the id); each failed run's cause from its failure events
  (by run id, at most `CAUSES_READ` runs);
- the queues' attributes (depth, in flight, the DLQ's depth); the oldest upload waiting: the
  oldest queued run (received, waiting for launch) that is no campaign's (a campaign's wait for
  its own limit, 0 while it is paused). The age of a message not yet received is
  SQS's `ApproximateAgeOfOldestMessage`, a CloudWatch metric (the alarm watches it); a peek at
  the messages would tell their `SentTimestamp` but counts as a receive, and three probes would
  move an upload to the dead-letter queue;
- each sensor's latest ticks (`job_ticks` by selector), and the daemons' heartbeats.

Unhealthy: the sensor daemon's heartbeat is stale while uploads wait; a sensor's latest ticks
failed `HEALTH_SENSOR_FAILURE_STREAK` times in a row; the failure rate is over
`HEALTH_MAX_FAILURE_RATE` (from `HEALTH_FAILURE_RATE_MIN_FAILED` failures); the oldest upload
waits longer than `HEALTH_OLDEST_UPLOAD_SECONDS`; the dead-letter queue holds messages.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from dagster import AssetRecordsFilter, DagsterInstance, DagsterRunStatus, RunsFilter

from episode_pipeline.config.settings import HealthSettings, Settings
from episode_pipeline.dagster_compat import InstigatorSelector, TickStatus
from episode_pipeline.defs.asset_keys import EPISODE_KEY
from episode_pipeline.episodes.processed import UPLOAD_TO_PROCESSED_METADATA
from episode_pipeline.instance.run_tags import CAMPAIGN_TAG, EPISODE_JOB_NAME
from episode_pipeline.orchestration.failures import failure_cause, was_processing
from episode_pipeline.uploads.upload_queue import UploadQueue

CODE_LOCATION = "episode_pipeline"
REPOSITORY = "__repository__"  # the repository a `Definitions` makes
SENSOR_DAEMON = "SENSOR"
RUNS_READ = 10_000  # episode runs of the window read at most (10,000 uploads a day: ~420/h)
CAUSES_READ = 200  # failed runs whose cause is read at most
TICKS_READ = 20  # a sensor's latest ticks read for its failure streak


@dataclass(frozen=True)
class Throughput:
    window_seconds: int
    processed: int
    failed: int
    latency_p50_seconds: float | None
    latency_p95_seconds: float | None
    latencies: int  # episodes the percentiles are of
    failures_by_cause: dict[str, int] = field(default_factory=dict)

    @property
    def failure_rate(self) -> float | None:
        total = self.processed + self.failed
        return self.failed / total if total else None


@dataclass(frozen=True)
class Backlog:
    visible: int | None  # None: no queue configured
    in_flight: int | None
    dead_letters: int | None
    queued_runs: int  # uploads' runs: a campaign's are not uploads waiting
    oldest_waiting_seconds: float | None
    oldest_waiting_source: str  # where the age comes from
    campaign_queued_runs: int = 0  # paced by their campaign (held at 0 while it is paused)

    @property
    def waiting(self) -> int:
        return (self.visible or 0) + self.queued_runs


@dataclass(frozen=True)
class SensorHealth:
    name: str
    last_tick_at: float | None
    last_status: str | None
    failure_streak: int
    last_error: str | None = None


@dataclass(frozen=True)
class Health:
    checked_at: float
    throughput: Throughput
    backlog: Backlog
    sensors: list[SensorHealth]
    heartbeats: dict[str, float]  # daemon type → age in seconds
    reasons: list[str]

    @property
    def healthy(self) -> bool:
        return not self.reasons

    def as_dict(self) -> dict[str, Any]:
        throughput = asdict(self.throughput)
        throughput["failure_rate"] = self.throughput.failure_rate
        return {
            "healthy": self.healthy,
            "reason": "; ".join(self.reasons) or None,
            "reasons": self.reasons,
            "checked_at": datetime.fromtimestamp(self.checked_at, UTC).isoformat(),
            "throughput": throughput,
            "backlog": asdict(self.backlog),
            "sensors": [asdict(s) for s in self.sensors],
            "daemon_heartbeat_age_seconds": self.heartbeats,
        }


# -- pure ---------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank percentile (q in 0..100) of `values`, None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def failure_streak(statuses: Sequence[TickStatus]) -> int:
    """Failed ticks in a row, newest first; a tick still under way is passed over."""
    streak = 0
    for status in statuses:
        if status == TickStatus.STARTED:
            continue
        if status != TickStatus.FAILURE:
            break
        streak += 1
    return streak


def judge(
    throughput: Throughput,
    backlog: Backlog,
    sensors: Sequence[SensorHealth],
    heartbeats: Mapping[str, float],
    limits: HealthSettings,
) -> list[str]:
    """Why the pipeline is unhealthy, one short clause each ([] when healthy)."""
    reasons = []
    age = heartbeats.get(SENSOR_DAEMON)
    if backlog.waiting and (age is None or age > limits.daemon_heartbeat_seconds):
        seen = "no heartbeat" if age is None else f"heartbeat {age:.0f} s old"
        reasons.append(
            f"the sensor daemon is stopped ({seen}, limit {limits.daemon_heartbeat_seconds} s) "
            f"with {backlog.waiting} upload(s) waiting"
        )
    for sensor in sensors:
        if sensor.failure_streak >= limits.sensor_failure_streak:
            error = f": {sensor.last_error}" if sensor.last_error else ""
            reasons.append(
                f"sensor {sensor.name} failed its last {sensor.failure_streak} ticks{error}"
            )
    rate = throughput.failure_rate
    if (
        rate is not None
        and throughput.failed >= limits.failure_rate_min_failed
        and rate > limits.failure_rate
    ):
        causes = ", ".join(f"{c} {n}" for c, n in sorted(throughput.failures_by_cause.items()))
        reasons.append(
            f"failure rate {rate:.0%} over {limits.failure_rate:.0%} in the last "
            f"{throughput.window_seconds // 60} min ({throughput.failed} failed, "
            f"{throughput.processed} processed; {causes or 'causes unknown'})"
        )
    if (
        backlog.oldest_waiting_seconds is not None
        and backlog.oldest_waiting_seconds > limits.oldest_upload_seconds
    ):
        reasons.append(
            f"the oldest upload has waited {backlog.oldest_waiting_seconds:.0f} s "
            f"(limit {limits.oldest_upload_seconds} s, {backlog.oldest_waiting_source})"
        )
    if backlog.dead_letters:
        reasons.append(f"the dead-letter queue holds {backlog.dead_letters} message(s)")
    return reasons


def _ago(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.0f} s ago"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def format_health(report: Mapping[str, Any]) -> str:
    """The text `health` prints: the verdict (with every reason) on the first line."""
    verdict = "healthy" if report["healthy"] else f"UNHEALTHY: {report['reason']}"
    t, b = report["throughput"], report["backlog"]
    rate = "-" if t["failure_rate"] is None else f"{t['failure_rate']:.0%}"
    causes = ", ".join(f"{c} {n}" for c, n in sorted(t["failures_by_cause"].items())) or "none"
    checked = datetime.fromisoformat(report["checked_at"]).timestamp()
    lines = [
        f"episode-pipeline health: {verdict}",
        f"last {t['window_seconds'] // 60} min: {t['processed']} processed, {t['failed']} failed "
        f"(failure rate {rate}); latency upload → processed p50 "
        f"{_seconds(t['latency_p50_seconds'])}, p95 {_seconds(t['latency_p95_seconds'])} "
        f"(of {t['latencies']})",
        f"  failed by cause: {causes}",
        "backlog: "
        + (
            "no upload queue configured"
            if b["visible"] is None
            else f"queue {b['visible']} waiting, {b['in_flight']} in flight"
        )
        + f"; {b['queued_runs']} queued run(s)"
        + (f" (and {b['campaign_queued_runs']} of campaigns)" if b["campaign_queued_runs"] else "")
        + "; oldest waiting "
        + ("-" if b["oldest_waiting_seconds"] is None else f"{b['oldest_waiting_seconds']:.0f} s")
        + f" ({b['oldest_waiting_source']}); dead-letter queue "
        + ("-" if b["dead_letters"] is None else str(b["dead_letters"])),
        "sensors:",
    ]
    for sensor in report["sensors"]:
        last = None if sensor["last_tick_at"] is None else checked - sensor["last_tick_at"]
        status = (sensor["last_status"] or "no tick").lower()
        lines.append(
            f"  {sensor['name']:<32} last tick {_ago(last)} ({status}), failing streak "
            f"{sensor['failure_streak']}"
        )
    beats = report["daemon_heartbeat_age_seconds"]
    lines.append(
        "daemon heartbeats: "
        + (", ".join(f"{name} {age:.0f} s ago" for name, age in sorted(beats.items())) or "none")
    )
    return "\n".join(lines)


# -- reading ------------------------------------------------------------------------------------


def sensor_selector_id(name: str) -> str:
    """The id Dagster files a sensor's ticks under, for the code location `episode_pipeline`."""
    return InstigatorSelector(
        location_name=CODE_LOCATION, repository_name=REPOSITORY, name=name
    ).get_id()


def sensor_health(instance: DagsterInstance, name: str) -> SensorHealth:
    ticks = instance.get_ticks("", sensor_selector_id(name), limit=TICKS_READ)
    done = [t for t in ticks if t.status != TickStatus.STARTED]
    if not done:
        return SensorHealth(name, None, None, 0)
    last = done[0]
    error = None
    if last.status == TickStatus.FAILURE and last.error is not None:
        error = (last.error.message or "").strip().splitlines()[:1]
        error = error[0][:200] if error else None
    return SensorHealth(
        name, last.timestamp, last.status.value, failure_streak([t.status for t in ticks]), error
    )


def throughput(instance: DagsterInstance, window_seconds: int, now: float) -> Throughput:
    cutoff = now - window_seconds
    records = instance.get_run_records(
        RunsFilter(
            job_name=EPISODE_JOB_NAME,
            statuses=[DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE],
            updated_after=datetime.fromtimestamp(cutoff, UTC),
        ),
        limit=RUNS_READ,
    )
    processing = [r for r in records if was_processing(r.dagster_run)]
    succeeded = [r for r in processing if r.dagster_run.status == DagsterRunStatus.SUCCESS]
    failed = [r for r in processing if r.dagster_run.status == DagsterRunStatus.FAILURE]
    causes = Counter(failure_cause(instance, r.dagster_run.run_id) for r in failed[:CAUSES_READ])
    latencies = episode_latencies(instance, succeeded, cutoff)
    return Throughput(
        window_seconds=window_seconds,
        processed=len(succeeded),
        failed=len(failed),
        latency_p50_seconds=percentile(latencies, 50),
        latency_p95_seconds=percentile(latencies, 95),
        latencies=len(latencies),
        failures_by_cause=dict(causes),
    )


def episode_latencies(instance: DagsterInstance, succeeded: Sequence[Any], cutoff: float) -> list:
    """Upload → processed of the window's `episode` materializations: a range of the asset's
    events after the first event of the window's oldest successful run."""
    if not succeeded:
        return []
    oldest = min(succeeded, key=lambda r: r.create_timestamp)
    first = instance.get_records_for_run(oldest.dagster_run.run_id, limit=1).records
    floor = first[0].storage_id - 1 if first else None
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=EPISODE_KEY, after_storage_id=floor, after_timestamp=cutoff),
        limit=RUNS_READ,
    ).records
    values = []
    for record in records:
        metadata = record.asset_materialization.metadata if record.asset_materialization else {}
        entry = metadata.get(UPLOAD_TO_PROCESSED_METADATA)
        if entry is not None and isinstance(entry.value, int | float):
            values.append(float(entry.value))
    return values


def backlog(instance: DagsterInstance, settings: Settings, now: float) -> Backlog:
    depth = UploadQueue(settings.sqs_queue_url, settings.aws).depth()
    dead = UploadQueue(settings.dlq_url, settings.aws).depth()
    records = instance.get_run_records(
        RunsFilter(
            job_name=EPISODE_JOB_NAME,
            statuses=[DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED],
        ),
        limit=RUNS_READ,
        order_by="create_timestamp",
        ascending=True,
    )
    # A campaign's queued runs wait for its own limit (0 while it is paused or stopped, a queue
    # kept full on purpose while it runs): no upload waits on them. A stalled campaign has its
    # own alarm (`CampaignsStalled`).
    queued = [r for r in records if CAMPAIGN_TAG not in r.dagster_run.tags]
    age, source = None, "nothing waiting"
    if queued:
        age = now - queued[0].create_timestamp.timestamp()
        source = "the oldest queued run"
    elif depth and depth[0]:
        source = "of the queue's messages: unknown here, CloudWatch's ApproximateAgeOfOldestMessage"
    return Backlog(
        visible=depth[0] if depth else None,
        in_flight=depth[1] if depth else None,
        dead_letters=(dead[0] + dead[1]) if dead else None,
        queued_runs=len(queued),
        oldest_waiting_seconds=age,
        oldest_waiting_source=source,
        campaign_queued_runs=len(records) - len(queued),
    )


def heartbeat_ages(instance: DagsterInstance, now: float) -> dict[str, float]:
    return {
        str(kind): round(now - beat.timestamp, 1)
        for kind, beat in instance.get_daemon_heartbeats().items()
    }


def check_health(
    instance: DagsterInstance,
    settings: Settings,
    sensor_names: Sequence[str],
    now: float | None = None,
) -> Health:
    now = time.time() if now is None else now
    limits = settings.health
    rates = throughput(instance, limits.window_seconds, now)
    queue = backlog(instance, settings, now)
    sensors = [sensor_health(instance, name) for name in sensor_names]
    beats = heartbeat_ages(instance, now)
    return Health(now, rates, queue, sensors, beats, judge(rates, queue, sensors, beats, limits))
