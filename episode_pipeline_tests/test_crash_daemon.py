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
import dataclasses
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
import yaml
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from episode_pipeline.config.settings import Settings
from episode_pipeline.db.connection import connect
from episode_pipeline.db.episodes import episode_row, frame_rows
from episode_pipeline.defs.runs import IN_FLIGHT_STATUSES, PARTITION_TAG, UPLOAD_TAG, upload_id
from episode_pipeline.defs.sensors import sqs
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.local import aws_setup
from episode_pipeline.local.dagster_home import instance_config
from episode_pipeline.local.dev import WORKSPACE_FILE
from episode_pipeline.local.stack import StackInfo
from episode_pipeline.local.upload import upload_episode
from episode_pipeline.runtime.injection_points import (
    INJECTION_ABOUT_ENV,
    INJECTION_POINT_ENV,
    MID_COPY,
    MID_EXTRACTION,
)
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.uploads.upload_queue import UploadQueue
from episode_pipeline_tests.crash_support import AFTER_SUBMIT_RUN

pytestmark = pytest.mark.integration

REPO = Path(__file__).parents[1]
VISIBILITY_SECONDS = 24
HEARTBEAT_SECONDS = 3
POINT_SECONDS = 180  # until the armed point is reached
CONVERGE_SECONDS = 420  # until the restarted daemon has processed everything
FPS = 30


@dataclasses.dataclass
class CrashStage:
    settings: Settings  # the session's, with the private bucket and queues
    queue: UploadQueue
    dlq: UploadQueue
    dagster_home: Path
    queue_paused_home: Path  # the same instance, but its run queue is not dequeued
    env: dict[str, str]  # the daemon's environment
    logs: Path


@pytest.fixture(scope="module")
def crash_stage(
    stack: StackInfo, settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CrashStage]:
    assert stack.s3_endpoint is not None
    name = f"crash-{uuid.uuid4().hex[:8]}"
    resources = aws_setup.ensure_resources(stack.s3_endpoint, bucket=name, queue_name=name)
    sqs_client = aws_setup.client("sqs", stack.s3_endpoint)
    sqs_client.set_queue_attributes(
        QueueUrl=resources.queue_url, Attributes={"VisibilityTimeout": str(VISIBILITY_SECONDS)}
    )
    private = dataclasses.replace(
        settings,
        bucket=resources.bucket,
        sqs_queue_url=resources.queue_url,
        dlq_url=resources.dlq_url,
    )

    # A Dagster instance of its own, in its own database of the session's PostgreSQL.
    password, port = stack.env["DB_PASSWORD"], int(stack.env["DB_PORT"])
    database = name.replace("-", "_")
    with psycopg.connect(
        host="127.0.0.1",
        port=port,
        user="postgres",
        password=password,
        dbname="postgres",
        autocommit=True,
    ) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    home = tmp_path_factory.mktemp("crash-dagster")
    config = instance_config(password, port, database=database)
    config["run_coordinator"] = {
        "module": "episode_pipeline_tests.crash_support",
        "class": "PausingRunCoordinator",
    }
    # A run whose launch the kill interrupted is failed after a minute (not 3), then retried.
    config["run_monitoring"] |= {"start_timeout_seconds": 60, "poll_interval_seconds": 5}
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    with DagsterInstance.from_config(str(home)) as instance:
        instance.get_runs_count()  # creates the tables once
    # To kill the daemon between "run queued" and "run launched", its queue must not move:
    # the same storage, read through a configuration that dequeues once an hour.
    paused = tmp_path_factory.mktemp("crash-dagster-queue-paused")
    config["run_coordinator"]["config"] = {"dequeue_interval_seconds": 3600}
    (paused / "dagster.yaml").write_text(yaml.safe_dump(config))

    env = {
        **os.environ,
        **stack.env,
        "DATA_BUCKET": resources.bucket,
        "SQS_QUEUE_URL": resources.queue_url,
        "SQS_DLQ_URL": resources.dlq_url,
        "DAGSTER_HOME": str(home),
        "SQS_VISIBILITY_TIMEOUT_SECONDS": str(VISIBILITY_SECONDS),
        "SQS_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
        # The session's database holds every test's episodes: this daemon reconciles none.
        "RECONCILE_LOST_UPLOAD_AFTER_SECONDS": str(10 * 24 * 3600),
        "RECONCILE_STALE_PROCESSING_AFTER_SECONDS": str(10 * 24 * 3600),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        # What a SIGKILL leaves in the temp folder stays with this module, not the session's.
        "TMPDIR": str(tmp_path_factory.mktemp("crash-tmp")),
    }
    env.pop(INJECTION_POINT_ENV, None)
    env.pop(INJECTION_ABOUT_ENV, None)
    yield CrashStage(
        settings=private,
        queue=UploadQueue(resources.queue_url, private.aws),
        dlq=UploadQueue(resources.dlq_url, private.aws),
        dagster_home=home,
        queue_paused_home=paused,
        env=env,
        logs=tmp_path_factory.mktemp("crash-logs"),
    )
    kill_leftovers({str(home), str(paused)})


def kill_leftovers(dagster_homes: set[str]) -> None:
    """SIGKILL whatever this module started that is still alive (a code server the kill raced,
    a run worker spared by it): every process whose DAGSTER_HOME is one of ours."""
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            ours = process.environ().get("DAGSTER_HOME") in dagster_homes
            if ours and process.pid != os.getpid():
                process.kill()


class Daemon:
    """One `dagster-daemon run` process group; its log goes to a file."""

    def __init__(
        self,
        stage: CrashStage,
        label: str,
        armed: str | None = None,
        about: str = "",
        dagster_home: Path | None = None,
    ) -> None:
        env = {**stage.env, "DAGSTER_HOME": str(dagster_home or stage.dagster_home)}
        self.marker = stage.logs / f"{label}.reached"
        if armed:
            env[INJECTION_POINT_ENV] = f"{armed}:{self.marker}"
            env[INJECTION_ABOUT_ENV] = about  # this test's episode, not another test's
        self.log = stage.logs / f"{label}.log"
        executable = Path(sys.executable).parent / "dagster-daemon"
        self.process = subprocess.Popen(
            [str(executable), "run", "-w", str(WORKSPACE_FILE)],
            cwd=REPO,
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("wb"),
        )

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def crash(self, spare_workers: bool = True) -> list[int]:
        """SIGKILL the daemon and its code server; run workers live on, as separate ECS tasks
        would, unless the whole machine is meant to die (returns the spared pids)."""
        root = psutil.Process(self.process.pid)
        tree = root.children(recursive=True)
        workers = [p for p in tree if _is_run_worker(p)] if spare_workers else []
        spared = {p.pid for w in workers for p in [w, *w.children(recursive=True)]}
        for process in [root, *tree]:
            if process.pid not in spared:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
        self.process.wait()
        return sorted(spared)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def _is_run_worker(process: psutil.Process) -> bool:
    """The code server starts each run in a `multiprocessing` spawn child (Dagster's StartRun);
    its resource tracker is not one."""
    with contextlib.suppress(psutil.Error):
        command = " ".join(process.cmdline())
        return "spawn_main" in command and "resource_tracker" not in command
    return False


def wait_until(condition: Callable[[], bool], timeout: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting: {what()}"
        time.sleep(1)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("crash-sample") / "take.tar.zst"
    write_sample(out, SampleSpec(seconds=1.0, cameras=1, fps=FPS))
    return out


def depth(queue: UploadQueue) -> tuple[int, int]:
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    found = queue.client.get_queue_attributes(QueueUrl=queue.queue_url, AttributeNames=names)
    visible, in_flight = (int(found["Attributes"].get(name, 0)) for name in names)
    return visible, in_flight


# About 90 s each: they start first and spread over the workers (suite.py).
LONG = pytest.mark.slow(seconds=90)


@pytest.mark.parametrize(
    "point",
    [
        pytest.param(sqs.AFTER_RECEIVE, marks=LONG),  # received, nothing recorded yet
        pytest.param(AFTER_SUBMIT_RUN, marks=LONG),  # the run queued, the tick not finished
        pytest.param(sqs.BEFORE_HEARTBEAT, marks=LONG),  # the heartbeat due while the run works
        pytest.param(sqs.BEFORE_DELETE_DONE, marks=LONG),  # run succeeded, message not deleted
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
    # still launching the worker would leave the run starting until run monitoring fails it).
    about = f"{ref.partition_key}:STARTED" if point == sqs.BEFORE_HEARTBEAT else ref.partition_key
    home = stage.queue_paused_home if point == AFTER_SUBMIT_RUN else stage.dagster_home
    armed = Daemon(stage, f"{label}-armed", armed=point, about=about, dagster_home=home)
    spared: list[int] = []
    try:
        wait_until(
            armed.marker.exists, POINT_SECONDS, lambda: f"{point} not reached:\n{armed.tail()}"
        )
        spared = armed.crash()
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
RUN_MONITORING_NOTICES = "process {pid} is gone"  # a restarted daemon (local.run_launcher)


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
    its episode is marked `failed` (the killed COPY left no rows), and the upload's message, no
    longer renewed, brings exactly one retry that processes it."""
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
            # The cause is where an operator looks: the failed run's event log.
            messages = [
                (entry.dagster_event.message if entry.dagster_event else None) or entry.message
                for entry in instance.all_logs(failed.run_id)
            ]
            notice = RUN_MONITORING_NOTICES if machine_crash else CODE_SERVER_NOTICES
            expected = notice.format(pid=worker.pid)
            assert any(expected in message for message in messages), messages[-5:]
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
