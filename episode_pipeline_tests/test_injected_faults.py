"""Faults injected on the real stack (docs/faults.md).

- S3, through a fault-injecting proxy (fault_proxy.py) between the pipeline and the moto server:
  500/503 answers and responses slower than the read timeout, during extraction, the frames
  download and the HLS upload. The run succeeds after retries, and what it wrote equals a clean
  run's.
- S3 refusing every attempt of the HLS playlists' PUTs (503 SlowDown, Retry-After: 1) on a
  re-run of a processed episode: the step is retried, then the run fails naming the cause, the
  episode is `failed`, and the first run's HLS is all still there.
- PostgreSQL during the frames COPY: the connection cut by a proxy, and a real server restart.
  The transaction rolls back (never half the rows), the episode is `failed`, the retry writes
  every row once.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterEventType, DagsterInstance

from episode_pipeline.config.settings import S3Deadlines, Settings
from episode_pipeline.db.connection import connect
from episode_pipeline.db.episodes import ensure_episode_row, episode_row, frame_rows
from episode_pipeline.db.migrate import apply_migrations
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.episodes.timeline import TIMELINE_NAME
from episode_pipeline.local.pg_server import init_cluster, start_postgres, stop_postgres
from episode_pipeline.orchestration.failures import failure_cause
from episode_pipeline.runner import process_episode
from episode_pipeline.runtime.failure_causes import STORAGE, retry_after_seconds
from episode_pipeline.runtime.injection_points import (
    INJECTION_ABOUT_ENV,
    INJECTION_POINT_ENV,
    MID_COPY,
    release,
)
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.video.playlist import parse_master, parse_playlist
from episode_pipeline_tests.dagster_ui import free_port
from episode_pipeline_tests.fault_proxy import CopyCuttingProxy, FaultPlan, FaultProxy

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "take.tar.zst"
    write_sample(out, SampleSpec(seconds=1.0, cameras=1))
    return out


@pytest.fixture
def private(settings: Settings) -> Settings:
    """The session's settings with a bucket of its own (no notifications: no queue involved)."""
    own = dataclasses.replace(settings, bucket=f"faults-{uuid.uuid4().hex[:8]}")
    Bucket(own.bucket, own.aws).client.create_bucket(
        Bucket=own.bucket, CreateBucketConfiguration={"LocationConstraint": own.aws.region}
    )
    return own


def processed_objects(bucket: Bucket, ref: EpisodeRef) -> dict[str, str]:
    """Relative key → ETag of what the run wrote (its own bookkeeping JSON names the episode);
    the timeline, which names it too, by its text with the episode's name taken out."""
    objects = {
        info.key.removeprefix(ref.processed_prefix): info.etag
        for info in bucket.iter_objects(ref.processed_prefix)
        if "/_dagster/" not in info.key
    }
    timeline = bucket.get_bytes(ref.processed_prefix + TIMELINE_NAME).decode()
    for name in (ref.prefix, ref.partition_key, ref.org_id, ref.episode_id):
        timeline = timeline.replace(name, "<episode>")
    objects[TIMELINE_NAME] = timeline
    return objects


def test_s3_errors_and_slow_answers_are_retried_and_the_outputs_equal_a_clean_runs(
    private: Settings, archive: Path
) -> None:
    bucket = Bucket(private.bucket, private.aws)
    clean, faulty = (EpisodeRef("test-org", f"ep-faults-{uuid.uuid4().hex[:8]}") for _ in "ab")
    with connect(private.database, autocommit=True) as conn:
        for ref in (clean, faulty):
            ensure_episode_row(conn, ref)
            bucket.upload_file(archive, f"{ref.prefix}take.tar.zst")
    instance = DagsterInstance.get()
    assert process_episode(clean, instance, private).success

    # 30 % of requests fail twice (503, then 500); 15 % answer after 2 s, past a 1 s read timeout.
    plan = FaultPlan(error_share=0.3, failures=2, slow_share=0.15, slow_seconds=2.0)
    assert private.aws.endpoint_url is not None
    with FaultProxy(private.aws.endpoint_url, plan) as proxy:
        through_proxy = dataclasses.replace(
            private,
            aws=dataclasses.replace(private.aws, endpoint_url=proxy.url),
            s3_deadlines=S3Deadlines(read_timeout_seconds=1, max_attempts=5),
        )
        outcome = process_episode(faulty, instance, through_proxy)

    assert outcome.success, outcome.errors
    assert plan.injected["error"] >= 10 and plan.injected["slow"] >= 3, plan.injected
    assert processed_objects(bucket, faulty) == processed_objects(bucket, clean)
    with connect(private.database) as conn:
        assert episode_row(conn, faulty)["status"] == "processed"
        assert frame_rows(conn, faulty) == frame_rows(conn, clean) > 0


@pytest.mark.slow(seconds=45)  # two runs of the episode; 33-44 s on the busy 2 cores
def test_a_throttled_playlist_put_fails_the_run_retried_and_keeps_the_earlier_hls(
    private: Settings, tmp_path: Path
) -> None:
    """Issue 32, finding 0: once botocore's retries run out on a playlist PUT (503 SlowDown,
    Retry-After: 1, on every attempt), `hls_renditions` is not a bad video: the step is retried,
    then the run fails with the cause (camera, key, SlowDown, `Retry-After: 1`), the episode is
    `failed`, and every object of the earlier run's HLS is still there, its playlists whole."""
    bucket = Bucket(private.bucket, private.aws)
    ref = EpisodeRef("test-org", f"ep-slowdown-{uuid.uuid4().hex[:8]}")
    archive = tmp_path / "take.tar.zst"
    (camera,) = write_sample(archive, SampleSpec(seconds=1.0, cameras=1))["cameras"]
    with connect(private.database, autocommit=True) as conn:
        ensure_episode_row(conn, ref)
    bucket.upload_file(archive, f"{ref.prefix}take.tar.zst")
    hls = ref.hls_root
    # A longer earlier upload's extra segment: the first run removes it once its master is up.
    bucket.put_bytes(f"{hls}{camera}/segment_09999.ts", b"old")
    instance = DagsterInstance.get()
    assert process_episode(ref, instance, private).success
    before = {key: bucket.get_bytes(key) for key in bucket.list_keys(hls)}
    assert f"{hls}{camera}/segment_09999.ts" not in before
    playlists = sorted(key for key in before if key.endswith(".m3u8"))
    assert any(key.endswith("/master.m3u8") for key in playlists), sorted(before)

    plan = FaultPlan(
        refuse=lambda method, path: method == "PUT" and path.endswith(".m3u8"), retry_after=1
    )
    assert private.aws.endpoint_url is not None
    with FaultProxy(private.aws.endpoint_url, plan) as proxy:
        throttled = dataclasses.replace(
            private,
            aws=dataclasses.replace(private.aws, endpoint_url=proxy.url),
            s3_deadlines=S3Deadlines(max_attempts=2),  # botocore gives up in about a second
            transcode=dataclasses.replace(
                private.transcode, step_retries=1, step_retry_seconds=30.0
            ),
        )
        started = time.monotonic()
        outcome = process_episode(ref, instance, throttled)
        seconds = time.monotonic() - started

    assert not outcome.success
    assert plan.injected["refused"] >= 4  # 2 tries of the step x 2 botocore attempts
    (error,) = [e for e in outcome.errors if e.startswith("hls_renditions:")]
    assert "StorageUnavailable" in error and "SlowDown" in error, error
    assert f"s3://{private.bucket}/{hls}" in error and ".m3u8" in error, error
    assert "Retry-After: 1" in error and retry_after_seconds(error) == 1.0, error
    assert seconds < 30  # the step waited the Retry-After, not the 30 s backoff
    retried = instance.get_records_for_run(
        outcome.run_id, of_type=DagsterEventType.STEP_UP_FOR_RETRY
    ).records
    assert [r.event_log_entry.step_key for r in retried] == ["hls_renditions"]
    assert failure_cause(instance, outcome.run_id) == STORAGE
    with connect(private.database) as conn:
        assert episode_row(conn, ref)["status"] == "failed"

    after = {key: bucket.get_bytes(key) for key in bucket.list_keys(hls)}
    assert set(after) == set(before)  # nothing removed: the same keys
    for key in playlists:  # never rewritten (every PUT refused) and still whole
        assert after[key] == before[key]
        text = after[key].decode()
        parsed = parse_master(text) if key.endswith("/master.m3u8") else parse_playlist(text)
        assert parsed


def test_a_database_gone_mid_copy_leaves_no_rows_and_the_retry_writes_them_all(
    private: Settings, archive: Path
) -> None:
    bucket = Bucket(private.bucket, private.aws)
    ref = EpisodeRef("test-org", f"ep-pg-cut-{uuid.uuid4().hex[:8]}")
    with connect(private.database, autocommit=True) as conn:
        ensure_episode_row(conn, ref)
    bucket.upload_file(archive, f"{ref.prefix}take.tar.zst")
    instance = DagsterInstance.get()

    with CopyCuttingProxy(private.database.host, private.database.port) as proxy:
        through_proxy = dataclasses.replace(
            private, database=dataclasses.replace(private.database, port=proxy.port)
        )
        outcome = process_episode(ref, instance, through_proxy)
        assert proxy.cut.is_set()  # the fault happened, during the frames COPY

    assert not outcome.success
    assert any(error.startswith("frames:") for error in outcome.errors), outcome.errors
    with connect(private.database) as conn:
        assert frame_rows(conn, ref) == 0  # the transaction rolled back: never half the rows
        assert episode_row(conn, ref)["status"] == "failed"

    assert process_episode(ref, instance, private).success  # the retry (the message's, or by hand)
    with connect(private.database) as conn:
        assert episode_row(conn, ref)["status"] == "processed"
        assert frame_rows(conn, ref) == 30  # 1 s at 30 fps, written once


def test_a_postgresql_restart_mid_copy_rolls_back_and_the_retry_writes_every_row(
    private: Settings, archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The application database's server restarts (fast shutdown, as a failover does) while the
    frames COPY has sent rows it has not committed. The server is one of the test's own:
    restarting the session's would cut every other test's connections."""
    pgdata, password, port = tmp_path / "pgdata", uuid.uuid4().hex, free_port()
    init_cluster(pgdata, password)
    start_postgres(pgdata, port)
    try:
        own = dataclasses.replace(
            private,
            database=dataclasses.replace(private.database, port=port, password=password),
        )
        ref = EpisodeRef("test-org", f"ep-pg-restart-{uuid.uuid4().hex[:8]}")
        server = dataclasses.replace(own.database, name="postgres")
        with connect(server, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{own.database.name}"')
        with connect(own.database, autocommit=True) as conn:
            apply_migrations(conn)
            ensure_episode_row(conn, ref)
        Bucket(own.bucket, own.aws).upload_file(archive, f"{ref.prefix}take.tar.zst")
        instance = DagsterInstance.get()

        marker = tmp_path / "mid-copy.reached"
        monkeypatch.setenv(INJECTION_POINT_ENV, f"{MID_COPY}:{marker}")
        monkeypatch.setenv(INJECTION_ABOUT_ENV, f"frames:{ref.episode_id}")
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(process_episode, ref, instance, own)
            wait_for(marker, running)
            stop_postgres(pgdata)
            start_postgres(pgdata, port)
            release(marker)
            outcome = running.result(timeout=300)

        assert not outcome.success
        assert any(error.startswith("frames:") for error in outcome.errors), outcome.errors
        with connect(own.database) as conn:
            assert frame_rows(conn, ref) == 0  # rolled back with the server: never half the rows
            assert episode_row(conn, ref)["status"] == "failed"

        monkeypatch.delenv(INJECTION_POINT_ENV)
        assert process_episode(ref, instance, own).success  # the retry
        with connect(own.database) as conn:
            assert episode_row(conn, ref)["status"] == "processed"
            assert frame_rows(conn, ref) == 30  # 1 s at 30 fps, written once
    finally:
        stop_postgres(pgdata)


def wait_for(marker: Path, running: Future[Any], timeout: float = 180) -> None:
    """Until the run holds at the armed point (or has ended without reaching it)."""
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if running.done():
            raise AssertionError(f"the run ended before {MID_COPY}: {running.result()}")
        assert time.monotonic() < deadline, f"{MID_COPY} not reached in {timeout} s"
        time.sleep(0.2)


def test_refusals_end_refuse_seconds_after_the_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """The soak's S3 incident: the same request refused on every attempt, until it is over."""
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    plan = FaultPlan(refuse=lambda method, path: method == "PUT", refuse_seconds=40)
    assert plan.next_fate(("GET", "/a", "")) == "pass"
    assert plan.next_fate(("PUT", "/a", "")) == "error:0"  # the first refusal starts the clock
    clock[0] = 139.0
    assert plan.next_fate(("PUT", "/a", "")) == "error:0"
    clock[0] = 140.0
    assert plan.next_fate(("PUT", "/a", "")) == "pass"
    assert plan.refused == ["/a", "/a"] and plan.injected["refused"] == 2
