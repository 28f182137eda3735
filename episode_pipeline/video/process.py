"""Run a child program under a deadline, killing its whole process group when it is late.

FFmpeg and the PyAV probe child are the only programs the transcode waits on. Either can hang on
a hostile file (an endless stream, a stuck demuxer), and a shell stand-in or FFmpeg itself may
start children of its own, so the child gets its own session (`start_new_session`) and a late
one is ended with `os.killpg(SIGKILL)`: nothing it started survives it.

Being in its own session also takes the child out of its parent's process group, so killing the
parent's group would miss it. The parent therefore keeps the children it waits on, and
`kill_running_children` (the transcode program's SIGTERM handler) ends their groups first;
`terminate_group` is how a parent asks: SIGTERM, a grace period, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

TERMINATE_GRACE_SECONDS = 10.0

_running: set[subprocess.Popen] = set()
_running_lock = threading.Lock()


class DeadlineExceeded(RuntimeError):
    """The child ran past its deadline and its process group was killed."""

    def __init__(self, what: str, seconds: float, stdout: str = "", stderr: str = "") -> None:
        super().__init__(f"{what} exceeded its deadline of {seconds:g} s and was killed")
        self.seconds = seconds
        self.stdout = stdout  # what it wrote before it was killed
        self.stderr = stderr


def available_cpus() -> int:
    """CPUs this process may run on (a Fargate task's vCPUs; a container's cpuset)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def kill_group(process: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Signal the child's process group (it leads its own session); quiet if already gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


def terminate_group(process: subprocess.Popen, grace: float = TERMINATE_GRACE_SECONDS) -> None:
    """SIGTERM the child's group, give it `grace` seconds to clean up (its own children), then
    SIGKILL the group; returns once the child is reaped."""
    kill_group(process, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace)
    kill_group(process)
    process.wait()


def kill_running_children() -> None:
    """SIGKILL the group of every child `run_with_deadline` is waiting on in this process."""
    with _running_lock:
        children = list(_running)
    for child in children:
        kill_group(child)


def run_with_deadline(
    command: Sequence[str],
    seconds: float,
    *,
    what: str | None = None,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `command` to completion, capturing its output; DeadlineExceeded after `seconds`.

    Any other interruption (an exception in this thread, Ctrl-C) kills the group as well, so no
    FFmpeg outlives the code that started it.
    """
    process = subprocess.Popen(
        list(command),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        cwd=cwd,
        start_new_session=True,
    )
    with _running_lock:
        _running.add(process)
    try:
        stdout, stderr = process.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        kill_group(process)
        stdout, stderr = process.communicate()
        raise DeadlineExceeded(what or Path(command[0]).name, seconds, stdout, stderr) from None
    except BaseException:
        kill_group(process)
        process.communicate()
        raise
    finally:
        with _running_lock:
            _running.discard(process)
    return subprocess.CompletedProcess(list(command), process.returncode, stdout, stderr)
