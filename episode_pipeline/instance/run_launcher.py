"""The local instance's run launcher: Dagster's default one, plus a worker health check.

Dagster's `DefaultRunLauncher` starts each run in a worker process of the code server but
cannot tell run monitoring whether that process still lives, so a run whose worker was killed
(mid-extraction, mid-COPY) stays STARTED until `max_runtime_seconds` — two hours. This launcher
answers the health check from the pid Dagster recorded for the worker
(`launched_worker_pid`); run monitoring then fails the run within one poll, the
run-failure sensor marks the episode `failed`, and the upload's message brings one retry.
Production's `EcsRunLauncher` does the same from the ECS task's state.

In-process runs (`episode-pipeline process`) have no launched worker: the `orphaned_runs`
sensor watches them by their host and pid tags, so they are reported running here.
"""

from __future__ import annotations

from dagster import DagsterEventType, DagsterInstance, DagsterRun
from dagster._core.launcher import DefaultRunLauncher
from dagster._core.launcher.base import CheckRunHealthResult, WorkerStatus

from episode_pipeline.runtime.processes import process_alive

# The engine event the code server's run worker reports first (dagster/_grpc/impl.py).
WORKER_STARTED_PREFIX = "Started process for run (pid: "


def launched_worker_pid(instance: DagsterInstance, run: DagsterRun) -> int | None:
    """The pid of the newest worker process started for a launched run, or None."""
    pid = None
    for entry in instance.all_logs(run.run_id, of_type=DagsterEventType.ENGINE_EVENT):
        if entry.message.startswith(WORKER_STARTED_PREFIX) and entry.dagster_event is not None:
            value = entry.dagster_event.engine_event_data.metadata.get("pid")
            text = str(getattr(value, "value", ""))
            pid = int(text) if text.isdigit() else pid
    return pid


class LocalRunLauncher(DefaultRunLauncher):
    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        pid = launched_worker_pid(self._instance, run)
        if pid is None:
            return CheckRunHealthResult(WorkerStatus.RUNNING, "no launched worker (in-process run)")
        if process_alive(pid):
            return CheckRunHealthResult(WorkerStatus.RUNNING, f"worker pid {pid} is alive")
        return CheckRunHealthResult(
            WorkerStatus.FAILED, f"run worker process {pid} is gone (killed or crashed)"
        )
