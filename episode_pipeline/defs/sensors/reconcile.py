"""Reconciliation: what the event-driven path can miss is found by looking at the stores.

- No episode stays `processing` after the run that owned it is gone. Runs launched by the daemon
  are watched by Dagster's run monitoring. Runs started in-process (`episode-pipeline process`,
  `dagster asset materialize`) are not: if that process is killed the run stays STARTED forever.
  Those runs carry the host and pid that executed them, so a dead pid on this host means a dead
  run, which we report failed; the run-failure sensor then marks the episode.
- No upload waits forever. An episode still `uploaded` well after the queue should have handed it
  over (a lost or misfiltered S3 notification, a message purged by hand), whose archive is in the
  bucket and which no run is working on, gets a run: no upload is ever lost.
"""

import os
import socket
from collections.abc import Iterable

from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)
from dagster._core.storage.dagster_run import IN_PROGRESS_RUN_STATUSES

from episode_pipeline.db.episodes import waiting_uploads
from episode_pipeline.defs.jobs import EPISODE_JOB_NAME, tags_for_episode
from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME, episode_partitions
from episode_pipeline.defs.resources.postgres import PostgresResource
from episode_pipeline.defs.resources.storage import EpisodeStorage
from episode_pipeline.extraction import ArchiveNotFound, find_archive
from episode_pipeline.keys import EpisodeRef

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


# Longer than the queue's 15-minute visibility timeout plus a queued run's wait: by then the
# event-driven path has had its chance.
WAITING_UPLOAD_SECONDS = 45 * 60
WAITING_UPLOADS_PER_TICK = 50
RECONCILED_TAG = "episode_pipeline/reconciled"


def has_run_in_flight(instance: DagsterInstance, ref: EpisodeRef) -> bool:
    runs = instance.get_runs(
        RunsFilter(
            tags={"dagster/partition": ref.partition_key}, statuses=IN_PROGRESS_RUN_STATUSES
        ),
        limit=1,
    )
    return bool(runs)


@sensor(
    name="waiting_uploads",
    job_name=EPISODE_JOB_NAME,
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=300,
    description="Runs episodes still `uploaded` 45 minutes after their last change whose archive "
    "is in the bucket and that no run is working on (a lost S3 notification).",
)
def waiting_uploads_sensor(
    context: SensorEvaluationContext, postgres: PostgresResource, storage: EpisodeStorage
):
    with postgres.connect() as conn:
        waiting = waiting_uploads(conn, WAITING_UPLOAD_SECONDS, WAITING_UPLOADS_PER_TICK)
    requests, new_partitions = [], []
    for ref in waiting:
        if has_run_in_flight(context.instance, ref):
            continue
        try:
            archive = find_archive(storage, ref)
        except ArchiveNotFound:
            continue  # the application made the row; the robot has not uploaded yet
        if not context.instance.has_dynamic_partition(EPISODES_PARTITION_NAME, ref.partition_key):
            new_partitions.append(ref.partition_key)
        context.log.warning(f"{ref}: still uploaded, no run: requesting one for {archive.key}")
        requests.append(
            RunRequest(
                partition_key=ref.partition_key,
                run_key=f"{ref.partition_key}@{archive.version}#reconciled",
                tags={**tags_for_episode(ref.partition_key), RECONCILED_TAG: "true"},
            )
        )
    if not requests:
        return SkipReason(f"{len(waiting)} waiting upload(s), none needing a run")
    return SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[episode_partitions.build_add_request(new_partitions)]
        if new_partitions
        else [],
    )
