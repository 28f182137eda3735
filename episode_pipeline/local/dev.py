"""`episode-pipeline dev`: the local stack, then `dagster dev` (webserver + daemon) against it.

`dagster dev` is started from Python with its own session: a shell `&` start ignores SIGINT and
SIGTERM (docs/platform-notes.md#dagster-dev). Ctrl-C or SIGTERM here is forwarded to it as
SIGTERM, its graceful shutdown; once it has gone (or after 30 s) whatever remains of its process
group is stopped too. Should this process die without stopping it (SIGKILL), `dagster dev` gets
SIGTERM from the kernel (PR_SET_PDEATHSIG). The stack keeps running afterwards (`episode-pipeline
stack down` stops it, and anything still started against it). Beside the UI, a thread of this
process serves the episode viewer (the UI's port + 1) for every episode of the stack, and
`dagster dev` gets its address as VIEWER_URL: the `episode` asset's `viewer` links there.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from episode_pipeline.config.settings import METRICS_OUTPUT_ENV, AwsSettings
from episode_pipeline.local.stack import start_stack
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.viewer.server import ViewerServer, missing_libraries

DEFAULT_PORT = 3000
VIEWER_URL_ENV = "VIEWER_URL"  # Settings.viewer_url
METRICS_FILE = "metrics.jsonl"
SHUTDOWN_GRACE_SECONDS = 30
PR_SET_PDEATHSIG = 1  # linux/prctl.h


# The code location `episode_pipeline`, as production's workspace.yaml names it.
WORKSPACE_FILE = Path(__file__).with_name("workspace.yaml")


def dagster_command(port: int = DEFAULT_PORT) -> list[str]:
    """`dg dev` on the local workspace file: with `-w` it is `dagster dev`'s own server, and it
    does not print the `SupersessionWarning` `dagster dev` prints at every start in 1.13."""
    executable = Path(sys.executable).parent / "dg"
    base = (
        [str(executable)] if executable.exists() else [sys.executable, "-m", "dagster_dg_cli.cli"]
    )
    return [*base, "dev", "-w", str(WORKSPACE_FILE), "-h", "127.0.0.1", "-p", str(port)]


def dev_environment(stack_env: dict[str, str]) -> dict[str, str]:
    """Our environment plus the stack's; DB_HOST and friends point at the embedded services.

    The metric lines (CloudWatch's, in production a log stream) go to a file of the stack's
    (`metrics_file`), not among the daemon's lines in the terminal, unless METRICS_OUTPUT is
    exported."""
    return {METRICS_OUTPUT_ENV: str(metrics_file(stack_env)), **os.environ, **stack_env}


def metrics_file(stack_env: dict[str, str]) -> Path:
    """Where `dev` and `demo` append the metric lines: beside the stack's DAGSTER_HOME."""
    return Path(stack_env["DAGSTER_HOME"]).with_name(METRICS_FILE)


GROUP_EXIT_SECONDS = 5  # for what remains of the group once `dagster dev` has gone


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a zombie leader not yet reaped still counts
        return True
    return True


def _end_group(pgid: int) -> None:
    """SIGTERM whatever is left of the process group, SIGKILL it after GROUP_EXIT_SECONDS."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + GROUP_EXIT_SECONDS
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _group_alive(pgid):
            return


def stop_dagster_dev(process: subprocess.Popen[bytes]) -> int:
    """Stop `dagster dev` and everything it started; returns its exit code.

    SIGTERM to `dagster dev` alone: it stops the webserver and the daemon first, then its code
    server, in ~2 s. SIGINT to the whole group would make each child stop on its own, and
    `dagster dev` hangs. Whatever of the
    group outlives it (a code server, a run worker) is then stopped, SIGKILL if it must.
    """
    process.terminate()
    try:
        code = process.wait(SHUTDOWN_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        code = process.wait()
    _end_group(process.pid)  # `dagster dev` led its own session: its pid is the group's id
    return code


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when `episode-pipeline dev` dies, even by SIGKILL,
    so `dagster dev` (and through it its code server) never outlives us."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def start_viewer(stack_env: dict[str, str], port: int) -> ViewerServer | None:
    """The episode viewer for every episode of the stack, in this process (a thread): its
    address goes to `dagster dev` as VIEWER_URL, so the `episode` asset links to its pages.
    None (said why) when the viewer's npm libraries are missing."""
    missing = missing_libraries()
    if missing:
        print(
            f"no episode viewer: {', '.join(missing)} missing (scripts/bootstrap.sh)",
            file=sys.stderr,
        )
        return None
    bucket = Bucket(stack_env["DATA_BUCKET"], AwsSettings.from_env(stack_env))
    try:
        viewer = ViewerServer(bucket, port)
    except OSError:  # the port is taken: any free one
        viewer = ViewerServer(bucket, 0)
    viewer.start()
    return viewer


def run_dev(port: int = DEFAULT_PORT) -> int:
    """Run `dagster dev` until it exits or we are interrupted; returns its exit code."""
    info = start_stack()
    print(f"local stack ready in {info.home}; Dagster on http://127.0.0.1:{port}", file=sys.stderr)
    viewer = start_viewer(info.env, port + 1)
    env = dev_environment(info.env)
    print(f"metrics (CloudWatch EMF lines) in {env[METRICS_OUTPUT_ENV]}", file=sys.stderr)
    if viewer is not None:
        env[VIEWER_URL_ENV] = viewer.base_url
        print(
            f"episode viewer on {viewer.base_url}/e/ORG/EP/ (the episode asset links to it)",
            file=sys.stderr,
        )
    # Ctrl-C raises KeyboardInterrupt here and SIGTERM does too. Installing handlers (rather
    # than inheriting "ignore", as a shell `&` start does) also means the child starts with
    # default dispositions, so `dagster dev` honours the SIGTERM we forward.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    process = subprocess.Popen(
        dagster_command(port),
        env=env,
        # From the instance's own folder: started where another dagster.yaml lies (the
        # repository's, production's), the dev server warns that it is not the one used.
        cwd=info.dagster_home,
        start_new_session=True,
        preexec_fn=_die_with_parent if sys.platform == "linux" else None,
    )
    try:
        return process.wait()
    except KeyboardInterrupt:
        stop_dagster_dev(process)
        return 130
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)
        if viewer is not None:
            viewer.shutdown()
            viewer.server_close()
