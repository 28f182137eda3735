"""Why an episode failed, read from what Dagster stores: its latest run, the failing step's
error, and its failed checks (`episode-pipeline status ORG/EP`, `status --failed`).

Every read is a keyed lookup, so the cost of explaining one episode stays the same at a million
episodes: the episode's newest run by its partition tag (indexed `run_tags`, limit 1), that
run's failure events by run id and event type, and the latest evaluation of each check by check
key and partition. Nothing here lists runs, partitions or events of the whole fleet.

The pure half (unwrapping Dagster's errors, the one-line cause, the text) takes plain values, so
it is tested without an instance.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from dagster import AssetCheckKey, DagsterInstance, RunRecord

from episode_pipeline.dagster_compat import AssetCheckExecutionRecordStatus
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.orchestration.event_log import latest_check_executions
from episode_pipeline.orchestration.run_errors import StepError, first_lines, run_errors
from episode_pipeline.orchestration.runs import latest_run_record_of_episode


@dataclass(frozen=True)
class CheckFailure:
    check: str
    asset: str
    severity: str  # ERROR or WARN
    description: str  # what the check checks (its definition)
    result: str | None  # what the evaluation said, if anything
    metadata: dict[str, str] = field(default_factory=dict)
    run_id: str | None = None


@dataclass(frozen=True)
class Diagnosis:
    """An episode's latest run and what failed in it, plus its failed checks."""

    run_id: str | None
    run_status: str | None
    job: str | None
    started_at: datetime | None
    ended_at: datetime | None
    run_url: str | None
    errors: list[StepError] = field(default_factory=list)
    failed_checks: list[CheckFailure] = field(default_factory=list)

    @property
    def cause(self) -> str | None:
        """One line: the first failing step's error, else the first failed ERROR check."""
        return one_line_cause(self.errors, self.failed_checks)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cause": self.cause}


# -- pure ---------------------------------------------------------------------------------------


def one_line_cause(errors: list[StepError], failed_checks: list[CheckFailure]) -> str | None:
    """`step: Type: first line`, the first ERROR check's failure, else None."""
    for error in errors:
        lines = error.first_lines(1)
        where = f"{error.step}: " if error.step else ""
        return f"{where}{error.error_type}: {lines[0] if lines else ''}".rstrip(": ")
    for check in failed_checks:
        if check.severity == "ERROR":
            return f"check {check.check} failed: {check.result or check.description}"
    return None


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else "-"


def format_diagnosis(diagnosis: Mapping[str, Any]) -> list[str]:
    """Lines for a terminal from `Diagnosis.as_dict()`: the run, each failing step's error
    (its first lines), each failed check with what it checks and what it found."""
    if diagnosis["run_id"] is None:
        lines = ["  no run yet"]
    else:
        lines = [
            f"  latest run {diagnosis['run_id']} ({diagnosis['job']}): {diagnosis['run_status']}, "
            f"started {_when(diagnosis['started_at'])}, ended {_when(diagnosis['ended_at'])}",
            f"  in the UI: {diagnosis['run_url']}",
        ]
    for error in diagnosis["errors"]:
        where = f"step {error['step']}" if error["step"] else "the run"
        lines.append(f"  {where} failed: {error['error_type']}")
        lines += [f"    {line}" for line in first_lines(error["message"])]
    for check in diagnosis["failed_checks"]:
        lines.append(f"  check {check['check']} ({check['asset']}, {check['severity']}) failed")
        lines.append(f"    checks that: {check['description']}")
        if check["result"]:
            lines.append(f"    result: {check['result']}")
        if check["metadata"]:
            shown = ", ".join(f"{key}={value}" for key, value in check["metadata"].items())
            lines.append(f"    {shown[:300]}")
    return lines


# -- reading the instance -------------------------------------------------------------------------


def run_url(ui_url: str, run_id: str) -> str:
    return f"{ui_url.rstrip('/')}/runs/{run_id}"


def _timestamp(value: float | None) -> datetime | None:
    return datetime.fromtimestamp(value, UTC) if value else None


def _metadata_text(metadata: Mapping[str, Any]) -> dict[str, str]:
    return {key: str(getattr(value, "value", value))[:200] for key, value in metadata.items()}


def failed_checks(
    instance: DagsterInstance,
    ref: EpisodeRef,
    check_descriptions: Mapping[AssetCheckKey, str],
) -> list[CheckFailure]:
    """The episode's checks whose latest evaluation failed (a check that raised is a failed step
    of its run instead)."""
    failures = []
    for key, record in latest_check_executions(
        instance, list(check_descriptions), ref.partition_key
    ):
        if record.status == AssetCheckExecutionRecordStatus.FAILED:
            evaluation = record.evaluation
            failures.append(
                CheckFailure(
                    check=key.name,
                    asset=key.asset_key.to_user_string(),
                    severity=evaluation.severity.value if evaluation else "ERROR",
                    description=check_descriptions[key],
                    result=evaluation.description if evaluation else None,
                    metadata=_metadata_text(evaluation.metadata) if evaluation else {},
                    run_id=record.run_id,
                )
            )
    return failures


def diagnose(
    instance: DagsterInstance,
    ref: EpisodeRef,
    check_descriptions: Mapping[AssetCheckKey, str],
    ui_url: str,
) -> Diagnosis:
    record: RunRecord | None = latest_run_record_of_episode(instance, ref)
    checks = failed_checks(instance, ref, check_descriptions)
    if record is None:
        return Diagnosis(None, None, None, None, None, None, [], checks)
    run = record.dagster_run
    errors = run_errors(instance, run.run_id) if run.is_failure_or_canceled else []
    return Diagnosis(
        run_id=run.run_id,
        run_status=run.status.value,
        job=run.job_name,
        started_at=_timestamp(record.start_time),
        ended_at=_timestamp(record.end_time),
        run_url=run_url(ui_url, run.run_id),
        errors=errors,
        failed_checks=checks,
    )


def descriptions_of_checks(check_specs: Iterable[Any]) -> dict[AssetCheckKey, str]:
    """Check key → its definition's description, from the code location's check specs."""
    return {spec.key: (spec.description or spec.name) for spec in check_specs}
