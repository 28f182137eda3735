"""Exactly-once hand-off across crashes, with the real Dagster daemon killed with SIGKILL.

A real `dagster-daemon run` (its code server included) processes uploads from a private bucket
→ queue → DLQ on the session's moto server, into a private Dagster instance in the session's
PostgreSQL. An injection point (`episode_pipeline.runtime.injection_points`, armed through the
daemon's environment) holds it at one precise moment; the test then kills the daemon and its code
server with SIGKILL — run workers live on, as separate ECS tasks would — and starts a clean daemon.
After the restart every upload must be processed exactly once: one successful run per object
version and no other run, its frames rows written once, and its message neither lost nor left
on the queue or in the dead-letter queue.

The queue's visibility timeout is 24 s (heartbeat every 3 s) instead of 15 minutes, so a
message held by the killed daemon comes back within the test. Each case starts the daemon twice
and processes one 1-second, 1-camera episode.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

import psutil
import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from episode_pipeline.db.connection import connect
from episode_pipeline.db.episodes import episode_row, frame_rows
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_tags import (
    IN_FLIGHT_STATUSES,
    PARTITION_TAG,
    UPLOAD_TAG,
    upload_id,
)
from episode_pipeline.local.upload import upload_episode
from episode_pipeline.orchestration.upload_runs import (
    AFTER_RECEIVE,
    BEFORE_DELETE_DONE,
    BEFORE_HEARTBEAT,
)
from episode_pipeline.runtime.injection_points import (
    MID_COPY,
    MID_EXTRACTION,
    release,
)
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline_tests.crash_support import AFTER_SUBMIT_RUN
from episode_pipeline_tests.support.daemon import (
    CrashStage,
    Daemon,
    _is_run_worker,
    wait_until,
)
from episode_pipeline_tests.support.queues import depth

pytestmark = pytest.mark.integration

POINT_SECONDS = 180  # until the armed point is reached
CONVERGE_SECONDS = 420  # until the restarted daemon has processed everything
FPS = 30


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("crash-sample") / "take.tar.zst"
    write_sample(out, SampleSpec(seconds=1.0, cameras=1, fps=FPS))
    return out


# 45-70 s each: they start first and spread over the workers (suite.py).
LONG = pytest.mark.slow(seconds=70)


@pytest.mark.parametrize(
    "point",
    [
        pytest.param(AFTER_RECEIVE, marks=LONG),  # received, nothing recorded yet
        pytest.param(AFTER_SUBMIT_RUN, marks=LONG),  # the run queued, the tick not finished
        pytest.param(BEFORE_HEARTBEAT, marks=LONG),  # the heartbeat due while the run works
        pytest.param(BEFORE_DELETE_DONE, marks=LONG),  # run succeeded, message not deleted
    ],
)
def test_after_a_sigkill_every_upload_is_processed_exactly_once(
    crash_stage: CrashStage, archive: Path, point: str
) -> None:
    stage = crash_stage
    ref = EpisodeRef("test-org", f"ep-crash-{uuid.uuid4().hex[:8]}")
    key = upload_episode(archive, ref, stage.settings)
    etag = Bucket(stage.settings.bucket, stage.settings.aws).head(key).etag
    label = point.replace(".", "-")

    # At the heartbeat, strike once the run worker runs (killing the code server while it is
    # still launching the worker would leave the run starting until run monitoring fails it),
    # and while it works: the run is held mid-extraction until the daemon is dead (a 1-second
    # episode's run ends in about 2 s, before a 3-second heartbeat would tick).
    at_heartbeat = point == BEFORE_HEARTBEAT
    about = f"{ref.partition_key}:STARTED" if at_heartbeat else ref.partition_key
    home = stage.queue_paused_home if point == AFTER_SUBMIT_RUN else stage.dagster_home
    hold = (MID_EXTRACTION, ref.partition_key) if at_heartbeat else None
    armed = Daemon(
        stage, f"{label}-armed", armed=point, about=about, dagster_home=home, hold_run_at=hold
    )
    spared: list[int] = []
    try:
        wait_until(
            armed.marker.exists, POINT_SECONDS, lambda: f"{point} not reached:\n{armed.tail()}"
        )
        spared = armed.crash()
        if at_heartbeat:  # the run was still working: it reaches its hold, then finishes
            wait_until(armed.run_marker.exists, POINT_SECONDS, lambda: "the run was not held")
            release(armed.run_marker)
    finally:
        if armed.process.poll() is None:
            armed.stop()

    clean = Daemon(stage, f"{label}-restarted")
    with DagsterInstance.from_config(str(stage.dagster_home)) as instance:
        try:
            wait_until(
                lambda: converged(stage, instance, ref),
                CONVERGE_SECONDS,
                lambda: f"{state(stage, instance, ref)}\n{clean.tail()}",
            )
        finally:
            clean.stop()
            for pid in spared:
                with contextlib.suppress(psutil.NoSuchProcess):
                    psutil.Process(pid).kill()

        # Exactly once: one successful run for the object version. A run whose launch the
        # kill interrupted may have failed (and been retried); none may have succeeded twice.
        runs = instance.get_runs(RunsFilter(tags={PARTITION_TAG: ref.partition_key}))
        succeeded = [run for run in runs if run.status == DagsterRunStatus.SUCCESS]
        assert len(succeeded) == 1, state(stage, instance, ref)
        assert succeeded[0].tags[UPLOAD_TAG] == upload_id(ref.partition_key, etag)
        assert {run.status for run in runs} <= {
            DagsterRunStatus.SUCCESS,
            DagsterRunStatus.FAILURE,
            DagsterRunStatus.CANCELED,
        }
    with connect(stage.settings.database) as conn:
        assert episode_row(conn, ref)["status"] == "processed"
        assert frame_rows(conn, ref) == FPS  # written once: 1 s at 30 fps
    assert depth(stage.queue) == (0, 0)  # no message left
    assert depth(stage.dlq) == (0, 0)  # and none lost to the dead-letter queue


# Who notices a dead run worker, by what else died with it (the messages they leave on the run).
CODE_SERVER_NOTICES = "Run execution process for"  # Dagster's code server, itself alive
RUN_MONITORING_NOTICES = "process {pid} is gone"  # a restarted daemon (instance/run_launcher.py)


@pytest.mark.parametrize(
    ("point", "about", "machine_crash"),
    [
        # The worker alone dies mid-extraction (an OOM kill): the code server that started it
        # reports the run failed.
        pytest.param(MID_EXTRACTION, "{partition_key}", False, marks=LONG),
        # Everything dies mid-COPY (the machine): a restarted daemon's run monitoring finds the
        # run STARTED with its worker gone and fails it at the next poll, not after the
        # run's two-hour deadline.
        pytest.param(MID_COPY, "frames:{episode_id}", True, marks=LONG),
    ],
)
def test_a_killed_run_worker_fails_its_run_and_the_retry_converges(
    crash_stage: CrashStage, archive: Path, point: str, about: str, machine_crash: bool
) -> None:
    """The run's worker is SIGKILLed at a point inside the run; the run fails naming the cause,
    its episode is marked `failed` (the killed COPY left no rows), and exactly one retry
    processes it: Dagster's `run_retries` (production's dagster.yaml), which the upload's
    message, no longer renewed, joins when it comes back (never a second retry of its own)."""
    stage = crash_stage
    ref = EpisodeRef("test-org", f"ep-worker-{uuid.uuid4().hex[:8]}")
    upload_episode(archive, ref, stage.settings)
    label = f"worker-{point.replace('.', '-')}"
    about = about.format(partition_key=ref.partition_key, episode_id=ref.episode_id)
    daemon = Daemon(stage, label, armed=point, about=about)
    try:
        wait_until(
            daemon.marker.exists, POINT_SECONDS, lambda: f"{point} not reached:\n{daemon.tail()}"
        )
        tree = psutil.Process(daemon.process.pid).children(recursive=True)
        (worker,) = [process for process in tree if _is_run_worker(process)]
        if machine_crash:
            daemon.crash(spare_workers=False)
            daemon = Daemon(stage, f"{label}-restarted")
        else:
            for process in [worker, *worker.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
        with DagsterInstance.from_config(str(stage.dagster_home)) as instance:
            wait_until(
                lambda: converged(stage, instance, ref),
                CONVERGE_SECONDS,
                lambda: f"{state(stage, instance, ref)}\n{daemon.tail()}",
            )
            runs = instance.get_runs(RunsFilter(tags={PARTITION_TAG: ref.partition_key}))
            statuses = sorted(run.status.value for run in runs)
            assert statuses == ["FAILURE", "SUCCESS"], state(stage, instance, ref)
            (failed,) = [run for run in runs if run.status == DagsterRunStatus.FAILURE]
            (retried,) = [run for run in runs if run.status == DagsterRunStatus.SUCCESS]
            assert retried.parent_run_id == failed.run_id  # Dagster's retry, not the sensor's
            # The cause is where an operator looks: the failed run's event log.
            messages = [
                (entry.dagster_event.message if entry.dagster_event else None) or entry.message
                for entry in instance.all_logs(failed.run_id)
            ]
            # A worker killed alone is reported by whichever notices first: its code server
            # or the daemon's run monitoring (a race under load); a machine crash only by the
            # restarted daemon's run monitoring.
            notices = [RUN_MONITORING_NOTICES.format(pid=worker.pid)]
            if not machine_crash:
                notices.append(CODE_SERVER_NOTICES)
            assert any(n in message for message in messages for n in notices), messages[-8:]
    finally:
        daemon.stop()
    with connect(stage.settings.database) as conn:
        assert episode_row(conn, ref)["status"] == "processed"
        assert frame_rows(conn, ref) == FPS  # the killed COPY left none; the retry wrote all
    assert depth(stage.queue) == (0, 0)
    assert depth(stage.dlq) == (0, 0)


def converged(stage: CrashStage, instance: DagsterInstance, ref: EpisodeRef) -> bool:
    with connect(stage.settings.database) as conn:
        status = episode_row(conn, ref)["status"]
    in_flight = instance.get_runs(
        RunsFilter(tags={PARTITION_TAG: ref.partition_key}, statuses=IN_FLIGHT_STATUSES)
    )
    return status in ("processed", "failed") and not in_flight and depth(stage.queue) == (0, 0)


def state(stage: CrashStage, instance: DagsterInstance, ref: EpisodeRef) -> str:
    with connect(stage.settings.database) as conn:
        status = episode_row(conn, ref)["status"]
    runs = instance.get_runs(RunsFilter(tags={PARTITION_TAG: ref.partition_key}))
    return (
        f"episode {status}; runs {[(r.run_id[:8], r.status.value) for r in runs]}; "
        f"queue {depth(stage.queue)}; dlq {depth(stage.dlq)}"
    )
