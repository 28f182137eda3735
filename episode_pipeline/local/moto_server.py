"""The moto server process: S3, SQS, ECS and CloudWatch Logs over HTTP on 127.0.0.1.

Started detached (its own session, so Ctrl-C in the terminal that ran `stack up` does not reach
it), with a pid file and a log file in the stack home, and stopped by pid. Moto keeps all state
in memory; see `s3_snapshot` for what survives a restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from episode_pipeline.local.pg_server import process_gone, wait_gone

PID_FILE = "moto.pid"
LOG_FILE = "moto.log"


def endpoint(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def answers(port: int, timeout: float = 1.0) -> bool:
    """True when a moto server answers on the port (its cheap `/moto-api/config` endpoint)."""
    try:
        with urllib.request.urlopen(f"{endpoint(port)}/moto-api/config", timeout=timeout) as resp:
            json.loads(resp.read())
            return 200 <= resp.status < 300  # moto answers 201
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _is_moto(pid: int) -> bool:
    try:
        cmdline = psutil.Process(pid).cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return any("moto" in part for part in cmdline) and not process_gone(pid)


def running_pid(home: Path) -> int | None:
    """The pid from the pid file when that process is alive and is a moto server."""
    try:
        pid = int((home / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _is_moto(pid) else None


def start_moto(home: Path, port: int) -> int:
    """Spawn moto's server (`local.moto_main`: its SQS receive linear in the queue's depth) on
    127.0.0.1:port; returns at once (see `wait_ready`)."""
    log = (home / LOG_FILE).open("wb")  # one start per log: it logs every request
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    env.pop("AWS_ENDPOINT_URL", None)  # moto must not proxy to itself or a previous stack
    with log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "episode_pipeline.local.moto_main",
                "-H",
                "127.0.0.1",
                "-p",
                str(port),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=home,
            env=env,
        )
    (home / PID_FILE).write_text(f"{process.pid}\n")
    return process.pid


def wait_ready(home: Path, pid: int, port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not answers(port, timeout=0.5):
        if process_gone(pid):
            tail = (home / LOG_FILE).read_text(errors="replace")[-2000:]
            raise RuntimeError(f"moto server exited at start; log {home / LOG_FILE}:\n{tail}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"moto server did not answer on port {port} within {timeout}s")
        time.sleep(0.05)


def stop_moto(home: Path) -> None:
    """SIGTERM the server from the pid file (SIGKILL after 10 s) and remove the pid file."""
    pid = running_pid(home)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not wait_gone(pid, 10):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            wait_gone(pid, 10)
        _reap(pid)
    (home / PID_FILE).unlink(missing_ok=True)


def _reap(pid: int) -> None:
    """Collect the exit status when this process started moto (else it lingers as a zombie)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)  # called once the process is gone: returns at once
