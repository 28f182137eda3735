"""`episode-pipeline demo`: the whole pipeline, as in production, on the embedded local stack.

Sample episodes (both LeRobot layouts, several cameras) are uploaded like a robot would; the S3
notification puts a message on the queue; the Dagster daemon ticks the SQS sensor, which adds a
partition per episode and queues a run; the run processes the episode. The demo waits for every
episode row to leave `uploaded`/`processing`, prints what was written, and exits 0 only if every
sample was processed.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from episode_pipeline.config.settings import DatabaseSettings
from episode_pipeline.db import episodes as episode_db
from episode_pipeline.db.connection import connect
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.local.dev import SHUTDOWN_GRACE_SECONDS, WORKSPACE_FILE, dev_environment
from episode_pipeline.local.stack import StackInfo, start_stack
from episode_pipeline.local.stack_env import apply_local_stack_env, load_settings
from episode_pipeline.samples.writer import SampleSpec, av1_encoder, write_sample

DEMO_ORG = "demo-org"
WAIT_SECONDS = 600


def demo_samples() -> dict[str, SampleSpec]:
    """Name → sample: v3.0 and v2.1, several cameras, several LeRobot episodes, AV1 if we can."""
    samples = {
        "v30-two-cameras": SampleSpec(codebase_version="v3.0", cameras=2, seconds=4.0),
        "v21-two-episodes": SampleSpec(codebase_version="v2.1", cameras=2, seconds=3.0, episodes=2),
    }
    if av1_encoder():
        samples["v30-av1-three-cameras"] = SampleSpec(
            codebase_version="v3.0", cameras=3, seconds=2.0, codec="av1"
        )
    return samples


def _daemon_command() -> list[str]:
    executable = Path(sys.executable).parent / "dagster-daemon"
    return [str(executable), "run", "-w", str(WORKSPACE_FILE)]


@contextlib.contextmanager
def running_daemon(info: StackInfo) -> Iterator[subprocess.Popen[bytes]]:
    """The Dagster daemon against the stack (log in <home>/demo-daemon.log), stopped on exit:
    SIGTERM, then after the grace period SIGKILL to its whole process group."""
    with (Path(info.home) / "demo-daemon.log").open("wb") as log:
        daemon = subprocess.Popen(
            _daemon_command(),
            env=dev_environment(info.env),
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        try:
            yield daemon
        finally:
            daemon.terminate()
            try:
                daemon.wait(SHUTDOWN_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()


def _wait_for(
    refs: list[EpisodeRef], database: DatabaseSettings, timeout: float
) -> dict[EpisodeRef, str]:
    deadline = time.monotonic() + timeout
    statuses: dict[EpisodeRef, str] = {}
    while True:
        with connect(database) as conn:
            statuses = {ref: episode_db.episode_row(conn, ref)["status"] for ref in refs}
        pending = [ref for ref, status in statuses.items() if status in ("uploaded", "processing")]
        print(
            f"  {len(refs) - len(pending)}/{len(refs)} done: "
            + ", ".join(f"{ref.episode_id}={status}" for ref, status in statuses.items()),
            file=sys.stderr,
        )
        if not pending or time.monotonic() > deadline:
            return statuses
        time.sleep(5)


def run_demo() -> int:
    info = start_stack()
    from episode_pipeline.local.upload import upload_episode
    from episode_pipeline.report import episode_reports, format_reports

    apply_local_stack_env()
    settings = load_settings()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    refs = []
    with tempfile.TemporaryDirectory(prefix="demo-samples-") as tmp:
        for name, spec in demo_samples().items():
            ref = EpisodeRef(DEMO_ORG, f"{name}-{stamp}")
            archive = write_sample(Path(tmp) / f"{name}.tar.zst", spec)["archive"]
            key = upload_episode(Path(archive), ref, settings)
            print(f"uploaded s3://{info.bucket}/{key}", file=sys.stderr)
            refs.append(ref)

    print("starting the Dagster daemon: the SQS sensor hands each upload to a run", file=sys.stderr)
    with running_daemon(info):
        statuses = _wait_for(refs, settings.database, WAIT_SECONDS)

    reports = [report for ref in refs for report in episode_reports(ref, settings)]
    print(format_reports(reports))
    print(
        "\nSee it in the Dagster UI: `episode-pipeline dev`, then http://127.0.0.1:3000 —\n"
        "  Assets → robot_episodes (one partition per episode, with its checks and metadata;\n"
        "  every processed episode is fresh), docs/operations.md#a-tour-of-the-ui for the rest,\n"
        "  Runs (one per upload, tagged org=demo-org), Automation → episode_uploads.\n"
        f"Daemon log: {Path(info.home) / 'demo-daemon.log'}"
    )
    failed = [ref for ref, status in statuses.items() if status != "processed"]
    for ref in failed:
        print(
            f"demo: {ref} ended {statuses[ref]}: see `episode-pipeline status {ref}`",
            file=sys.stderr,
        )
    processed = [ref for ref in refs if ref not in failed]
    if processed:  # the last line: every camera of an episode on one clock, with its data
        print(f"\nLook at an episode (Ctrl-C stops it):\n  {invoked_as()} view {processed[0]}")
    return 1 if failed else 0


def invoked_as() -> str:
    """This command as the user typed it (`.venv/bin/episode-pipeline` from `make demo`), so
    the line printed works as printed."""
    typed = sys.argv[0] if sys.argv and Path(sys.argv[0]).name == "episode-pipeline" else None
    return shlex.quote(typed) if typed else "episode-pipeline"
