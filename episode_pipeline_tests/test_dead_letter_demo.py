"""`episode-pipeline demo --with-failure` on a stack of its own, with the real daemon: a failing
upload reaches the dead-letter queue through short queue timing, `dlq list` shows it, and after
the fix `dlq redrive` gets it processed (docs/operations.md#the-dead-letter-queue-locally)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from episode_pipeline.local.stack import stack_status, stop_stack
from episode_pipeline.local.stack_env import HOME_ENV

pytestmark = pytest.mark.integration

# The session's stack exports these; the demo must reach only its own.
_SESSION_PREFIXES = ("AWS_", "DB_", "SQS_", "DATA_BUCKET", "DAGSTER_HOME", HOME_ENV)


@pytest.mark.slow(seconds=200)
def test_the_dead_letter_round_trip(tmp_path: Path) -> None:
    home = tmp_path / "dlq-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SESSION_PREFIXES)}
    env |= {
        HOME_ENV: str(home),
        # Shorter than the demo's own 20 s / 2: the same path, in about a minute.
        "SQS_VISIBILITY_TIMEOUT_SECONDS": "6",
        "SQS_MAX_RECEIVE_COUNT": "2",
    }
    try:
        done = subprocess.run(
            [sys.executable, "-m", "episode_pipeline.cli", "demo", "--with-failure"],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        out = done.stdout
        assert "in the dead-letter queue" in out
        listed = out.split("$ episode-pipeline dlq list")[1].split("the fix:")[0]
        assert "has no row in `episodes`" in listed  # the failed run's error
        assert "moved 1 message(s) back to the upload queue" in out
        assert " processed " in out.split("$ episode-pipeline status")[1]
        # The stack had no timing before the demo: production's is put back.
        assert "queue timing put back: visibility 900 s, to the DLQ after 3 receives" in out
        assert stack_status(home).env["SQS_HEARTBEAT_SECONDS"] == "240"
    finally:
        stop_stack(home, save_objects=False)
