"""The data bucket client against the moto server: the operations the pipeline relies on."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import uuid
from pathlib import Path

import pytest

from episode_pipeline.config.settings import Settings
from episode_pipeline.storage.bucket import Bucket

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bucket(settings: Settings) -> Bucket:
    return Bucket(settings.bucket, settings.aws)


@pytest.fixture
def prefix(bucket: Bucket):
    value = f"tests/storage-{uuid.uuid4().hex[:10]}/"
    yield value
    bucket.delete_prefix(value)


def test_head_of_a_missing_object_is_none(bucket: Bucket, prefix: str) -> None:
    assert bucket.head(f"{prefix}nothing.json") is None


def test_upload_stream_from_a_streamed_tar_member(bucket: Bucket, prefix: str) -> None:
    """Tar members read in `r|` mode cannot seek; the upload must still work, in one pass."""
    payload = os.urandom(300_000)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        member = tarfile.TarInfo("videos/cam_high/episode_000000.mp4")
        member.size = len(payload)
        tar.addfile(member, io.BytesIO(payload))
    archive.seek(0)

    with tarfile.open(fileobj=archive, mode="r|") as tar:
        for member in tar:
            key = f"{prefix}processed/{member.name}"
            result = bucket.upload_stream(key, tar.extractfile(member), size=member.size)

    assert result.size == len(payload)
    assert result.sha256 == hashlib.sha256(payload).hexdigest()
    info = bucket.head(key)
    assert info is not None
    assert info.size == len(payload)
    assert info.etag
    response = bucket.client.head_object(Bucket=bucket.name, Key=key)
    assert response["ContentType"] == "video/mp4"
    with bucket.open_stream(key) as body:
        assert body.read() == payload


def test_upload_stream_multipart_and_short_stream(bucket: Bucket, prefix: str) -> None:
    payload = os.urandom(17 * 1024 * 1024)  # above the 16 MiB part size: multipart
    result = bucket.upload_stream(f"{prefix}big.bin", io.BytesIO(payload), size=len(payload))
    assert result.size == len(payload)
    assert bucket.head(f"{prefix}big.bin").size == len(payload)
    with pytest.raises(OSError, match=r"read 10 bytes, expected 11"):
        bucket.upload_stream(f"{prefix}short.bin", io.BytesIO(b"0123456789"), size=11)


def test_upload_files_list_download_and_delete(bucket: Bucket, prefix: str, tmp_path: Path) -> None:
    pairs = []
    for index in range(12):
        path = tmp_path / f"segment_{index:05d}.ts"
        path.write_bytes(f"segment {index}".encode())
        pairs.append((path, f"{prefix}hls/cam_main/{path.name}"))
    playlist = tmp_path / "playlist.m3u8"
    playlist.write_text("#EXTM3U\n")
    pairs.append((playlist, f"{prefix}hls/cam_main/playlist.m3u8"))

    results = bucket.upload_files(pairs, max_workers=8)
    assert [r.key for r in results] == [key for _, key in pairs]
    assert results[0].sha256 == hashlib.sha256(b"segment 0").hexdigest()

    assert len(bucket.list_keys(f"{prefix}hls/")) == 13
    assert bucket.list_keys(f"{prefix}hls/", suffix=".m3u8") == [
        f"{prefix}hls/cam_main/playlist.m3u8"
    ]
    response = bucket.client.head_object(
        Bucket=bucket.name, Key=f"{prefix}hls/cam_main/playlist.m3u8"
    )
    assert response["ContentType"] == "application/vnd.apple.mpegurl"

    target = bucket.download_file(f"{prefix}hls/cam_main/segment_00003.ts", tmp_path / "d/x.ts")
    assert target.read_bytes() == b"segment 3"
    assert bucket.get_bytes(f"{prefix}hls/cam_main/segment_00004.ts") == b"segment 4"

    assert bucket.delete_prefix(f"{prefix}hls/") == 13
    assert bucket.list_keys(prefix) == []


def test_delete_prefix_refuses_an_empty_prefix(bucket: Bucket) -> None:
    with pytest.raises(ValueError, match="empty prefix"):
        bucket.delete_prefix("/")
