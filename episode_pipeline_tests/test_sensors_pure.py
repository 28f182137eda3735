"""Failure-handling sensors' pure parts: which run belongs to which episode, which run is dead."""

import os
import subprocess
import sys

from dagster import AssetKey, DagsterInstance, DagsterRun, DagsterRunStatus

from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_launcher import WORKER_STARTED_PREFIX, LocalRunLauncher
from episode_pipeline.instance.run_tags import HOST_TAG, PID_TAG, episode_of_run
from episode_pipeline.orchestration.failures import is_orphaned, was_processing
from episode_pipeline_tests.support.dagster_internals import (
    EngineEventData,
    WorkerStatus,
    make_new_run_id,
)


def run(status=DagsterRunStatus.STARTED, run_id="r1", **tags) -> DagsterRun:
    return DagsterRun(job_name="process_episode", run_id=run_id, status=status, tags=tags)


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_episode_of_run_reads_the_partition_tag():
    assert episode_of_run(run(**{"dagster/partition": "acme/ep-1"})) == EpisodeRef("acme", "ep-1")
    assert episode_of_run(run()) is None
    assert episode_of_run(run(**{"dagster/partition": "not a key"})) is None


def test_a_started_run_whose_process_is_gone_is_orphaned():
    tags = {HOST_TAG: "laptop", PID_TAG: str(dead_pid())}
    assert is_orphaned(run(**tags), host="laptop")
    assert not is_orphaned(run(**tags), host="other-host")  # cannot see its processes
    assert not is_orphaned(run(DagsterRunStatus.SUCCESS, **tags), host="laptop")
    alive = {HOST_TAG: "laptop", PID_TAG: str(os.getpid())}
    assert not is_orphaned(run(**alive), host="laptop")
    assert not is_orphaned(run(), host="laptop")  # launched by the daemon: run monitoring's job


def test_only_a_run_that_included_the_extraction_was_processing_its_episode():
    frames, extraction = AssetKey("frames"), AssetKey("extracted_files")
    assert was_processing(run())  # the whole episode job, as sensors and backfills launch it
    in_process = DagsterRun(job_name="process_episode", run_id="r6", asset_selection=frozenset())
    assert was_processing(in_process)  # what `episode-pipeline process` executes
    assert was_processing(
        DagsterRun(job_name="__ASSET_JOB", run_id="r2", asset_selection=frozenset({extraction}))
    )
    # A checks-only run and a re-materialization of one downstream asset process nothing.
    checks_only = DagsterRun(job_name="__ASSET_JOB", run_id="r3", asset_selection=frozenset())
    assert not was_processing(checks_only)
    one_asset = DagsterRun(job_name="__ASSET_JOB", run_id="r4", asset_selection=frozenset({frames}))
    assert not was_processing(one_asset)
    assert not was_processing(DagsterRun(job_name="some_other_job", run_id="r5"))


def test_the_local_launcher_reports_a_launched_run_whose_worker_is_gone_as_failed():
    """Run monitoring asks the launcher; the answer comes from the pid Dagster recorded."""
    with DagsterInstance.ephemeral() as instance:
        launcher = LocalRunLauncher()
        launcher.register_instance(instance)

        def worker_started(pid: int | None) -> DagsterRun:
            launched = instance.add_run(run(run_id=make_new_run_id()))
            if pid is not None:
                message = f"{WORKER_STARTED_PREFIX}{pid})."
                instance.report_engine_event(message, launched, EngineEventData.in_process(pid))
            return launched

        gone = launcher.check_run_worker_health(worker_started(dead_pid()))
        assert gone.status == WorkerStatus.FAILED and "is gone" in (gone.msg or "")
        alive = launcher.check_run_worker_health(worker_started(os.getpid()))
        assert alive.status == WorkerStatus.RUNNING
        # An in-process run has no launched worker: the orphaned_runs sensor's to judge.
        in_process = launcher.check_run_worker_health(worker_started(None))
        assert in_process.status == WorkerStatus.RUNNING
