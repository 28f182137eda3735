"""The pipeline's CloudWatch metrics: names, units, dimensions, and the one line each is written as.

Every metric is a CloudWatch embedded-metric-format (EMF) document, one JSON object per stdout
line of the process that knows the value (a run, the code server evaluating a sensor). On ECS the
awslogs driver ships stdout to CloudWatch Logs, which extracts the metrics: no PutMetricData call,
no agent, no request in the hot path. Locally (`dev`, `demo`) the same lines are appended to a
file (`METRICS_OUTPUT`): a terminal is no log stream. The alarms (infra/) are built on these
names, so the two must agree; docs/operations.md#metrics lists them.

Why not awslabs' `aws-embedded-metrics`: it resolves its environment asynchronously, probing the
EC2 metadata endpoint unless `AWS_EMF_ENVIRONMENT` is set, and its default sink on ECS is a TCP
socket to a CloudWatch agent these tasks do not run; its stdout sink `print`s, so two threads
of the code server can interleave a line. What we need is a dict and one `write(2)`: this module.

The format (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/
CloudWatch_Embedded_Metric_Format_Specification.html): the root holds each dimension's and each
metric's value as a member; `_aws.CloudWatchMetrics` lists directives, each a namespace, its
dimension sets (each a list of member names, at most 30) and its metrics (name and unit, at most
100); `_aws.Timestamp` is epoch milliseconds.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from episode_pipeline.config.settings import MetricsSettings

NAMESPACE = "EpisodePipeline"
DEPLOYMENT = "Deployment"
CAUSE = "Cause"
SENSOR = "Sensor"
REASON = "Reason"  # why an upload message was left unfinished (uploads.reasons)
MAX_METRICS_PER_DIRECTIVE = 100
MAX_DIMENSIONS_PER_SET = 30


class Unit(StrEnum):
    COUNT = "Count"
    SECONDS = "Seconds"
    BYTES = "Bytes"


# -- the metrics, each declared once (docs/operations.md#metrics) ------------------------------

EPISODE_SCOPE = "episode"  # per episode, by the process that writes its final status: [Deployment]
SENSOR_SCOPE = "sensor"  # per sensor evaluation: [Deployment, Sensor]


@dataclass(frozen=True)
class Metric:
    """One metric: its name, unit and meaning, where it is written (`scope`), the extra dimension
    it is also written by (`by`: `Cause` of a failure, `Reason` of a left message), and the
    sensors whose every line carries it, 0 when nothing happened (`always_on`: an alarm on a
    missing value would read "no data", not "nothing")."""

    name: str
    unit: Unit
    meaning: str
    scope: str
    by: str | None = None
    always_on: tuple[str, ...] = ()

    @property
    def dimensions(self) -> list[tuple[str, ...]]:
        base = (DEPLOYMENT,) if self.scope == EPISODE_SCOPE else (DEPLOYMENT, SENSOR)
        return [base, (*base, self.by)] if self.by else [base]


METRICS: dict[str, Metric] = {}


def _declare(
    name: str, unit: Unit, meaning: str, scope: str, by: str | None = None,
    always_on: tuple[str, ...] = (),
) -> str:  # fmt: skip
    METRICS[name] = Metric(name, unit, meaning, scope, by, always_on)
    return name


EPISODES_PROCESSED = _declare(
    "EpisodesProcessed", Unit.COUNT,
    "1 when an episode becomes `processed` (the `episode` step)", EPISODE_SCOPE,
)  # fmt: skip
EPISODES_FAILED = _declare(
    "EpisodesFailed", Unit.COUNT,
    "1 when an episode becomes `failed`; also by `Cause` (`failure_causes.CAUSES`)",
    EPISODE_SCOPE, by=CAUSE,
)  # fmt: skip
EPISODE_LATENCY_SECONDS = _declare(
    "EpisodeLatencySeconds", Unit.SECONDS,
    "upload (the archive's LastModified) → `processed`", EPISODE_SCOPE,
)  # fmt: skip
RUN_WALL_SECONDS = _declare(
    "RunWallSeconds", Unit.SECONDS,
    "the run's wall time, start → final status (processed and failed)", EPISODE_SCOPE,
)  # fmt: skip
BYTES_IN = _declare("BytesIn", Unit.BYTES, "the archive's bytes read", EPISODE_SCOPE)
BYTES_OUT = _declare(
    "BytesOut", Unit.BYTES,
    "processed bytes written: the extracted files and the HLS tree", EPISODE_SCOPE,
)  # fmt: skip
SYNC_FINDINGS = _declare(
    "SyncFindings", Unit.COUNT,
    "findings of `video_frames_in_sync` (its run, each time it runs)", EPISODE_SCOPE,
)  # fmt: skip
DRIFT_FINDINGS = _declare(
    "DriftFindings", Unit.COUNT,
    "cameras failing `hls_duration_matches_sources` (its run)", EPISODE_SCOPE,
)  # fmt: skip
SENSOR_TICKS = _declare("SensorTicks", Unit.COUNT, "1 per evaluation of a sensor", SENSOR_SCOPE)
SENSOR_TICK_FAILURES = _declare(
    "SensorTickFailures", Unit.COUNT,
    "1 when the evaluation raised (written, then re-raised)", SENSOR_SCOPE,
)  # fmt: skip
TICK_SECONDS = _declare("TickSeconds", Unit.SECONDS, "the evaluation's duration", SENSOR_SCOPE)
UPLOADS_RECEIVED = _declare(
    "UploadsReceived", Unit.COUNT,
    "`episode_uploads`: messages received from the upload queue", SENSOR_SCOPE,
    always_on=("episode_uploads",),
)  # fmt: skip
RUNS_REQUESTED = _declare(
    "RunsRequested", Unit.COUNT,
    "`episode_uploads`, `waiting_uploads`: runs the tick requested", SENSOR_SCOPE,
    always_on=("episode_uploads", "waiting_uploads"),
)  # fmt: skip
MESSAGES_DELETED = _declare(
    "MessagesDeleted", Unit.COUNT,
    "`episode_upload_done`: messages deleted after their run succeeded", SENSOR_SCOPE,
    always_on=("episode_upload_done",),
)  # fmt: skip
MESSAGES_LEFT = _declare(
    "MessagesLeft", Unit.COUNT,
    "`episode_uploads`: deliveries on their way to the dead-letter queue (left unfinished, or "
    "back after a failed, missing or unrenewed run); also by `Reason`", SENSOR_SCOPE,
    by=REASON, always_on=("episode_uploads",),
)  # fmt: skip
LOST_UPLOADS_FOUND = _declare(
    "LostUploadsFound", Unit.COUNT,
    "`waiting_uploads`: uploads no event announced (notifications broken)", SENSOR_SCOPE,
    always_on=("waiting_uploads",),
)  # fmt: skip
EPISODES_PRUNED = _declare(
    "EpisodesPruned", Unit.COUNT,
    "`dagster_retention`: episodes pruned from Dagster's storage", SENSOR_SCOPE,
    always_on=("dagster_retention",),
)  # fmt: skip
LIVE_PARTITIONS = _declare(
    "LivePartitions", Unit.COUNT,
    "`dagster_retention`: episode partitions Dagster still holds after the tick", SENSOR_SCOPE,
)  # fmt: skip
CAMPAIGNS_STALLED = _declare(
    "CampaignsStalled", Unit.COUNT,
    "`campaign_driver`: campaigns that cannot go on by themselves (the cause: "
    "`campaign status`)", SENSOR_SCOPE,
)  # fmt: skip

UNITS: Mapping[str, Unit] = {name: metric.unit for name, metric in METRICS.items()}
EPISODE_METRICS = tuple(name for name, metric in METRICS.items() if metric.scope == EPISODE_SCOPE)


def tick_counters(sensor: str) -> tuple[str, ...]:
    """The counters every line of this sensor carries (0 when nothing happened)."""
    return tuple(name for name, metric in METRICS.items() if sensor in metric.always_on)


# -- the document (pure) ------------------------------------------------------------------------


@dataclass(frozen=True)
class Directive:
    """Metrics sharing dimension sets: every metric is published under every set."""

    dimension_sets: tuple[tuple[str, ...], ...]
    values: Mapping[str, float]


def emf_document(
    directives: Sequence[Directive],
    dimensions: Mapping[str, str],
    timestamp_ms: int,
    properties: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One EMF document: the dimensions' and metrics' values at the root, the directives under
    `_aws`. Properties (an episode's key, a run id) are searchable in Logs Insights but are not
    dimensions, so they cost no metric."""
    document: dict[str, Any] = dict(properties or {})
    document.update(dimensions)
    cloudwatch = []
    for directive in directives:
        if not directive.values:
            continue
        if len(directive.values) > MAX_METRICS_PER_DIRECTIVE:
            raise ValueError(f"{len(directive.values)} metrics in one directive (at most 100)")
        for dimension_set in directive.dimension_sets:
            missing = [name for name in dimension_set if name not in dimensions]
            if missing or len(dimension_set) > MAX_DIMENSIONS_PER_SET:
                raise ValueError(f"dimension set {list(dimension_set)}: no value for {missing}")
        metrics = []
        for name, value in directive.values.items():
            if name not in UNITS:
                raise ValueError(f"undeclared metric {name!r} (runtime/metrics.UNITS)")
            document[name] = value
            metrics.append({"Name": name, "Unit": UNITS[name].value})
        cloudwatch.append(
            {
                "Namespace": NAMESPACE,
                "Dimensions": [list(s) for s in directive.dimension_sets],
                "Metrics": metrics,
            }
        )
    document["_aws"] = {"Timestamp": timestamp_ms, "CloudWatchMetrics": cloudwatch}
    return document


def emf_line(document: Mapping[str, Any]) -> str:
    """The document as one line (JSON escapes any newline inside a value)."""
    return json.dumps(document, separators=(",", ":"), default=str) + "\n"


# -- writing ------------------------------------------------------------------------------------

_WRITE_LOCK = threading.Lock()


def write_stdout(line: str) -> None:
    """One line on the process's standard output, whole: what Python buffered for stdout goes
    first, then the line in as few `write(2)` calls as the pipe takes, under a lock, so neither
    another thread's metric nor a half-printed line can land inside it."""
    data = line.encode()
    with _WRITE_LOCK:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        fd = sys.__stdout__.fileno() if sys.__stdout__ is not None else 1
        while data:
            data = data[os.write(fd, data) :]


def append_to_file(path: str, line: str) -> None:
    """One line appended to `path`, whole: a single `write(2)` on an `O_APPEND` descriptor, so
    the lines of the processes sharing the file (daemon, code server, runs) never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _nowhere(line: str) -> None:
    del line


@dataclass
class Emitter:
    """Writes the pipeline's metrics for one deployment (METRICS_DEPLOYMENT)."""

    deployment: str
    write: Callable[[str], None] = write_stdout
    clock: Callable[[], float] = time.time

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Emitter:
        settings = MetricsSettings.from_env(os.environ if environ is None else environ)
        if settings.output == "off":
            return cls(settings.deployment, write=_nowhere)
        if settings.metrics_file:
            return cls(
                settings.deployment, write=functools.partial(append_to_file, settings.metrics_file)
            )
        return cls(settings.deployment)

    def emit(
        self,
        directives: Sequence[Directive],
        dimensions: Mapping[str, str] | None = None,
        properties: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        document = emf_document(
            directives,
            {DEPLOYMENT: self.deployment, **(dimensions or {})},
            int(self.clock() * 1000),
            properties,
        )
        self.write(emf_line(document))
        return document

    def episode_processed(
        self,
        episode: str,
        run_id: str,
        *,
        latency_seconds: float | None,
        run_wall_seconds: float | None,
        bytes_in: int,
        bytes_out: int,
    ) -> dict[str, Any]:
        values: dict[str, float] = {EPISODES_PROCESSED: 1, BYTES_IN: bytes_in, BYTES_OUT: bytes_out}
        if latency_seconds is not None:
            values[EPISODE_LATENCY_SECONDS] = round(latency_seconds, 3)
        if run_wall_seconds is not None:
            values[RUN_WALL_SECONDS] = round(run_wall_seconds, 3)
        return self.emit(
            [Directive(((DEPLOYMENT,),), values)], properties={"episode": episode, "run_id": run_id}
        )

    def episode_failed(
        self, episode: str, run_id: str | None, cause: str, run_wall_seconds: float | None
    ) -> dict[str, Any]:
        failed = METRICS[EPISODES_FAILED]
        directives = [Directive(tuple(failed.dimensions), {EPISODES_FAILED: 1})]
        if run_wall_seconds is not None:
            directives.append(
                Directive(((DEPLOYMENT,),), {RUN_WALL_SECONDS: round(run_wall_seconds, 3)})
            )
        return self.emit(
            directives, {CAUSE: cause}, properties={"episode": episode, "run_id": run_id}
        )

    def findings(self, name: str, count: int, episode: str, run_id: str) -> dict[str, Any]:
        """`SyncFindings` or `DriftFindings` of one check evaluation."""
        if name not in (SYNC_FINDINGS, DRIFT_FINDINGS):
            raise ValueError(f"{name!r} is not a findings metric")
        return self.emit(
            [Directive(((DEPLOYMENT,),), {name: count})],
            properties={"episode": episode, "run_id": run_id},
        )

    def sensor_tick(
        self,
        sensor: str,
        seconds: float,
        failed: bool,
        counts: Mapping[str, float],
        by_reason: Mapping[str, Mapping[str, float]] | None = None,
    ) -> dict[str, Any]:
        values = {
            SENSOR_TICKS: 1,
            SENSOR_TICK_FAILURES: 1 if failed else 0,
            TICK_SECONDS: round(seconds, 3),
            **counts,
        }
        document = self.emit([Directive(((DEPLOYMENT, SENSOR),), values)], {SENSOR: sensor})
        # One more line per reason: a document holds one value of a dimension.
        for name, reasons in (by_reason or {}).items():
            for reason, value in sorted(reasons.items()):
                self.emit(
                    [Directive((METRICS[name].dimensions[-1],), {name: value})],
                    {SENSOR: sensor, REASON: reason},
                )
        return document


# -- what a sensor tick counts ------------------------------------------------------------------


@dataclass
class TickCounts:
    values: dict[str, float] = field(default_factory=dict)
    by_reason: dict[str, dict[str, float]] = field(default_factory=dict)  # `count_reason`

    def add(self, name: str, value: float) -> None:
        self.values[name] = self.values.get(name, 0) + value


_TICK: contextvars.ContextVar[TickCounts | None] = contextvars.ContextVar("tick", default=None)


@contextlib.contextmanager
def counting_tick(defaults: Mapping[str, float] | None = None) -> Iterator[TickCounts]:
    """What the code of one sensor evaluation `count`s, gathered for its one metric line."""
    counts = TickCounts(dict(defaults or {}))
    token = _TICK.set(counts)
    try:
        yield counts
    finally:
        _TICK.reset(token)


def count(name: str, value: float = 1) -> None:
    """Add to this sensor tick's metric `name` (nothing outside a tick: a CLI, a test)."""
    if name not in UNITS:
        raise ValueError(f"undeclared metric {name!r} (runtime/metrics.UNITS)")
    counts = _TICK.get()
    if counts is not None:
        counts.add(name, value)


def count_reason(name: str, reason: str, value: float = 1) -> None:
    """`count` this tick's `name`, and also under the dimension `Reason` = `reason` (a metric
    declared `by=REASON`: its last dimension set is the one with `Reason`)."""
    if METRICS[name].by != REASON:
        raise ValueError(f"metric {name} is not declared by {REASON}: count it with `count`")
    count(name, value)
    counts = _TICK.get()
    if counts is not None:
        reasons = counts.by_reason.setdefault(name, {})
        reasons[reason] = reasons.get(reason, 0) + value


def gauge(name: str, value: float) -> None:
    """Set this sensor tick's metric `name` to a level (LivePartitions)."""
    if name not in UNITS:
        raise ValueError(f"undeclared metric {name!r} (runtime/metrics.UNITS)")
    counts = _TICK.get()
    if counts is not None:
        counts.values[name] = value


def metrics_table() -> str:
    """The Markdown table of every metric (docs/operations.md#metrics)."""
    rows = ["| Metric | Unit | Dimensions | What |", "| --- | --- | --- | --- |"]
    for metric in METRICS.values():
        dimensions = ", ".join(f"[{', '.join(names)}]" for names in metric.dimensions)
        rows.append(f"| `{metric.name}` | {metric.unit.value} | {dimensions} | {metric.meaning} |")
    return "\n".join(rows) + "\n"
