"""A failed run's errors, unwrapped from Dagster's, in one place: what `status` and `process`
show (`run_errors`, `StepError.line`), what the campaign's ledger and governor read
(`run_error`: one line), what a batch records of a child run it executed (`run_cause`; both
lines written by `failure_line`), and what the metrics classify
(`runtime.failure_causes.cause_class`). Keyed reads by run id and event type only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dagster import DagsterEvent, DagsterEventType, DagsterInstance, DagsterRun

from episode_pipeline.dagster_compat import SerializableErrorInfo

ERROR_LINES = 3  # of a step's error message, in the text (the JSON has the whole message)
_FAILURE_EVENTS = {DagsterEventType.STEP_FAILURE, DagsterEventType.RUN_FAILURE}


@dataclass(frozen=True)
class StepError:
    """The error a step (or, with `step` None, the run itself) failed with."""

    step: str | None
    error_type: str  # the user's exception class, under Dagster's wrappers
    message: str  # without the "module.Class: " prefix Dagster puts in front

    def first_lines(self, count: int = ERROR_LINES) -> list[str]:
        return first_lines(self.message, count)

    def line(self) -> str:
        """`step: Type: message`, as a person wants it (`run` for the run's own error)."""
        return f"{self.step or 'run'}: {self.error_type}: {self.message}"


def user_error(error: SerializableErrorInfo) -> SerializableErrorInfo:
    """The user's exception inside Dagster's wrappers (DagsterExecutionStepExecutionError, …):
    it is the one that names the file and the field."""
    while error.cause is not None and (error.cls_name or "").startswith("Dagster"):
        error = error.cause
    return error


def user_error_text(error: SerializableErrorInfo) -> tuple[str, str]:
    """The user's exception as (type, message), without the `package.module.Class: ` Dagster
    puts before the message."""
    inner = user_error(error)
    error_type = inner.cls_name or "Error"
    message = inner.message.strip()
    head, sep, rest = message.partition(": ")
    if sep and head.rsplit(".", 1)[-1] == error_type:
        message = rest
    return error_type, message


def step_error(step: str | None, error: SerializableErrorInfo | None, fallback: str) -> StepError:
    if error is None:
        return StepError(step, "failure", fallback)
    return StepError(step, *user_error_text(error))


def first_lines(message: str, count: int = ERROR_LINES) -> list[str]:
    lines = [line for line in message.strip().splitlines() if line.strip()]
    return lines[:count] + (["…"] if len(lines) > count else [])


def run_errors(instance: DagsterInstance, run_id: str) -> list[StepError]:
    """Each failed step's error; the run's own error when no step failed (a dead worker, a
    run-level failure)."""
    records = instance.get_records_for_run(run_id, of_type=_FAILURE_EVENTS).records
    steps, run_level = [], []
    for record in records:
        event = record.event_log_entry.dagster_event
        if event is None:
            continue
        if event.event_type == DagsterEventType.STEP_FAILURE:
            data = event.step_failure_data
            steps.append(step_error(event.step_key, data.error if data else None, "failed"))
        else:
            data = event.event_specific_data
            error = getattr(data, "error", None)
            run_level.append(step_error(None, error, record.event_log_entry.message or "failed"))
    return steps or run_level


# Where a failed run's error is read, in order: a failed step's; an error an engine event carries
# (a launch that raised: the run queue records the launcher's exception — boto3's RunTask
# ThrottlingException, dagster-aws's "Task failed. Failure reason: RESOURCE:CPU" — in an engine
# event, then fails the run with a generic message); the run's own.
_ERROR_EVENTS = (
    DagsterEventType.STEP_FAILURE,
    DagsterEventType.ENGINE_EVENT,
    DagsterEventType.RUN_FAILURE,
)


def failure_line(
    events: Iterable[tuple[DagsterEvent, str | None]],
    read_from: Sequence[DagsterEventType],
    *,
    first_line_only: bool,
) -> str | None:
    """A failed run's error as one line, from its events (each with its log message): the error
    of the first type in `read_from` that carried one, as `step: Type: message` (the message's
    first line only with `first_line_only`); else its run failure's message; else None."""
    lines: dict[DagsterEventType, str] = {}
    run_failure_message = None
    for event, message in events:
        error = getattr(event.event_specific_data, "error", None)
        if error is not None and event.event_type in read_from:
            if event.event_type not in lines:
                error_type, text = user_error_text(error)
                if first_line_only:
                    text = (text.splitlines() or [""])[0]
                step = f"{event.step_key}: " if event.step_key else ""
                lines[event.event_type] = f"{step}{error_type}: {text}"
        elif event.event_type == DagsterEventType.RUN_FAILURE and run_failure_message is None:
            run_failure_message = message or None
    found = [lines[event_type] for event_type in read_from if event_type in lines]
    return found[0] if found else run_failure_message


def run_error(instance: DagsterInstance, run: DagsterRun) -> str:
    """The failed run's first step error, else its launch error, else its own, as one line."""
    records = instance.get_records_for_run(run.run_id, of_type=set(_ERROR_EVENTS)).records
    entries = (record.event_log_entry for record in records)
    events = ((e.dagster_event, e.message) for e in entries if e.dagster_event is not None)
    line = failure_line(events, _ERROR_EVENTS, first_line_only=False)
    return (line or f"run {run.status.value.lower()}")[:1000]


def run_cause(events: Iterable[DagsterEvent]) -> str | None:
    """`step: Type: first line` of the first failed step among a run's events (an in-process
    run's result), else the run's own failure."""
    with_messages = ((event, event.message or "the run failed") for event in events)
    return failure_line(with_messages, (DagsterEventType.STEP_FAILURE,), first_line_only=True)
