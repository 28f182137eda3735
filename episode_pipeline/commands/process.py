"""`episode-pipeline process ORG/EP`: one episode in-process, told quietly.

Dagster's console logger prints every event of a run (about a hundred DEBUG lines for a short
episode), which buries the one line that matters. By default the command silences it and prints
instead, once the run is over, one line per step (what it made, how long it took, its checks)
and a summary; the run's whole event log goes to a file it names. `--verbose` brings Dagster's
own console output back. Errors go to stderr, the cause first.

The summary is built from the run's stored events (one read by run id) by pure functions over
`StepEvent`s, tested without a run.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from episode_pipeline.commands.common import (
    EPISODE_HELP,
    episode_arg,
    local_stack_unless_production,
)

LOG_DIR = "logs"  # under the stack's home: <home>/logs/<run id>.log


def add_process_parser(commands: argparse._SubParsersAction) -> None:
    process = commands.add_parser(
        "process",
        help="materialize one episode (ORG/EP) in-process",
        description="Process one episode in this process, as its sensor-started run would: "
        "adds its partition when missing, prints one line per step and a summary, writes the "
        "run's whole event log to a file it names. Exit status 1 when the run fails.",
    )
    process.add_argument("episode", type=episode_arg, metavar="ORG/EP", help=EPISODE_HELP)
    process.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print Dagster's own event log (DEBUG) on stderr as the run goes",
    )
    process.set_defaults(handler=cmd_process)


@dataclass(frozen=True)
class StepEvent:
    """What the summary needs of one stored event."""

    timestamp: float
    kind: str  # a DagsterEventType value: STEP_START, STEP_SUCCESS, ASSET_CHECK_EVALUATION, …
    step: str
    asset: str | None = None  # for materializations and check evaluations
    check: str | None = None
    passed: bool | None = None
    severity: str | None = None
    error: str | None = None  # for STEP_FAILURE: "Type: first line"


@dataclass
class StepLine:
    step: str
    outcome: str = "not run"  # ok | FAILED | skipped | not run
    seconds: float | None = None
    error: str | None = None
    checks: list[tuple[str, bool, str]] = field(default_factory=list)  # (name, passed, severity)


def step_lines(events: Iterable[StepEvent]) -> list[StepLine]:
    """One line per asset step, in the order they started (those that never ran last); each
    check's result folds into its asset's line. A check step may run several checks (a family,
    `defs/checks/family.py`): when it fails, each of its planned checks that has no result is
    listed as raised on its asset's line."""
    lines: dict[str, StepLine] = {}  # asset step → its line
    planned: dict[str, dict[str, str]] = {}  # check step → its checks' names → their assets
    evaluated: set[tuple[str, str]] = set()  # (check step, check name)
    started: dict[str, float] = {}
    for event in events:
        if event.kind == "ASSET_MATERIALIZATION_PLANNED":
            lines.setdefault(event.step, StepLine(event.step))
        elif event.kind in ("ASSET_CHECK_EVALUATION_PLANNED", "ASSET_CHECK_EVALUATION"):
            checks = planned.setdefault(event.step, {})
            checks.setdefault(event.check or event.step, event.asset or event.step)
            if event.kind == "ASSET_CHECK_EVALUATION" and event.check:
                evaluated.add((event.step, event.check))
                line = lines.setdefault(event.asset or "", StepLine(event.asset or ""))
                line.checks.append((event.check, bool(event.passed), event.severity or "ERROR"))
        elif event.kind == "STEP_START":
            started[event.step] = event.timestamp
        elif event.kind in ("STEP_SUCCESS", "STEP_FAILURE", "STEP_SKIPPED"):
            if event.step in planned:
                if event.kind == "STEP_FAILURE":  # a check raised instead of evaluating
                    for check, asset in planned[event.step].items():
                        if (event.step, check) not in evaluated:
                            line = lines.setdefault(asset, StepLine(asset))
                            line.checks.append((check, False, f"raised {event.error}"))
                continue
            line = lines.setdefault(event.step, StepLine(event.step))
            line.outcome = {"STEP_SUCCESS": "ok", "STEP_FAILURE": "FAILED"}.get(
                event.kind, "skipped"
            )
            line.error = event.error
            if event.step in started:
                line.seconds = event.timestamp - started[event.step]
    never = float("inf")
    return sorted(lines.values(), key=lambda line: started.get(line.step, never))


def _checks_text(checks: Sequence[tuple[str, bool, str]]) -> str:
    if not checks:
        return ""
    failed = [f"{name} FAILED ({severity})" for name, passed, severity in checks if not passed]
    passed = len(checks) - len(failed)
    return "checks: " + ", ".join([*failed, *([f"{passed} passed"] if passed else [])])


def format_steps(lines: Sequence[StepLine]) -> list[str]:
    width = max((len(line.step) for line in lines), default=0)
    out = []
    for line in lines:
        seconds = f"{line.seconds:6.1f} s" if line.seconds is not None else " " * 8
        detail = line.error if line.outcome == "FAILED" else _checks_text(line.checks)
        out.append(f"  {line.step.ljust(width)}  {line.outcome:<8} {seconds}  {detail}".rstrip())
    return out


def summary_line(lines: Sequence[StepLine]) -> str:
    checks = [check for line in lines for check in line.checks]
    failed_checks = sum(1 for _, passed, _ in checks if not passed)
    ok = sum(1 for line in lines if line.outcome == "ok")
    steps = f"{ok}/{len(lines)} steps ok"
    return f"{steps}, {len(checks)} checks ({failed_checks} failed)"


# -- reading the run ------------------------------------------------------------------------------


def _error_text(event: object) -> str | None:
    from episode_pipeline.orchestration.run_errors import step_error

    data = event.step_failure_data  # type: ignore[attr-defined]
    error = step_error(None, data.error if data else None, "failed")
    first = error.first_lines(1)
    return f"{error.error_type}: {first[0] if first else ''}"


def step_events(entries: Iterable[object]) -> list[StepEvent]:
    """The stored events of a run (EventLogEntry) as `StepEvent`s."""
    from dagster import DagsterEventType

    events = []
    for entry in entries:
        event = getattr(entry, "dagster_event", None)
        if event is None or not event.step_key:
            continue
        kind = event.event_type
        common = {"timestamp": entry.timestamp, "kind": kind.value, "step": event.step_key}
        if kind == DagsterEventType.ASSET_CHECK_EVALUATION:
            evaluation = event.asset_check_evaluation_data
            events.append(
                StepEvent(
                    **common,
                    asset=evaluation.asset_key.to_user_string(),
                    check=evaluation.check_name,
                    passed=evaluation.passed,
                    severity=evaluation.severity.value,
                )
            )
        elif kind == DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED:
            planned = event.event_specific_data
            events.append(
                StepEvent(
                    **common, asset=planned.asset_key.to_user_string(), check=planned.check_name
                )
            )
        elif kind == DagsterEventType.STEP_FAILURE:
            events.append(StepEvent(**common, error=_error_text(event)))
        else:
            events.append(StepEvent(**common))
    return events


def write_run_log(entries: Iterable[object], path: Path) -> Path:
    """Every stored event of the run, one per line, errors with their stack: what `--verbose`
    would have printed."""
    import datetime

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for entry in entries:
            when = datetime.datetime.fromtimestamp(entry.timestamp, datetime.UTC)
            event = entry.dagster_event
            kind = event.event_type_value if event else "LOG"
            level = {10: "DEBUG", 20: "INFO", 30: "WARNING", 40: "ERROR"}.get(entry.level, "LOG")
            message = (event.message if event else None) or entry.user_message
            out.write(f"{when:%Y-%m-%d %H:%M:%S.%f} {level} {entry.step_key or '-'} {kind} ")
            out.write(f"{message}\n")
            if event is not None and event.event_type_value == "STEP_FAILURE":
                error = event.step_failure_data.error
                out.write(error.to_string() + "\n" if error else "")
    return path


def cmd_process(args: argparse.Namespace) -> int:
    from dagster import DagsterInstance

    from episode_pipeline.config.settings import METRICS_OUTPUT_ENV

    # The run's metric lines would interleave with the step lines; export it to see them.
    os.environ.setdefault(METRICS_OUTPUT_ENV, "off")

    from episode_pipeline.local.stack_env import pipeline_home
    from episode_pipeline.runner import process_episode

    local_stack_unless_production()
    ref = args.episode
    outcome = process_episode(ref, quiet=not args.verbose)
    entries = DagsterInstance.get().all_logs(outcome.run_id)
    log = write_run_log(entries, pipeline_home() / LOG_DIR / f"{outcome.run_id}.log")
    lines = step_lines(step_events(entries))
    if not outcome.success:  # the cause first, on stderr; the story after, on stdout
        cause = outcome.errors[0] if outcome.errors else "the run failed"
        print(f"episode-pipeline: {ref} failed: {cause}", file=sys.stderr, flush=True)
    print(f"{ref}: run {outcome.run_id}")
    print("\n".join(format_steps(lines)))
    state = "processed" if outcome.success else "failed"
    print(f"{ref}: run {outcome.run_id} {state}; {summary_line(lines)}")
    print(f"log: {log}")
    if not outcome.success:
        print(f"why: episode-pipeline status {ref}", file=sys.stderr)
    return 0 if outcome.success else 1
