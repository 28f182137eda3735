"""Reconciliation: no episode stays `processing` after the run that owned it is gone.

Runs launched by the daemon are watched by Dagster's run monitoring. Runs started in-process
(`episode-pipeline process`, `dagster asset materialize`) are not: if that process is killed the
run stays STARTED forever. Those runs carry the host and pid that executed them, so a dead pid on
this host means a dead run, which we report failed; the run-failure sensor then marks the episode.
"""

import os
import socket
from collections.abc import Iterable

from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunsFilter,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

HOST_TAG = "episode_pipeline/host"
PID_TAG = "episode_pipeline/pid"


def in_process_run_tags() -> dict[str, str]:
    """Tags for a run executed inside this process, so a later check can tell if it died."""
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_orphaned(run: DagsterRun, *, host: str, pid_alive=_pid_alive) -> bool:
    """A STARTED run executed in a process on this host that no longer exists."""
    if run.status != DagsterRunStatus.STARTED or run.tags.get(HOST_TAG) != host:
        return False
    pid = run.tags.get(PID_TAG, "")
    return pid.isdigit() and not pid_alive(int(pid))


def orphaned_runs(instance: DagsterInstance, runs: Iterable[DagsterRun] | None = None):
    host = socket.gethostname()
    if runs is None:
        runs = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.STARTED]))
    return [run for run in runs if is_orphaned(run, host=host)]


def fail_orphaned_runs(instance: DagsterInstance) -> list[str]:
    """Report every orphaned in-process run as failed; returns their run ids."""
    failed = []
    for run in orphaned_runs(instance):
        instance.report_run_failed(run, "its process is gone (killed or crashed)")
        failed.append(run.run_id)
    return failed


@sensor(
    name="orphaned_runs",
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=60,
    description="Fails in-process runs whose process died, so their episodes become `failed`.",
)
def orphaned_runs_sensor(context: SensorEvaluationContext):
    failed = fail_orphaned_runs(context.instance)
    if not failed:
        return SkipReason("no orphaned runs")
    context.log.warning(f"reported {len(failed)} orphaned run(s) failed: {', '.join(failed)}")
    return SkipReason(f"reported {len(failed)} orphaned run(s) failed")
