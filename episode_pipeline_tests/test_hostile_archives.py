"""Hostile archives on the real stack: each kind fails its run with a named error, leaves the
episode `failed`, writes nothing outside that episode's `processed/` prefix, and leaves an
episode processed beside it untouched (docs/faults.md).

Each archive is a valid 1-second sample with one hostile member appended, so the valid members
really are extracted before the refusal. The limits are set low through `Settings` (as
ARCHIVE_* variables would in production) so no test needs gigabytes.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from typing import Any

import pytest
import zstandard
from dagster import DagsterEventType, DagsterInstance

from episode_pipeline.config.settings import ArchiveLimits, Settings
from episode_pipeline.db.connection import connect
from episode_pipeline.db.episodes import ensure_episode_row, episode_row, frame_rows
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.runner import process_episode
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline_tests.support.archives import with_members

pytestmark = pytest.mark.integration

MiB = 1 << 20
ROOT = "lerobot_episode"
LIMITS = ArchiveLimits(
    max_total_bytes=24 * MiB,
    max_members=40,
    max_ratio=50,
    ratio_grace_bytes=2 * MiB,
    max_path_depth=8,
    max_metadata_bytes=256 * 1024,
)


def member(name: str, data: bytes) -> tuple[str, bytes]:
    return name, data


# kind → (hostile members appended to a valid sample, the error class, a phrase of its message)
HOSTILE: dict[str, tuple[list[tuple[str, bytes]], str, str]] = {
    "duplicate member": (
        [member(f"{ROOT}/meta/info.json", b"{}")],
        "DuplicateMember",
        "appears more than once",
    ),
    "non-UTF-8 name": (
        [member(f"{ROOT}/videos/caf\udce9.mp4", b"x")],
        "UndecodableMemberName",
        "is not valid UTF-8",
    ),
    "too many members": (
        [member(f"{ROOT}/extra/{i}.txt", b"") for i in range(50)],
        "TooManyMembers",
        "max_members=40",
    ),
    "too large in total": (
        [member(f"{ROOT}/videos/noise.mp4", os.urandom(30 * MiB))],
        "ArchiveTooLarge",
        "max_total_bytes",
    ),
    "decompression bomb": (
        [member(f"{ROOT}/videos/zeros.mp4", bytes(20 * MiB))],
        "DecompressionRatioExceeded",
        "decompression bomb",
    ),
    "deeply nested path": (
        [member(f"{ROOT}/" + "d/" * 20 + "x.parquet", b"PAR1")],
        "MemberPathTooDeep",
        "max_path_depth=8",
    ),
    "huge info.json": (
        [member("second_root/meta/info.json", b'{"fps": 30, "x": "' + b"y" * MiB + b'"}')],
        "MetadataTooLarge",
        "max_metadata_bytes",
    ),
}


@pytest.fixture(scope="module")
def sample_tar(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    archive = tmp_path_factory.mktemp("hostile") / "take.tar.zst"
    write_sample(archive, SampleSpec(seconds=1.0, cameras=1, root_folder=ROOT))
    return zstandard.ZstdDecompressor().decompressobj().decompress(archive.read_bytes())


@pytest.fixture(scope="module")
def stage(stack, settings: Settings, sample_tar: bytes) -> dict[str, Any]:
    """A private bucket (no notifications), the tight limits, and one episode processed in it."""
    private = dataclasses.replace(
        settings, bucket=f"hostile-{uuid.uuid4().hex[:8]}", archive_limits=LIMITS
    )
    bucket = Bucket(private.bucket, private.aws)
    bucket.client.create_bucket(
        Bucket=bucket.name, CreateBucketConfiguration={"LocationConstraint": private.aws.region}
    )
    good = EpisodeRef("test-org", f"ep-good-{uuid.uuid4().hex[:8]}")
    upload(private, bucket, good, with_members(sample_tar, []))
    outcome = process_episode(good, DagsterInstance.get(), private)
    assert outcome.success, outcome.errors
    return {"settings": private, "bucket": bucket, "good": good}


def upload(settings: Settings, bucket: Bucket, ref: EpisodeRef, archive: bytes) -> None:
    with connect(settings.database, autocommit=True) as conn:
        ensure_episode_row(conn, ref)
    bucket.put_bytes(f"{ref.prefix}take.tar.zst", archive)


def objects(bucket: Bucket) -> dict[str, str]:
    return {info.key: info.etag for info in bucket.iter_objects("")}


def episode_state(settings: Settings, ref: EpisodeRef) -> tuple[Any, ...]:
    with connect(settings.database) as conn:
        row = episode_row(conn, ref)
        return row["status"], row["processed_at"], frame_rows(conn, ref)


def failed_step_error_class(instance: DagsterInstance, run_id: str) -> str:
    """The class of the user exception that failed the step (under Dagster's wrappers)."""
    (record,) = instance.get_records_for_run(run_id, of_type=DagsterEventType.STEP_FAILURE).records
    error = record.event_log_entry.dagster_event.step_failure_data.error
    while error.cause is not None and error.cls_name.startswith("Dagster"):
        error = error.cause
    return error.cls_name


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_hostile_archive_fails_its_episode_by_name_and_touches_nothing_else(
    kind: str, stage: dict[str, Any], sample_tar: bytes
) -> None:
    settings, bucket, good = stage["settings"], stage["bucket"], stage["good"]
    extra, error_class, phrase = HOSTILE[kind]
    hostile = EpisodeRef("test-org", f"ep-hostile-{uuid.uuid4().hex[:8]}")
    upload(settings, bucket, hostile, with_members(sample_tar, extra))
    before = objects(bucket)
    good_before = episode_state(settings, good)

    instance = DagsterInstance.get()
    outcome = process_episode(hostile, instance, settings)

    assert not outcome.success
    assert failed_step_error_class(instance, outcome.run_id) == error_class
    assert any(phrase in error for error in outcome.errors), outcome.errors
    assert episode_state(settings, hostile)[0] == "failed"
    after = objects(bucket)
    written = {key for key, etag in after.items() if before.get(key) != etag}
    outside = [key for key in written if not key.startswith(hostile.processed_prefix)]
    assert outside == [], f"{kind}: objects written outside {hostile.processed_prefix}"
    assert all(after.get(key) == etag for key, etag in before.items())  # nothing deleted
    assert episode_state(settings, good) == good_before


def test_the_sample_with_nothing_appended_passes_the_same_limits(stage: dict[str, Any]) -> None:
    """Guards the cases above: the limits refuse the hostile member, not the sample itself."""
    settings, good = stage["settings"], stage["good"]
    status, processed_at, frames = episode_state(settings, good)
    assert status == "processed" and processed_at is not None and frames > 0
