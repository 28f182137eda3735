"""The errors a failed run recorded, unwrapped from Dagster's: what `status` shows and what the
metrics classify (`runtime.metrics.cause_class`). Keyed reads by run id and event type only.
"""

from __future__ import annotations

from dataclasses import dataclass

from dagster import DagsterEventType, DagsterInstance

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
        return _first_lines(self.message, count)


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


def _first_lines(message: str, count: int = ERROR_LINES) -> list[str]:
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
