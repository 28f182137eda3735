"""One failure policy for every way a run can end badly (docs/contract.md#failure-semantics).

- A failed run leaves its episode `failed` only when that run was processing it — it included
  the extraction — and did not already mark it `processed`. A checks-only run, a failed
  re-materialization of one downstream asset, or a late failure of an older run never turns a
  `processed` episode `failed`.
- A run executed in-process (`episode-pipeline process`, `dagster asset materialize`) whose
  process died is not watched by Dagster's run monitoring: it would stay STARTED forever. Such
  runs carry the host and pid that executed them (`runs.in_process_tags`), so a dead pid on this
  host means a dead run, which is reported failed — and then the rule above applies.
- A batch run's child runs (`orchestration.batches`) run in the batch's task, maybe on another host:
  once the batch run has ended (run monitoring fails it when its task dies), a child still
  STARTED is orphaned too.
- A run the local daemon launched runs in a worker process the code server started; Dagster
  records its pid ("Started process for run (pid: N)"). Dagster's default launcher cannot tell
  whether that process lives, so the local instance's launcher (`instance/run_launcher.py`)
  answers run monitoring from that pid — and run monitoring fails the run.

The run-failure and orphaned-runs sensors, the local run launcher and the runner call these.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Collection, Iterable
from datetime import UTC, datetime

from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    RunsFilter,
)

from episode_pipeline.db.episodes import is_processing, mark_failed
from episode_pipeline.defs.asset_keys import EXTRACTED_FILES_KEY
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_tags import (
    ABANDONED_TAG,
    BATCH_RUN_TAG,
    EPISODE_JOB_NAME,
    HOST_TAG,
    IN_FLIGHT_STATUSES,
    PID_TAG,
    episode_of_run,
)
from episode_pipeline.orchestration.run_errors import run_errors
from episode_pipeline.runtime import failure_causes, metrics
from episode_pipeline.runtime.processes import process_alive


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
    instance: DagsterInstance,
    run: DagsterRun,
    postgres: PostgresResource,
    *,
    still_processing: bool = False,
) -> EpisodeRef | None:
    """Mark the run's episode failed if the run was processing it and had not processed it;
    the change writes its `EpisodesFailed` metric line with the failure's cause class.
    `still_processing`: only while the row still says `processing` — for a run deleted before
    the run-failure sensor may read it (the campaign's prune), never a second metric line for
    an episode that sensor already marked."""
    ref = episode_of_run(run)
    if ref is None or not was_processing(run):
        return None
    with postgres.transaction() as conn:
        schema = postgres.database_schema()
        if still_processing and not is_processing(conn, schema, ref):
            return None
        changed = mark_failed(conn, schema, ref, run_started_at(instance, run))
    if not changed:
        return None
    emit_episode_failed(instance, run, ref)
    return ref


def failure_cause(instance: DagsterInstance, run_id: str) -> str:
    """The run's failure as a cause class (`runtime.failure_causes.CAUSES`), from its recorded
    errors."""
    errors = run_errors(instance, run_id)
    return failure_causes.cause_class([(e.step, e.error_type, e.message) for e in errors])


def run_wall_seconds(instance: DagsterInstance, run_id: str) -> float | None:
    """Start (or creation) to end (or now) of the run, from its record."""
    record = instance.get_run_record_by_id(run_id)
    if record is None:
        return None
    started = record.start_time or record.create_timestamp.timestamp()
    ended = record.end_time or time.time()
    return max(0.0, ended - started)


def emit_episode_failed(
    instance: DagsterInstance, run: DagsterRun | None, ref: EpisodeRef, cause: str | None = None
) -> None:
    """The `EpisodesFailed` line of an episode that just became `failed` (by `run`, or by no
    live run when None: `cause` says why)."""
    if run is None:
        metrics.Emitter.from_env().episode_failed(
            ref.partition_key, None, cause or failure_causes.RUN_CRASHED, None
        )
        return
    metrics.Emitter.from_env().episode_failed(
        ref.partition_key,
        run.run_id,
        cause or failure_cause(instance, run.run_id),
        run_wall_seconds(instance, run.run_id),
    )


def is_orphaned(
    run: DagsterRun,
    *,
    host: str,
    pid_alive: Callable[[int], bool] = process_alive,
    ended_batch_runs: Collection[str] = (),
) -> bool:
    """A STARTED run executed in a process on this host that no longer exists, or the child of
    a batch run that has ended (its task, on another host, is gone: `orchestration.batches`)."""
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


def report_abandoned(instance: DagsterInstance, run: DagsterRun, message: str) -> None:
    """Fail a run whose process died before it ended, tagged so first (ABANDONED_TAG): a crash
    between the two leaves it STARTED, to be failed again, never failed untagged."""
    instance.add_run_tags(run.run_id, {ABANDONED_TAG: "true"})
    instance.report_run_failed(run, message)


def fail_orphaned_runs(instance: DagsterInstance) -> list[str]:
    """Report every orphaned in-process run as failed; returns their run ids."""
    failed = []
    for run in find_orphaned_runs(instance):
        report_abandoned(instance, run, "its process is gone (killed or crashed)")
        failed.append(run.run_id)
    return failed
