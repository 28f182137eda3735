"""`episode-pipeline dev` on the real stack leaves nothing running: Ctrl-C stops it cleanly, and
when it is killed outright its `dagster dev` and code server still go (the kernel tells them,
PR_SET_PDEATHSIG).

Ctrl-C leaves no failed tick: locally sensors tick one after another, so none starts while the
daemon shuts down (docs/operations.md#what-keeps-running-and-how-to-stop-it)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from episode_pipeline.local import aws_setup
from episode_pipeline.local.stack import StackInfo
from episode_pipeline_tests.dagster_ui import STARTUP_SECONDS, free_port

pytestmark = pytest.mark.integration

TICKED = "Checking for new runs for sensor: episode_uploads"
GONE_SECONDS = 60  # dev's own 30 s grace plus the group's, on a loaded machine
REPO = Path(__file__).resolve().parents[1]


def _alive(processes: list[psutil.Process]) -> list[str]:
    left = []
    for process in processes:
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                left.append(" ".join(process.cmdline())[:120])
        except psutil.NoSuchProcess:
            pass
    return left


def _wait_gone(processes: list[psutil.Process], timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while (left := _alive(processes)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


class Dev:
    def __init__(self, process: subprocess.Popen[bytes], log: Path) -> None:
        self.process, self.log = process, log

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_a_tick(self) -> None:
        deadline = time.monotonic() + STARTUP_SECONDS
        while TICKED not in self.text():
            assert self.process.poll() is None, self.text()[-3000:]
            assert time.monotonic() < deadline, f"no sensor tick:\n{self.text()[-3000:]}"
            time.sleep(0.5)

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.process.pid).children(recursive=True)


@pytest.fixture
def dev(stack: StackInfo, tmp_path: Path) -> Iterator[Dev]:
    """`episode-pipeline dev` on the session stack, its queue purged (the daemon would run
    earlier tests' uploads again), its output in a file."""
    assert stack.s3_endpoint is not None
    sqs = aws_setup.client("sqs", stack.s3_endpoint)
    # One purge a minute: within it, the previous test's purge has done it.
    with contextlib.suppress(sqs.exceptions.PurgeQueueInProgress):
        sqs.purge_queue(QueueUrl=stack.sqs_queue_url)
    log = tmp_path / "dev.log"
    command = [str(Path(sys.executable).parent / "episode-pipeline"), "dev"]
    with log.open("wb") as output:
        process = subprocess.Popen(
            [*command, "--port", str(free_port())],
            env=os.environ.copy(),
            cwd=REPO,  # where a newcomer types it, beside the repository's dagster.yaml
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    started = Dev(process, log)
    try:
        yield started
    finally:
        for child in started.descendants() if process.poll() is None else []:
            child.kill()
        process.kill()
        process.wait()


def test_ctrl_c_stops_dev_and_leaves_nothing(dev: Dev) -> None:
    dev.wait_for_a_tick()
    started = dev.text()
    # A clean start: not `dagster dev`'s SupersessionWarning, not "Found a dagster instance
    # configuration value (dagster.yaml) in the current folder, but your DAGSTER_HOME …".
    assert "SupersessionWarning" not in started and "superseded" not in started
    assert "dagster instance configuration value" not in started
    children = dev.descendants()
    assert len(children) >= 3  # dagster dev, its webserver, daemon and code server

    dev.process.send_signal(signal.SIGINT)  # what Ctrl-C sends

    assert dev.process.wait(GONE_SECONDS) == 130
    assert _wait_gone(children, 5) == []
    assert "Dagster services shut down." in dev.text()
    assert "Sensor tick caught an error" not in dev.text()


def test_a_killed_dev_takes_dagster_dev_and_its_code_server_with_it(dev: Dev) -> None:
    dev.wait_for_a_tick()
    children = dev.descendants()

    dev.process.kill()  # nothing of ours runs: only the kernel can tell the children
    dev.process.wait()

    assert _wait_gone(children, GONE_SECONDS) == []
