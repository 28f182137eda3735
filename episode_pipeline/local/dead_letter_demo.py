"""`episode-pipeline demo --with-failure`: one upload's way to the dead-letter queue and back.

An episode is uploaded whose row the application never created (the contract: the pipeline
updates the row, it does not create it), so every run of it fails. With the stack's queue set
to a short visibility timeout and few receives (SQS_VISIBILITY_TIMEOUT_SECONDS=20,
SQS_MAX_RECEIVE_COUNT=2 unless set otherwise), the real daemon and sensor take it to the
dead-letter queue in a minute or two instead of 45. The demo then shows `dlq list`, applies the
fix (creates the row), runs `dlq redrive`, and waits for the sensor's retry to process it. The
queue's previous timing is put back at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from dagster import DagsterInstance

from episode_pipeline.config.settings import Settings
from episode_pipeline.db import episodes as episode_db
from episode_pipeline.db.connection import connect
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_tags import IN_FLIGHT_STATUSES
from episode_pipeline.local.aws_setup import QueueTiming
from episode_pipeline.local.demo import DEMO_ORG, running_daemon
from episode_pipeline.local.stack import stack_status, start_stack
from episode_pipeline.local.stack_env import apply_local_stack_env, load_settings
from episode_pipeline.orchestration.runs import latest_run_of_episode
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline.uploads.dead_letters import peek
from episode_pipeline.uploads.upload_queue import UploadQueue

DEMO_TIMING = QueueTiming(visibility_timeout_seconds=20, max_receive_count=2)
WAIT_SECONDS = 600
POLL_SECONDS = 5
_TIMING_ENV = tuple(QueueTiming().env())


def _cli(*argv: str) -> str:
    """Our own command, as the reader would type it; its output is shown as is."""
    executable = Path(sys.executable).parent / "episode-pipeline"
    command = (
        [str(executable)] if executable.exists() else [sys.executable, "-m", "episode_pipeline.cli"]
    )
    print(f"$ episode-pipeline {' '.join(argv)}", flush=True)
    done = subprocess.run(
        [*command, *argv], capture_output=True, text=True, timeout=300, check=True
    )
    print(done.stdout.rstrip(), flush=True)
    return done.stdout


def _wait(what: str, done: Callable[[], bool], timeout: float = WAIT_SECONDS) -> float:
    started = time.monotonic()
    while not done():
        waited = time.monotonic() - started
        if waited > timeout:
            raise TimeoutError(f"demo: no {what} after {timeout:.0f} s")
        print(f"  waiting for {what}: {waited:.0f} s", file=sys.stderr, flush=True)
        time.sleep(POLL_SECONDS)
    return time.monotonic() - started


def _with_timing(timing: dict[str, str]) -> None:
    os.environ.update(timing)
    start_stack()


def run_dead_letter_demo() -> int:
    before = {name: value for name, value in stack_status().env.items() if name in _TIMING_ENV}
    timing = QueueTiming.from_env(os.environ, DEMO_TIMING.env())  # the reader's values win
    _with_timing(timing.env())
    try:
        return _dead_letter_round_trip()
    finally:
        for name in _TIMING_ENV:
            os.environ.pop(name, None)
        _with_timing(before or QueueTiming().env())
        print(f"queue timing put back: {stack_status().queue_timing()}")


def _dead_letter_round_trip() -> int:
    info = start_stack()
    apply_local_stack_env()
    settings = load_settings()
    print(f"queue: {info.queue_timing()}")
    ref = EpisodeRef(DEMO_ORG, f"dead-letter-{time.strftime('%Y%m%d-%H%M%S')}")
    _upload_without_row(settings, ref)
    dlq = UploadQueue(settings.dlq_url or "", settings.aws)

    def dead_lettered() -> bool:
        return any(
            upload.partition_key == ref.partition_key
            for letter in peek(dlq)
            for upload in letter.uploads
        )

    with running_daemon(info):
        seconds = _wait("the upload in the dead-letter queue", dead_lettered)
        print(f"\n{ref}: in the dead-letter queue {seconds:.0f} s after its upload\n")
        _cli("dlq", "list")
        print("\nthe fix: the application creates the episode row it should have made first")
        with connect(settings.database, autocommit=True) as conn:
            episode_db.ensure_episode_row(conn, ref)
        _cli("dlq", "redrive", ref.partition_key)

        redriven_at = time.time()

        def settled() -> bool:
            # `failed` alone may be the earlier runs' failure reaching the new row late (the
            # run-failure sensor): only a run started after the redrive, now ended, settles it.
            with connect(settings.database) as conn:
                row = episode_db.episode_row(conn, ref)
            if row is None or row["status"] == "processed":
                return row is not None
            with DagsterInstance.get() as instance:
                run = latest_run_of_episode(instance, ref)
                record = instance.get_run_record_by_id(run.run_id) if run else None
            return (
                record is not None
                and record.create_timestamp.timestamp() >= redriven_at
                and record.dagster_run.status not in IN_FLIGHT_STATUSES
            )

        _wait("the sensor's retry to finish", settled)
    _cli("status", ref.partition_key)
    with connect(settings.database) as conn:
        status = episode_db.episode_row(conn, ref)["status"]
    return 0 if status == "processed" else 1


def _upload_without_row(settings: Settings, ref: EpisodeRef) -> None:
    from episode_pipeline.local.upload import upload_episode

    with tempfile.TemporaryDirectory(prefix="demo-dead-letter-") as tmp:
        archive = write_sample(Path(tmp) / "take.tar.zst", SampleSpec(seconds=1.0, cameras=1))
        key = upload_episode(Path(archive["archive"]), ref, settings)
    with connect(settings.database, autocommit=True) as conn:  # the fault
        conn.execute("DELETE FROM episodes WHERE id = %s", (ref.episode_id,))
    print(f"uploaded s3://{settings.bucket}/{key} without its episode row: every run will fail")
