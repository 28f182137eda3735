"""PostgreSQL dies under a running daemon and `stack up` brings it back on the same port.

A real `dagster-daemon run` (the local instance's pooled storages, its code server, run workers)
works against a stack of its own. The postmaster is killed with SIGKILL, as a crash would; one
upload was sent just before and one is sent while PostgreSQL is down (its row exists: the
application wrote it earlier). `start_stack` starts PostgreSQL again on the port the daemon was
given; the daemon is never restarted. Every sensor must tick again within two minutes (the
instance's tick history) and every upload must end processed by exactly one successful run.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from episode_pipeline.config.settings import Settings
from episode_pipeline.db.connection import connect
from episode_pipeline.db.episodes import ensure_episode_row, episode_row, frame_rows
from episode_pipeline.defs.sensors.reconcile import (
    STALE_PROCESSING_SENSOR_NAME,
    WAITING_UPLOADS_SENSOR_NAME,
)
from episode_pipeline.defs.sensors.retention import RETENTION_SENSOR_NAME
from episode_pipeline.defs.sensors.sqs import (
    HEARTBEAT_SENSOR_NAME,
    UPLOAD_DONE_SENSOR_NAME,
    UPLOADS_SENSOR_NAME,
)
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_tags import PARTITION_TAG
from episode_pipeline.local.stack import StackInfo, start_stack, stop_stack
from episode_pipeline.local.upload import archive_key, upload_episode
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.uploads.upload_queue import UploadQueue
from episode_pipeline_tests.support.daemon import (
    REPO,
    VISIBILITY_SECONDS,
    CrashStage,
    Daemon,
    kill_leftovers,
    wait_until,
)
from episode_pipeline_tests.support.dagster_internals import InstigatorType
from episode_pipeline_tests.support.queues import depth

pytestmark = pytest.mark.integration

FPS = 30
BACK_SECONDS = 120  # every sensor ticks again within this once PostgreSQL is back
FIRST_RUN_SECONDS = 240  # the daemon's start and a first upload processed
CONVERGE_SECONDS = 300
# Ticks one after another, in one loop (local sensors run without threads), so these too tick
# again when due; their intervals are longer than the window.
LONGER_INTERVALS = {STALE_PROCESSING_SENSOR_NAME: 120, RETENTION_SENSOR_NAME: 600}
MUST_TICK = {
    UPLOADS_SENSOR_NAME,
    UPLOAD_DONE_SENSOR_NAME,
    HEARTBEAT_SENSOR_NAME,
    WAITING_UPLOADS_SENSOR_NAME,
    "episode_failed_on_run_failure",
    "orphaned_runs",
}


@pytest.fixture(scope="module")
def own_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[StackInfo, CrashStage]]:
    home = tmp_path_factory.mktemp("pg-restart-stack")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SQS_VISIBILITY_TIMEOUT_SECONDS", str(VISIBILITY_SECONDS))
        info = start_stack(home)
    assert info.dagster_home and info.sqs_queue_url and info.dlq_url
    daemon_env = {
        **os.environ,
        **info.env,
        "PYTHONPATH": str(REPO),
        "TMPDIR": str(tmp_path_factory.mktemp("pg-restart-tmp")),
        "RECONCILE_INTERVAL_SECONDS": "30",  # waiting_uploads ticks within the window too
    }
    settings = Settings.from_env(info.env)
    stage = CrashStage(
        settings=settings,
        queue=UploadQueue(info.sqs_queue_url, settings.aws),
        dlq=UploadQueue(info.dlq_url, settings.aws),
        dagster_home=Path(info.dagster_home),
        queue_paused_home=Path(info.dagster_home),
        env=daemon_env,
        logs=tmp_path_factory.mktemp("pg-restart-logs"),
    )
    try:
        yield info, stage
    finally:
        kill_leftovers({info.dagster_home})
        stop_stack(home, save_objects=False)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pg-restart-sample") / "take.tar.zst"
    write_sample(out, SampleSpec(seconds=1.0, cameras=1, fps=FPS))
    return out


def _kill_postmaster(pid: int) -> None:
    postmaster = psutil.Process(pid)
    family = [postmaster, *postmaster.children(recursive=True)]
    postmaster.kill()
    _, alive = psutil.wait_procs(family, timeout=30)
    assert alive == []


def latest_ticks(instance: DagsterInstance) -> dict[str, float]:
    """Each sensor's newest tick, from the instance's tick history."""
    latest = {}
    for state in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR):
        ticks = instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=1)
        if ticks:
            latest[state.name] = ticks[0].timestamp
    return latest


def processed_once(stage: CrashStage, instance: DagsterInstance, refs: list[EpisodeRef]) -> bool:
    with connect(stage.settings.database) as conn:
        statuses = {episode_row(conn, ref)["status"] for ref in refs}
    succeeded = [
        instance.get_runs_count(
            RunsFilter(tags={PARTITION_TAG: ref.partition_key}, statuses=[DagsterRunStatus.SUCCESS])
        )
        for ref in refs
    ]
    return (
        statuses == {"processed"} and succeeded == [1] * len(refs) and depth(stage.queue) == (0, 0)
    )


@pytest.mark.slow(seconds=145)
def test_a_postgres_crash_under_a_running_daemon_loses_no_upload(
    own_stack: tuple[StackInfo, CrashStage], archive: Path
) -> None:
    info, stage = own_stack
    first, before, during = (
        EpisodeRef("test-org", f"ep-pg-{name}-{uuid.uuid4().hex[:6]}")
        for name in ("first", "before", "during")
    )
    daemon = Daemon(stage, "pg-restart")
    try:
        upload_episode(archive, first, stage.settings)
        with DagsterInstance.from_config(str(stage.dagster_home)) as instance:
            wait_until(
                lambda: processed_once(stage, instance, [first]),
                FIRST_RUN_SECONDS,
                lambda: f"the first upload was not processed:\n{daemon.tail()}",
            )
        with connect(stage.settings.database, autocommit=True) as conn:
            ensure_episode_row(conn, during)  # the application's row, written before the crash
        upload_episode(archive, before, stage.settings)

        assert info.postgres_pid is not None
        _kill_postmaster(info.postgres_pid)
        Bucket(stage.settings.bucket, stage.settings.aws).upload_file(
            archive, archive_key(archive, during)
        )
        time.sleep(5)  # the daemon's sensors, its code server and a run meet the outage
        restarted = start_stack(Path(info.home))
        back_at = time.time()
        assert restarted.postgres_port == info.postgres_port
        assert restarted.postgres_pid != info.postgres_pid

        with DagsterInstance.from_config(str(stage.dagster_home)) as instance:

            def ticked_again() -> set[str]:
                ticks = latest_ticks(instance)
                return {name for name in MUST_TICK | set(ticks) if ticks.get(name, 0) > back_at}

            expected = (MUST_TICK | set(latest_ticks(instance))) - set(LONGER_INTERVALS)
            wait_until(
                lambda: expected <= ticked_again(),
                BACK_SECONDS,
                lambda: f"not ticked again: {sorted(expected - ticked_again())}\n{daemon.tail()}",
            )
            wait_until(
                lambda: processed_once(stage, instance, [first, before, during]),
                CONVERGE_SECONDS,
                lambda: f"uploads not processed exactly once:\n{daemon.tail()}",
            )
            for ref in (first, before, during):
                runs = instance.get_runs(RunsFilter(tags={PARTITION_TAG: ref.partition_key}))
                assert [r.status for r in runs].count(DagsterRunStatus.SUCCESS) == 1
    finally:
        daemon.stop()
    with connect(stage.settings.database) as conn:
        assert [frame_rows(conn, ref) for ref in (first, before, during)] == [FPS] * 3
    assert depth(stage.dlq) == (0, 0)
