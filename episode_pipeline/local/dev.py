"""`episode-pipeline dev`: the local stack, then `dagster dev` (webserver + daemon) against it.

`dagster dev` is started from Python with its own session: a shell `&` start ignores SIGINT and
SIGTERM (docs/platform-notes.md#dagster-dev). Ctrl-C or SIGTERM here is forwarded to it as
SIGTERM, its graceful shutdown; whatever remains of its process group after 30 s is killed. The
stack keeps running afterwards (`episode-pipeline stack down` stops it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

from episode_pipeline.local.stack import start_stack

DEFAULT_PORT = 3000
SHUTDOWN_GRACE_SECONDS = 30


# The code location `episode_pipeline`, as production's workspace.yaml names it.
WORKSPACE_FILE = Path(__file__).with_name("workspace.yaml")


def dagster_command(port: int = DEFAULT_PORT) -> list[str]:
    executable = Path(sys.executable).parent / "dagster"
    base = [str(executable)] if executable.exists() else [sys.executable, "-m", "dagster"]
    return [*base, "dev", "-w", str(WORKSPACE_FILE), "-h", "127.0.0.1", "-p", str(port)]


def dev_environment(stack_env: dict[str, str]) -> dict[str, str]:
    """Our environment plus the stack's; DB_HOST and friends point at the embedded services."""
    return {**os.environ, **stack_env}


def _stop(process: subprocess.Popen[bytes]) -> int:
    # SIGTERM to `dagster dev` alone: it stops its webserver, daemon and code server in ~2 s.
    # (SIGINT to the whole group makes each child shut down on its own and `dagster dev` hangs.)
    process.terminate()
    try:
        return process.wait(SHUTDOWN_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        return process.wait()


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run_dev(port: int = DEFAULT_PORT) -> int:
    """Run `dagster dev` until it exits or we are interrupted; returns its exit code."""
    info = start_stack()
    print(f"local stack ready in {info.home}; Dagster on http://127.0.0.1:{port}", file=sys.stderr)
    # Ctrl-C raises KeyboardInterrupt here and SIGTERM does too. Installing handlers (rather
    # than inheriting "ignore", as a shell `&` start does) also means the child starts with
    # default dispositions, so `dagster dev` honours the SIGTERM we forward.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    process = subprocess.Popen(
        dagster_command(port), env=dev_environment(info.env), start_new_session=True
    )
    try:
        return process.wait()
    except KeyboardInterrupt:
        _stop(process)
        return 130
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)
