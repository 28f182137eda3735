"""One failure policy for every way a run can end badly (docs/contract.md#failure-semantics).

- A failed run leaves its episode `failed` only when that run was processing it — it included
  the extraction — and did not already mark it `processed`. A checks-only run, a failed
  re-materialization of one downstream asset, or a late failure of an older run never turns a
  `processed` episode `failed`.
- A run executed in-process (`episode-pipeline process`, `dagster asset materialize`) whose
  process died is not watched by Dagster's run monitoring: it would stay STARTED forever. Such
  runs carry the host and pid that executed them (`runs.in_process_tags`), so a dead pid on this
  host means a dead run, which is reported failed — and then the rule above applies.
- A batch run's child runs (`defs.batches`) run in the batch's task, maybe on another host:
  once the batch run has ended (run monitoring fails it when its task dies), a child still
  STARTED is orphaned too.
- A run the local daemon launched runs in a worker process the code server started; Dagster
  records its pid ("Started process for run (pid: N)"). Dagster's default launcher cannot tell
  whether that process lives, so the local instance's launcher (`local.run_launcher`) answers
  run monitoring from `event_log.launched_worker_pid` — and run monitoring fails the run.

The run-failure and orphaned-runs sensors, the local run launcher and the runner call these.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Collection, Iterable
from datetime import UTC, datetime

from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    RunsFilter,
)
from dagster._utils.error import SerializableErrorInfo

from episode_pipeline.db.episodes import mark_failed
from episode_pipeline.defs.asset_keys import EXTRACTED_FILES_KEY
from episode_pipeline.defs.jobs import EPISODE_JOB_NAME
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.runs import (
    BATCH_RUN_TAG,
    HOST_TAG,
    IN_FLIGHT_STATUSES,
    PID_TAG,
    episode_of_run,
)
from episode_pipeline.episodes.keys import EpisodeRef


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


def run_started_at(instance: DagsterInstance, run: DagsterRun) -> datetime:
    """When the run started (or was created, if it never started): the cut-off for `failed`."""
    record = instance.get_run_record_by_id(run.run_id)
    timestamp = None
    if record is not None:
        timestamp = record.start_time or record.create_timestamp.timestamp()
    return datetime.fromtimestamp(timestamp, UTC) if timestamp else datetime.now(UTC)


def was_processing(run: DagsterRun) -> bool:
    """Did the run (re)process its episode, i.e. include the extraction?"""
    selection = run.asset_selection or frozenset()
    # The whole episode job carries no selection (sensor, backfill) or an empty one (in-process).
    if run.job_name == EPISODE_JOB_NAME and not selection:
        return True
    return EXTRACTED_FILES_KEY in selection


def fail_episode_of_run(
    instance: DagsterInstance, run: DagsterRun, postgres: PostgresResource
) -> EpisodeRef | None:
    """Mark the run's episode failed if the run was processing it and had not processed it."""
    ref = episode_of_run(run)
    if ref is None or not was_processing(run):
        return None
    with postgres.transaction() as conn:
        changed = mark_failed(conn, postgres.database_schema(), ref, run_started_at(instance, run))
    return ref if changed else None


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_orphaned(
    run: DagsterRun,
    *,
    host: str,
    pid_alive: Callable[[int], bool] = process_alive,
    ended_batch_runs: Collection[str] = (),
) -> bool:
    """A STARTED run executed in a process on this host that no longer exists, or the child of
    a batch run that has ended (its task, on another host, is gone: `defs.batches`)."""
    if run.status != DagsterRunStatus.STARTED:
        return False
    if run.tags.get(BATCH_RUN_TAG) in ended_batch_runs:
        return True
    if run.tags.get(HOST_TAG) != host:
        return False
    pid = run.tags.get(PID_TAG, "")
    return pid.isdigit() and not pid_alive(int(pid))


def ended_batch_runs(instance: DagsterInstance, runs: Iterable[DagsterRun]) -> set[str]:
    """The ids of the batch runs these runs are children of that are no longer in flight
    (deleted ones included): one query."""
    batch_run_ids = {run.tags[BATCH_RUN_TAG] for run in runs if BATCH_RUN_TAG in run.tags}
    if not batch_run_ids:
        return set()
    alive = instance.get_runs(RunsFilter(run_ids=list(batch_run_ids), statuses=IN_FLIGHT_STATUSES))
    return batch_run_ids - {run.run_id for run in alive}


def find_orphaned_runs(
    instance: DagsterInstance, runs: Iterable[DagsterRun] | None = None
) -> list[DagsterRun]:
    host = socket.gethostname()
    if runs is None:
        runs = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.STARTED]))
    runs = list(runs)
    ended = ended_batch_runs(instance, runs)
    return [run for run in runs if is_orphaned(run, host=host, ended_batch_runs=ended)]


def fail_orphaned_runs(instance: DagsterInstance) -> list[str]:
    """Report every orphaned in-process run as failed; returns their run ids."""
    failed = []
    for run in find_orphaned_runs(instance):
        instance.report_run_failed(run, "its process is gone (killed or crashed)")
        failed.append(run.run_id)
    return failed
