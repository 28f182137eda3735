"""Hostile archives, read in memory: each kind is refused early with its own named error, and a
few hundred random mutations of a valid archive end in a named error or a clean read, never an
unnamed exception or a hang (docs/faults.md)."""

from __future__ import annotations

import io
import json
import os
import random
import tarfile

import pytest
import zstandard

from episode_pipeline.archive.stream import (
    MAX_EXTENDED_HEADER_BYTES,
    ArchiveError,
    ArchiveReader,
    CorruptArchive,
    DecompressionRatioExceeded,
    DuplicateMember,
    MemberPathTooDeep,
    MemberTooLarge,
    MetadataTooLarge,
    TooManyMembers,
    UndecodableMemberName,
)
from episode_pipeline.config.settings import ArchiveLimits

MiB = 1 << 20


def tar_of(*members: tuple[str, bytes], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(
        fileobj=buffer, mode="w", format=fmt, encoding="utf-8", errors="surrogateescape"
    ) as tar:
        for name, content in members:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def zst(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(data)


def read_all(archive: bytes, limits: ArchiveLimits | None = None) -> dict[str, bytes]:
    """Read every member the way the extraction does (metadata whole, the rest streamed)."""
    reader = ArchiveReader(io.BytesIO(archive), name="s3://b/hostile.tar.zst", **_limits(limits))
    out = {}
    for member in reader:
        out[member.path] = member.read() if member.path.endswith(".json") else member.fileobj.read()
    return out


def _limits(limits: ArchiveLimits | None) -> dict[str, ArchiveLimits]:
    return {"limits": limits} if limits else {}


INFO = json.dumps({"codebase_version": "v3.0", "fps": 30, "features": {}}).encode()


def test_a_duplicate_member_path_is_refused_even_when_spelled_differently():
    archive = zst(
        tar_of(("meta/info.json", INFO), ("data/a.parquet", b"1"), ("data/./a.parquet", b"2"))
    )
    with pytest.raises(DuplicateMember, match=r"'data/a\.parquet' appears more than once"):
        read_all(archive)


def test_a_member_name_that_is_not_utf8_is_refused_naming_its_bytes():
    # ustar/GNU headers carry raw bytes: b"caf\xe9" is Latin-1, not UTF-8.
    archive = zst(
        tar_of(("meta/info.json", INFO), ("videos/caf\udce9.mp4", b"x"), fmt=tarfile.GNU_FORMAT)
    )
    with pytest.raises(UndecodableMemberName, match=r"b'videos/caf\\xe9\.mp4' is not valid UTF-8"):
        read_all(archive)


def test_more_members_than_the_limit_are_refused():
    archive = zst(tar_of(*[(f"data/{i}.parquet", b"") for i in range(5)]))
    with pytest.raises(TooManyMembers, match="max_members=4"):
        read_all(archive, ArchiveLimits(max_members=4))


def test_a_small_archive_that_expands_enormously_is_refused_early():
    bomb = zst(tar_of(("meta/info.json", INFO), ("videos/zeros.mp4", bytes(16 * MiB))))
    assert len(bomb) < 4096  # 16 MiB of zeros compress to almost nothing
    limits = ArchiveLimits(ratio_grace_bytes=2 * MiB, max_ratio=100)
    reader = ArchiveReader(io.BytesIO(bomb), name="bomb", limits=limits)
    with pytest.raises(DecompressionRatioExceeded, match="decompression bomb") as refused:
        for member in reader:
            member.fileobj.read()
    assert "max_ratio=100" in str(refused.value)
    assert reader.bytes_decompressed < 4 * MiB  # stopped soon after the grace, not at the end


def test_an_archive_of_incompressible_video_is_not_a_bomb():
    video = os.urandom(3 * MiB)
    archive = zst(tar_of(("meta/info.json", INFO), ("videos/cam.mp4", video)))
    got = read_all(archive, ArchiveLimits(ratio_grace_bytes=MiB, max_ratio=10))
    assert got["videos/cam.mp4"] == video


@pytest.mark.parametrize(
    ("path", "limits"),
    [
        ("/".join(["d"] * 40) + "/x.mp4", ArchiveLimits()),  # 40 folders
        ("videos/" + "n" * 600 + ".mp4", ArchiveLimits()),  # 600+ bytes
        ("a/b/c/x.mp4", ArchiveLimits(max_path_depth=2)),
    ],
)
def test_a_deeply_nested_or_very_long_path_is_refused(path, limits):
    archive = zst(tar_of(("meta/info.json", INFO), (path, b"x")))
    with pytest.raises(MemberPathTooDeep, match="max_path_depth="):
        read_all(archive, limits)


def test_a_huge_info_json_is_refused_before_it_is_read_into_memory():
    huge = b'{"fps": 30, "pad": "' + b"x" * 4096 + b'"}'
    archive = zst(tar_of(("meta/info.json", huge)))
    with pytest.raises(MetadataTooLarge, match=r"'meta/info\.json' has 4\d\d\d bytes"):
        read_all(archive, ArchiveLimits(max_metadata_bytes=1024))


def test_an_oversized_extended_header_is_refused_before_tarfile_buffers_it():
    archive = zst(tar_of(("videos/" + "n" * (MAX_EXTENDED_HEADER_BYTES + 10) + ".mp4", b"x")))
    with pytest.raises(MemberTooLarge, match="extended header"):
        read_all(archive, ArchiveLimits(max_path_bytes=10 * MAX_EXTENDED_HEADER_BYTES))


def test_a_garbage_header_after_the_first_member_is_corruption_not_the_end():
    tar = bytearray(tar_of(("meta/info.json", INFO), ("data/a.parquet", b"1" * 600)))
    second_header = tar.index(b"data/a.parquet") - 512 * 0
    header_start = second_header - second_header % 512
    tar[header_start : header_start + 100] = b"\x07" * 100  # a damaged header block
    with pytest.raises(CorruptArchive, match="invalid tar header"):
        read_all(zst(bytes(tar)))


# -- fuzzing -------------------------------------------------------------------------------------

FUZZ_SEED = 20261130
FUZZ_CASES = 400


def valid_archive_tar() -> bytes:
    noise = random.Random(FUZZ_SEED).randbytes(3000)  # video-like: does not compress
    return tar_of(
        ("ds/meta/info.json", INFO),
        ("ds/meta/tasks.jsonl", b'{"task_index": 0, "task": "pick"}\n'),
        ("ds/data/chunk-000/file-000.parquet", b"PAR1" + bytes(range(256)) * 8 + b"PAR1"),
        ("ds/videos/observation.images.front/chunk-000/file-000.mp4", noise),
    )


def member_spans(tar: bytes) -> list[tuple[int, int]]:
    """(first header byte, end of data) of each member, pax headers included."""
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        members = archive.getmembers()
    starts = [m.offset for m in members]
    ends = [m.offset_data + -(-m.size // 512) * 512 for m in members]
    return list(zip(starts, ends, strict=True))


def with_checksum(data: bytearray, block: int) -> None:
    """Recompute a header block's checksum, as tar writers do (chksum field counted as spaces)."""
    header = data[block : block + 512]
    header[148:156] = b" " * 8
    data[block + 148 : block + 156] = b"%06o\x00 " % sum(header)


def mutate(rng: random.Random, tar: bytes, spans: list[tuple[int, int]]) -> bytes:
    """One random mutation, on the tar (then compressed) or on the compressed bytes."""
    data = bytearray(tar)
    start, end = rng.choice(spans)
    kind = rng.randrange(7)
    if kind == 0:  # flip bits anywhere
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == 1:  # overwrite a header field: name, mode, size, checksum, type, magic
        block = rng.randrange(start, end - 511, 512)
        offset = block + rng.choice([0, 100, 124, 148, 156, 257])
        junk = rng.choice([b"77777777777\x00", b"\xff" * 12, b"0" * 12, b"../../etc/pw"])
        data[offset : offset + len(junk)] = junk
        if rng.random() < 0.5:  # a writer that means it: the checksum agrees
            with_checksum(data, block)
    elif kind == 2:  # truncate
        del data[rng.randrange(len(data)) :]
    elif kind == 3:  # a member stored twice
        data[end:end] = data[start:end]
    elif kind == 4:  # a member's blocks dropped: the next header is read from its data
        del data[start : start + 512]
    if kind == 5:  # damage the compressed stream itself
        compressed = bytearray(zst(bytes(data)))
        for _ in range(rng.randint(1, 4)):
            compressed[rng.randrange(len(compressed))] = rng.randrange(256)
        return bytes(compressed)
    if kind == 6:  # cut the compressed stream short
        compressed = zst(bytes(data))
        return compressed[: rng.randrange(len(compressed))]
    return zst(bytes(data))


@pytest.mark.timeout(120)  # a hang in any case fails here, not in CI's global timeout
def test_fuzzed_archives_end_in_a_named_error_or_a_clean_read():
    rng = random.Random(FUZZ_SEED)
    tar = valid_archive_tar()
    spans = member_spans(tar)
    outcomes: dict[str, int] = {}
    for case in range(FUZZ_CASES):
        archive = mutate(rng, tar, spans)
        try:
            read_all(archive, ArchiveLimits(max_member_bytes=MiB, max_metadata_bytes=64 * 1024))
            outcome = "read"
        except ArchiveError as error:
            outcome = type(error).__name__
        except Exception as error:  # the point: name whatever escaped
            pytest.fail(f"case {case}: unnamed {type(error).__name__}: {error}")
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    # The mutations reach the refusals they aim at, not one catch-all.
    for named in ("CorruptArchive", "DuplicateMember", "MemberTooLarge"):
        assert outcomes.get(named, 0) > 0, outcomes
