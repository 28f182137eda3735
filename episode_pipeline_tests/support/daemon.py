"""A real `dagster-daemon run` against a private bucket → queue → DLQ and a private Dagster
instance (test_crash_daemon.py, test_run_status_daemon.py). A pytest plugin (conftest.py): the
fixture `crash_stage` is shared."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
import yaml
from dagster import DagsterInstance

from episode_pipeline.config.settings import Settings
from episode_pipeline.local import aws_setup
from episode_pipeline.local.dagster_home import (
    Difference,
    apply_differences,
    instance_config,
    local_differences,
    production_config,
)
from episode_pipeline.local.dev import WORKSPACE_FILE
from episode_pipeline.local.stack import StackInfo
from episode_pipeline.runtime.injection_points import (
    INJECTION_ABOUT_ENV,
    INJECTION_POINT_ENV,
    arming_env,
)
from episode_pipeline.uploads.upload_queue import UploadQueue

REPO = Path(__file__).parents[2]


VISIBILITY_SECONDS = 24


HEARTBEAT_SECONDS = 3


# What the crash tests' daemon changes in the local instance (itself production's dagster.yaml but
# for `local_differences`), each with its reason; test_instance_config.py fails on any other.
COORDINATOR = "run_coordinator"
CRASH_STAGE_DIFFERENCES = {
    f"{COORDINATOR}.module": Difference(
        "episode_pipeline_tests.crash_support",
        "production's run queue with one injection point after a run is submitted",
    ),
    f"{COORDINATOR}.class": Difference("PausingRunCoordinator", "(the same)"),
    f"{COORDINATOR}.config.dequeue_interval_seconds": Difference(
        5, "production's interval (the local 1 s is for `dev`)"
    ),
    "run_monitoring.start_timeout_seconds": Difference(
        60, "a run whose launch the kill interrupted is failed after a minute (not 10), retried"
    ),
    "run_monitoring.poll_interval_seconds": Difference(
        5, "a dead worker's run is failed within seconds, so a test sees its retry soon"
    ),
}
# What the campaign soak's daemon changes in the local instance, with its reason (the crash tests'
# other differences are not the soak's): test_instance_config.py fails on any other.
SOAK_DIFFERENCES = {
    "run_monitoring.poll_interval_seconds": Difference(
        5,
        "a killed worker's run is failed within seconds, then retried by run_retries: production's "
        "60 s is a wait, not a fault",
    ),
}
QUEUE_PAUSED_DIFFERENCES = {
    f"{COORDINATOR}.config.dequeue_interval_seconds": Difference(
        3600, "the same storage, its queue not dequeued: a kill between queued and launched"
    ),
}


def soak_config(url: str) -> dict[str, Any]:
    """The campaign soak's dagster.yaml on the storage at `url` (pure: test_instance_config.py
    reads it): the local instance's, and SOAK_DIFFERENCES."""
    local = apply_differences(production_config(), local_differences(url))
    return apply_differences(local, SOAK_DIFFERENCES)


def crash_stage_config(password: str, port: int, database: str) -> dict[str, object]:
    """The crash stage's dagster.yaml (pure: test_instance_config.py reads it)."""
    return apply_differences(
        instance_config(password, port, database=database), CRASH_STAGE_DIFFERENCES
    )


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
    config = crash_stage_config(password, port, database)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    with DagsterInstance.from_config(str(home)) as instance:
        instance.get_runs_count()  # creates the tables once
    # To kill the daemon between "run queued" and "run launched", its queue must not move:
    # the same storage, read through a configuration that dequeues once an hour.
    paused = tmp_path_factory.mktemp("crash-dagster-queue-paused")
    paused_config = apply_differences(config, QUEUE_PAUSED_DIFFERENCES)
    (paused / "dagster.yaml").write_text(yaml.safe_dump(paused_config))

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


def local_instance_stage(
    crash: CrashStage, home: Path, differences: Mapping[str, Difference] | None = None
) -> CrashStage:
    """The crash stage's database read by the local instance itself in `home`: production's
    dagster.yaml but for `local_differences` (`run_retries` and run monitoring production's)
    and the test's own `differences`, each named with its reason; none of the crash tests'."""
    crash_config = yaml.safe_load((crash.dagster_home / "dagster.yaml").read_text())
    url = crash_config["run_storage"]["config"]["postgres_url"]
    named = {**local_differences(url), **(differences or {})}
    config = apply_differences(production_config(), named)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    env = {**crash.env, "DAGSTER_HOME": str(home)}
    return dataclasses.replace(crash, dagster_home=home, env=env)


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
        hold_run_at: tuple[str, str] | None = None,
    ) -> None:
        """`armed` (about `about`: this test's episode, not another test's) is where the test
        strikes; `hold_run_at` (a point, about what) holds the run worker too, until the test
        `release`s `run_marker`, so the run is still working when `armed` is reached."""
        env = {**stage.env, "DAGSTER_HOME": str(dagster_home or stage.dagster_home)}
        self.marker = stage.logs / f"{label}.reached"
        self.run_marker = stage.logs / f"{label}.run-held"
        points = [(armed, self.marker, about)] if armed else []
        if hold_run_at:
            points.append((hold_run_at[0], self.run_marker, hold_run_at[1]))
        if points:
            env |= arming_env(points)
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
