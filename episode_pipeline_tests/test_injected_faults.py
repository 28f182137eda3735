"""Faults injected into S3 on the real stack, through a fault-injecting proxy (fault_proxy.py)
between the pipeline and the moto server: 500/503 answers and responses slower than the read
timeout, during extraction, the frames download and the HLS upload. The run succeeds after
retries, and what it wrote equals a clean run's (docs/faults.md)."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import pytest
from dagster import DagsterInstance

from episode_pipeline.bucket import Bucket
from episode_pipeline.db.connection import connect
from episode_pipeline.db.episodes import ensure_episode_row, episode_row, frame_rows
from episode_pipeline.keys import EpisodeRef
from episode_pipeline.lerobot.sample import SampleSpec, write_sample
from episode_pipeline.runner import process_episode
from episode_pipeline.settings import S3Deadlines, Settings
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
    """Relative key → ETag of what the run wrote (its own bookkeeping JSON names the episode)."""
    return {
        info.key.removeprefix(ref.processed_prefix): info.etag
        for info in bucket.iter_objects(ref.processed_prefix)
        if "/_dagster/" not in info.key
    }


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
