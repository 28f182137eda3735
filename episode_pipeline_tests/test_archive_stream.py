"""The streaming .tar.zst reader: members come out once, in order; hostile entries are refused."""

from __future__ import annotations

import io
import random
import tarfile

import pytest
import zstandard
from botocore.exceptions import ReadTimeoutError

from episode_pipeline.archive.stream import (
    ArchiveLimitExceeded,
    ArchiveLimits,
    ArchiveReader,
    CorruptArchive,
    normalise_member_path,
    spool_member,
    spooled,
)


def tar_bytes(entries: list[tuple[str, bytes | None, bytes]]) -> bytes:
    """entries: (name, content or None, type flag); builds a plain tar in memory."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content, kind in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc/passwd"
            if content is not None:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
            else:
                tar.addfile(info)
    return buffer.getvalue()


def zst(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=1).compress(data)


def files(*pairs: tuple[str, bytes]) -> bytes:
    return zst(tar_bytes([(name, content, tarfile.REGTYPE) for name, content in pairs]))


class OneWayStream(io.RawIOBase):
    """Like a StreamingBody: read() only, no seek, no tell."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        chunk = self._data.read(min(len(buffer), 1000))  # short reads on purpose
        buffer[: len(chunk)] = chunk
        return len(chunk)


def test_members_stream_in_order_with_paths_sizes_and_bytes():
    payload = bytes(range(256)) * 5000
    archive = files(("ds/meta/info.json", b"{}"), ("./ds/videos/a.mp4", payload))
    got = [
        (m.path, m.size, m.read()) for m in ArchiveReader(OneWayStream(archive), name="a.tar.zst")
    ]
    assert got == [("ds/meta/info.json", 2, b"{}"), ("ds/videos/a.mp4", len(payload), payload)]


def test_member_file_objects_are_not_seekable():
    archive = files(("x.mp4", b"abc"))
    for member in ArchiveReader(io.BytesIO(archive), name="a"):
        assert member.fileobj.seekable() is False
        assert member.fileobj.readable() is True
        with pytest.raises(OSError):
            member.fileobj.seek(0)
        assert member.fileobj.read(2) == b"ab"
        assert member.fileobj.read() == b"c"


def test_reading_a_member_after_advancing_is_an_error():
    archive = files(("a.bin", b"one"), ("b.bin", b"two"))
    members = list(ArchiveReader(io.BytesIO(archive), name="arch.tar.zst"))
    with pytest.raises(ValueError, match="already passed"):
        members[0].fileobj.read()


def test_unread_members_are_skipped_over():
    archive = files(("a.bin", b"1" * 100_000), ("b.bin", b"second"))
    contents = {}
    for member in ArchiveReader(io.BytesIO(archive), name="a"):
        if member.path == "b.bin":
            contents[member.path] = member.read()
    assert contents == {"b.bin": b"second"}


def test_traversal_absolute_links_and_devices_are_skipped_with_reasons():
    raw = tar_bytes(
        [
            ("../../etc/cron.d/evil", b"x", tarfile.REGTYPE),
            ("ds/../../escape.mp4", b"x", tarfile.REGTYPE),
            ("/abs/path.mp4", b"x", tarfile.REGTYPE),
            ("ds/link.mp4", None, tarfile.SYMTYPE),
            ("ds/dev", None, tarfile.CHRTYPE),
            ("ds/", None, tarfile.DIRTYPE),
            ("ds/ok.mp4", b"fine", tarfile.REGTYPE),
        ]
    )
    reader = ArchiveReader(io.BytesIO(zst(raw)), name="bad.tar.zst")
    assert [m.path for m in reader] == ["ds/ok.mp4"]
    reasons = {s.name: s.reason for s in reader.skipped}
    assert "traversal" in reasons["../../etc/cron.d/evil"]
    assert "traversal" in reasons["ds/../../escape.mp4"]
    assert "link" in reasons["ds/link.mp4"]
    assert "special" in reasons["ds/dev"]
    assert reasons["/abs/path.mp4"] == "absolute path"
    assert "ds/" not in reasons  # directories are expected, not reported


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("./a/./b.mp4", ("a/b.mp4", None)),
        ("a//b", ("a/b", None)),
        ("/etc/passwd", (None, "absolute path")),
        ("a/../../b", (None, "path traversal ('..')")),
        ("a\\..\\b", (None, "backslash in path")),
        ("C:/x", (None, "drive-letter path")),
        ("./", (None, "empty path")),
    ],
)
def test_normalise_member_path(name, expected):
    assert normalise_member_path(name) == expected


def test_corrupt_zstd_frame_names_the_archive():
    good = files(("a.bin", b"z" * 10_000))
    broken = good[:20] + bytes(b ^ 0xFF for b in good[20:60]) + good[60:]
    with pytest.raises(CorruptArchive, match=r"orgs/o/episodes/e/up\.tar\.zst"):
        for member in ArchiveReader(io.BytesIO(broken), name="orgs/o/episodes/e/up.tar.zst"):
            member.read()


def test_input_that_is_not_zstd_is_rejected_clearly():
    plain_tar = tar_bytes([("a.bin", b"x", tarfile.REGTYPE)])
    with pytest.raises(CorruptArchive, match=r"up\.tar\.zst: not a zstd stream"):
        list(ArchiveReader(io.BytesIO(plain_tar), name="up.tar.zst"))
    with pytest.raises(CorruptArchive, match="empty input"):
        list(ArchiveReader(io.BytesIO(b""), name="up.tar.zst"))


def test_zstd_of_something_that_is_not_a_tar():
    with pytest.raises(CorruptArchive, match=r"up\.tar\.zst: .*tar"):
        list(ArchiveReader(io.BytesIO(zst(b"hello, not a tar" * 100)), name="up.tar.zst"))


def test_truncated_archive_is_corrupt_not_silently_short():
    noise = random.Random(1).randbytes(200_000)  # incompressible: the cut lands inside the member
    archive = files(("a.bin", noise))
    with pytest.raises(CorruptArchive, match=r"cut\.tar\.zst: .*'a\.bin'"):
        for member in ArchiveReader(io.BytesIO(archive[: len(archive) // 2]), name="cut.tar.zst"):
            member.read()


def test_several_zstd_frames_are_read_across():
    raw = tar_bytes([("a.bin", b"a" * 5000, tarfile.REGTYPE), ("b.bin", b"b", tarfile.REGTYPE)])
    multi = zst(raw[:3000]) + zst(raw[3000:])  # what pzstd / zstd -T writes
    assert [m.path for m in ArchiveReader(io.BytesIO(multi), name="m")] == ["a.bin", "b.bin"]


def test_member_size_limit():
    archive = files(("small", b"x"), ("big.mp4", b"y" * 5000))
    names = []
    with pytest.raises(ArchiveLimitExceeded, match=r"lim\.tar\.zst: member 'big\.mp4'"):
        for member in ArchiveReader(
            io.BytesIO(archive), name="lim.tar.zst", limits=ArchiveLimits(max_member_bytes=4096)
        ):
            names.append(member.path)
    assert names == ["small"]


def test_total_size_limit_stops_a_bomb():
    archive = files(*[(f"f{i}", b"\0" * 50_000) for i in range(10)])
    with pytest.raises(ArchiveLimitExceeded, match="max_total_bytes"):
        for member in ArchiveReader(
            io.BytesIO(archive), name="bomb", limits=ArchiveLimits(max_total_bytes=200_000)
        ):
            member.read()


def test_member_count_limit():
    archive = files(*[(f"f{i}", b"") for i in range(5)])
    with pytest.raises(ArchiveLimitExceeded, match="max_members=3"):
        list(ArchiveReader(io.BytesIO(archive), name="many", limits=ArchiveLimits(max_members=3)))


def test_reader_is_single_pass():
    reader = ArchiveReader(io.BytesIO(files(("a", b"1"))), name="once")
    assert len(list(reader)) == 1
    with pytest.raises(Exception, match="only once"):
        list(reader)


def test_spool_keeps_relative_path_and_bytes(tmp_path):
    payload = b"PAR1" + bytes(300_000) + b"PAR1"
    archive = files(("ds/data/chunk-000/file-000.parquet", payload))
    for member in ArchiveReader(io.BytesIO(archive), name="a"):
        path = spool_member(member, tmp_path)
        assert path == tmp_path / "ds/data/chunk-000/file-000.parquet"
        assert path.read_bytes() == payload


def test_spooled_file_is_removed_after_the_block():
    archive = files(("m/x.parquet", b"abc"))
    for member in ArchiveReader(io.BytesIO(archive), name="a"):
        with spooled(member) as path:
            assert path.read_bytes() == b"abc"
        assert not path.exists()


class TimingOutStream(OneWayStream):
    """S3's body timing out after `good` bytes, as botocore raises it (an OSError subclass)."""

    def __init__(self, data: bytes, good: int) -> None:
        super().__init__(data)
        self._good = good

    def readinto(self, buffer) -> int:
        if self._data.tell() >= self._good:
            raise ReadTimeoutError(endpoint_url="https://s3.amazonaws.com/bucket/a.tar.zst")
        return super().readinto(buffer)


def test_s3_timing_out_mid_member_is_not_a_corrupt_archive():
    """Issue 32: a read timeout of S3 (botocore's `ReadTimeoutError` is an OSError) while a member
    streams is the storage's failure, raised as it is, never `CorruptArchive` (a bad archive)."""
    # Incompressible, and longer than the 1 MiB reads: the timeout comes while the member streams.
    payload = random.Random(3).randbytes(8_000_000)
    archive = files(("ds/videos/a.mp4", payload))
    reader = ArchiveReader(TimingOutStream(archive, good=5_000_000), name="a.tar.zst")
    with pytest.raises(ReadTimeoutError):
        for member in reader:
            member.read()
