"""Stage `extraction`: one archive from S3 to `processed/` in S3, ours vs the old way vs limits.

Ours: ``extraction.extract_archive`` itself: one pass S3 GET → zstd → tar → an upload per kept
member (videos streamed into multipart uploads, parquets spooled to a temporary file first).
Old way: decompress to disk, then upload each file: the S3 download streamed through ``zstd -d |
tar -x`` into a temporary folder (the archive itself never on disk: the old way at its best),
then each kept file (the same members, with the same ``Bucket.upload_file``) one after another.
Limits: decompressing the same archive to nowhere (``zstd -dc > /dev/null`` of the local file:
the CPU bound), and S3 alone: the archive's GET with its bytes dropped plus the old way's upload
phase, which sends the same files from the page cache (the storage bound: what any way must ask
of S3, with no decompression at all; with moto as S3 it is the binding one, and moto serves a GET
with the same CPU it needs for the PUTs, so ours cannot hide the one behind the others). The
target is judged against whichever limit is slower.

Both sides write into the same S3 endpoint (moto, a bucket of the benchmark's own with no
notifications), each in its own child process so its peak RSS (``VmHWM``) is its own; the old
way's RSS is the largest of its processes (Python, zstd, tar). Peak temporary disk is measured:
the largest spooled parquet (ours), the extracted tree (old way). A second,
big archive (``big_archive_mb``, 2 GiB by default) is extracted once by ours alone for its peak
RSS and temporary disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    BenchContext,
    Result,
    median,
    peak_rss_self,
    rate_result,
    run_child,
    timed,
    write_data_parquet,
)

NAME = "extraction"
MiB = 1 << 20
RSS_TARGET_MIB = 300


def _allocated(path: Path) -> int:
    """Bytes of disk the file really occupies (like du), not its apparent size."""
    return path.stat().st_blocks * 512


def _bucket(name: str) -> Any:
    """The bucket with its client made: loading botocore's S3 model (~0.5 s, once a process, as
    in a run worker) is not extraction, and the S3 limit (the old way's later upload phase)
    never pays it, so neither side's timer does."""
    from episode_pipeline.config.settings import AwsSettings
    from episode_pipeline.storage.bucket import Bucket

    bucket = Bucket(name, AwsSettings.from_env(os.environ))
    bucket.client.head_bucket(Bucket=name)
    return bucket


# -- the two sides, each run in a child process ---------------------------------------------------


def child_ours(bucket_name: str, partition_key: str) -> dict[str, Any]:
    """`extract_archive` as the `extracted_files` step calls it; peak spooled file measured."""
    from episode_pipeline.episodes import extraction
    from episode_pipeline.episodes.keys import parse_partition_key

    peak_disk = 0
    real_spooled = extraction.spooled

    @contextlib.contextmanager
    def measured_spooled(member: Any, *args: Any) -> Iterator[Path]:
        nonlocal peak_disk
        with real_spooled(member, *args) as path:
            peak_disk = max(peak_disk, _allocated(path))
            yield path

    extraction.spooled = measured_spooled
    bucket = _bucket(bucket_name)
    ref = parse_partition_key(partition_key)
    started = time.perf_counter()
    archive = extraction.find_archive(bucket, ref)
    extracted = extraction.extract_archive(bucket, ref, archive)
    return {
        "seconds": time.perf_counter() - started,
        "bytes": sum(f.size for f in extracted.files),
        "files": len(extracted.files),
        "peak_disk_bytes": peak_disk,
        "peak_rss_bytes": peak_rss_self(),
    }


def child_old(bucket_name: str, partition_key: str, scratch: str) -> dict[str, Any]:
    """The archive streamed from S3 through `zstd -d | tar -x` to disk, then each kept file
    uploaded; phases timed. (Streaming the download into zstd is the old way at its best: the
    archive itself never lands on disk.)"""
    from episode_pipeline.episodes.extraction import find_archive
    from episode_pipeline.episodes.keys import parse_partition_key
    from episode_pipeline.lerobot.layout import MemberKind, member_kind

    bucket = _bucket(bucket_name)
    ref = parse_partition_key(partition_key)
    tree = Path(scratch) / f"old-{uuid.uuid4().hex[:8]}"
    tree.mkdir(parents=True)
    archive_key = find_archive(bucket, ref).key
    download = timed(lambda: _read_to_nowhere(bucket, archive_key))
    started = time.perf_counter()
    archive = find_archive(bucket, ref)
    unzstd = subprocess.Popen(["zstd", "-dcq"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    untar = subprocess.Popen(["tar", "-x", "-C", str(tree)], stdin=unzstd.stdout)
    assert unzstd.stdin is not None and unzstd.stdout is not None
    unzstd.stdout.close()  # tar owns the pipe now; zstd gets SIGPIPE if tar dies
    body = bucket.open_stream(archive.key)
    for chunk in iter(lambda: body.read(1 << 20), b""):
        unzstd.stdin.write(chunk)
    unzstd.stdin.close()
    tool_rss = 0
    for process in (untar, unzstd):  # wait4: each tool's own peak RSS
        _, status, usage = os.wait4(process.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"zstd | tar failed on s3://{bucket_name}/{archive.key}")
        tool_rss = max(tool_rss, usage.ru_maxrss * 1024)
    unpacked = time.perf_counter()
    files = sorted(p for p in tree.rglob("*") if p.is_file())
    disk = sum(_allocated(p) for p in files)
    kept = [
        p for p in files if member_kind(p.relative_to(tree).as_posix()) is not MemberKind.SKIPPED
    ]
    sent = 0
    for path in kept:
        sent += bucket.upload_file(path, f"{ref.prefix}old/{path.relative_to(tree)}").size
    finished = time.perf_counter()
    shutil.rmtree(tree)
    return {
        "seconds": finished - started,
        "unpack_seconds": unpacked - started,
        "upload_seconds": finished - unpacked,
        "download_seconds": download,
        "bytes": sent,
        "files": len(kept),
        "peak_disk_bytes": disk,
        "peak_rss_bytes": max(peak_rss_self(), tool_rss),
    }


def _read_to_nowhere(bucket: Any, key: str) -> None:
    """The object's GET, its bytes dropped: S3's half of reading the archive."""
    body = bucket.open_stream(key)
    try:
        while body.read(1 << 20):
            pass
    finally:
        body.close()


# -- the archive ----------------------------------------------------------------------------------


def padded_dataset(folder: Path, config: Any, padding_mb: int) -> tuple[Path, dict[str, Any]]:
    """A real sample episode (mp4s, parquets, meta) plus incompressible mp4-named padding.

    Encoded video is already compressed, so random bytes are the honest stand-in for a long
    multi-camera recording, without minutes of FFmpeg encoding; a long data parquet beside the
    sample's short one is what ours has to spool. Returns the dataset folder and its facts.
    """
    from episode_pipeline.samples.writer import SampleSpec, write_dataset

    dataset = folder / "dataset"
    spec = SampleSpec(cameras=config.cameras, seconds=config.seconds, width=640, height=480)
    write_dataset(dataset, spec)
    files = max(1, config.padding_files if padding_mb < 1024 else padding_mb // 256)
    per_file = padding_mb * MiB // files
    noise = np.random.default_rng(0)  # twice os.urandom's speed; as incompressible
    for index in range(files if padding_mb else 0):
        target = dataset / f"videos/observation.images.pad{index}/chunk-000/file-000.mp4"
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("wb") as handle:
            for start in range(0, per_file, 8 * MiB):
                handle.write(noise.bytes(min(8 * MiB, per_file - start)))
    write_data_parquet(dataset / "data/chunk-000/file-001.parquet", config.rows, config.state_dim)
    sizes = [path.stat().st_size for path in dataset.rglob("*") if path.is_file()]
    return dataset, {
        "members": len(sizes),
        "member_bytes": sum(sizes),
        "largest_member_bytes": max(sizes),
        "padding_bytes": per_file * files if padding_mb else 0,
        "sample": f"{spec.cameras} cameras, {spec.seconds:g} s, {spec.width}x{spec.height} H.264",
        "root_folder": spec.root_folder,
    }


def build_archive(folder: Path, config: Any, padding_mb: int) -> tuple[Path, dict[str, Any]]:
    """`padded_dataset` packed into a local `.tar.zst`; the archive and its facts."""
    from episode_pipeline.samples.writer import pack_archive

    dataset, facts = padded_dataset(folder, config, padding_mb)
    archive = folder / "episode.tar.zst"
    pack_archive(dataset, archive, root_folder=facts.pop("root_folder"))
    shutil.rmtree(dataset)
    return archive, {"archive_bytes": archive.stat().st_size, **facts}


def _new_upload_key(name: str) -> tuple[str, str]:
    """A new episode of the bench org: (partition key, the archive's key)."""
    partition_key = f"bench/ep-{uuid.uuid4().hex[:8]}"
    org, episode = partition_key.split("/")
    return partition_key, f"orgs/{org}/episodes/{episode}/{name}"


def upload_archive(bucket: Any, archive: Path) -> str:
    """The archive as a robot's upload in the bench bucket; returns the partition key."""
    partition_key, key = _new_upload_key(archive.name)
    bucket.upload_file(archive, key)
    return partition_key


def upload_packed(bucket: Any, folder: Path, config: Any, padding_mb: int) -> tuple[str, dict]:
    """`padded_dataset` packed straight into its upload through a pipe (the big archive: its
    compression overlaps moto's receiving, and it never takes 2 GiB of local disk); returns the
    partition key and the facts."""
    from episode_pipeline.samples.writer import pack_archive

    dataset, facts = padded_dataset(folder, config, padding_mb)
    partition_key, key = _new_upload_key("episode.tar.zst")
    root_folder = facts.pop("root_folder")
    read_end, write_end = os.pipe()

    def pack() -> None:
        with open(write_end, "wb") as pipe:
            pack_archive(dataset, pipe, root_folder=root_folder)

    # The reader closes first: a failed upload breaks the pipe, so the packer stops too.
    with ThreadPoolExecutor(1) as pool, open(read_end, "rb") as pipe:
        packing = pool.submit(pack)
        uploaded = bucket.upload_stream(key, pipe)
    packing.result()
    shutil.rmtree(dataset)
    return partition_key, {"archive_bytes": uploaded.size, **facts}


@contextlib.contextmanager
def bench_bucket(stack: Any) -> Iterator[Any]:
    """A bucket of the benchmark's own in the stack's moto: no notifications, deleted after."""
    from episode_pipeline.config.settings import AwsSettings
    from episode_pipeline.storage.bucket import Bucket

    aws = AwsSettings.from_env(stack.env)
    bucket = Bucket(f"bench-{uuid.uuid4().hex[:8]}", aws)
    bucket.client.create_bucket(
        Bucket=bucket.name, CreateBucketConfiguration={"LocationConstraint": aws.region}
    )
    try:
        yield bucket
    finally:
        bucket.delete_prefix("orgs/")
        bucket.client.delete_bucket(Bucket=bucket.name)


# -- the stage ------------------------------------------------------------------------------------


def _decompress_to_nowhere(archive: Path) -> float:
    with Path(os.devnull).open("wb") as nowhere:
        return timed(lambda: subprocess.run(["zstd", "-dcq", str(archive)], stdout=nowhere))


def run(ctx: BenchContext) -> list[Result]:
    config = ctx.config
    env = {**os.environ, **ctx.stack().env}
    scratch = ctx.workdir / "extraction" / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    env_tmp = {**env, "TMPDIR": str(scratch)}
    with ctx.phase("set-up: archive"):
        padding = config.archive_padding_mb
        archive, facts = build_archive(ctx.workdir / "extraction", config, padding)
    ours: list[dict[str, Any]] = []
    old: list[dict[str, Any]] = []
    limit_s: list[float] = []
    with bench_bucket(ctx.stack()) as bucket:
        for _ in range(config.repeats):
            with ctx.phase("ours, old, limit"):
                key = upload_archive(bucket, archive)
                ours.append(run_child(NAME_MODULE, ["ours", bucket.name, key], env=env_tmp))
                old.append(run_child(NAME_MODULE, ["old", bucket.name, key, str(scratch)], env=env))
                limit_s.append(_decompress_to_nowhere(archive))
                bucket.delete_prefix(f"orgs/{key.replace('/', '/episodes/')}/")
        big = _big_archive(ctx, bucket, env_tmp)
    if {r["bytes"] for r in ours} != {r["bytes"] for r in old}:
        raise AssertionError(
            f"{NAME}: ours uploaded {ours[0]['bytes']} bytes, old {old[0]['bytes']}"
        )
    amount = ours[0]["bytes"] / MiB
    ours_s = [r["seconds"] for r in ours]
    s3_s = [r["download_seconds"] + r["upload_seconds"] for r in old]
    details = {
        **facts,
        "files_uploaded": ours[0]["files"],
        "old_phases_seconds": {
            phase: [round(r[f"{phase}_seconds"], 3) for r in old] for phase in ("unpack", "upload")
        },
        "s3_get_seconds": [round(r["download_seconds"], 3) for r in old],
    }
    s3_bound = median(s3_s) > median(limit_s)
    by_old = rate_result(
        NAME, "throughput", amount, "MiB/s", ours_s, [r["seconds"] for r in old],
        baseline_name="old: S3 stream | zstd -d | tar -x to disk, then upload each file",
        details=details,
    ).expect_factor(1.5, "≥ 1.5x the old way")  # fmt: skip
    by_cpu = rate_result(
        NAME, "throughput", amount, "MiB/s", ours_s, limit_s,
        baseline_name="limit: zstd -dc of the same archive to /dev/null (CPU)", details={},
    )  # fmt: skip
    by_s3 = rate_result(
        NAME, "throughput", amount, "MiB/s", ours_s, s3_s,
        baseline_name="limit: S3 alone (the archive's GET, the same files' PUTs from page cache)",
        details={"s3_is_the_bottleneck": s3_bound},
    )  # fmt: skip
    bound = by_s3 if s3_bound else by_cpu
    bound.expect_factor(0.8, "≥ 0.8x the limit (the lower of CPU and S3)")
    largest = facts["largest_member_bytes"] / MiB
    disk = Result(
        stage=NAME,
        metric="peak_temp_disk",
        ours=round(max(r["peak_disk_bytes"] for r in ours) / MiB, 2),
        baseline=round(max(r["peak_disk_bytes"] for r in old) / MiB, 2),
        unit="MiB",
        better="lower",
        repeats=config.repeats,
        details={"largest_member_mib": round(largest, 2), "big_archive": big.get("disk")},
        baseline_name="old: the extracted tree",
        ours_samples=[round(r["peak_disk_bytes"] / MiB, 2) for r in ours],
        baseline_samples=[round(r["peak_disk_bytes"] / MiB, 2) for r in old],
    )
    disk.target = "≤ the largest member + 10%"
    disk.met = disk.ours <= 1.1 * largest and big.get("disk_met", True)
    rss = Result(
        stage=NAME,
        metric="peak_rss",
        ours=round(median([r["peak_rss_bytes"] / MiB for r in ours]), 1),
        baseline=round(median([r["peak_rss_bytes"] / MiB for r in old]), 1),
        unit="MiB",
        better="lower",
        repeats=config.repeats,
        details={"big_archive": big.get("rss")},
        baseline_name="old: the largest of its processes (Python, zstd, tar)",
        ours_samples=[round(r["peak_rss_bytes"] / MiB, 1) for r in ours],
        baseline_samples=[round(r["peak_rss_bytes"] / MiB, 1) for r in old],
    )
    rss.target = f"≤ {RSS_TARGET_MIB} MiB on a {config.big_archive_mb:,} MiB archive"
    rss.met = big.get("rss_met")
    return [by_old, bound, by_s3 if bound is by_cpu else by_cpu, disk, rss]


def _big_archive(ctx: BenchContext, bucket: Any, env: dict[str, str]) -> dict[str, Any]:
    """Ours once on a big archive (2 GiB): its peak RSS and temporary disk."""
    size = ctx.config.big_archive_mb
    if not size:
        return {}
    with ctx.phase("big archive: build and upload"):
        key, facts = upload_packed(bucket, ctx.workdir / "extraction-big", ctx.config, size)
    with ctx.phase("big archive: ours"):
        result = run_child(NAME_MODULE, ["ours", bucket.name, key], env=env)
    with ctx.phase("big archive: delete"):
        bucket.delete_prefix(f"orgs/{key.replace('/', '/episodes/')}/")
    rss = result["peak_rss_bytes"] / MiB
    disk = result["peak_disk_bytes"] / MiB
    largest = facts["largest_member_bytes"] / MiB
    return {
        "rss": {"peak_rss_mib": round(rss, 1), "archive_mib": round(facts["archive_bytes"] / MiB),
                "seconds": round(result["seconds"], 1)},
        "disk": {"peak_temp_disk_mib": round(disk, 2), "largest_member_mib": round(largest, 1)},
        "rss_met": rss <= RSS_TARGET_MIB,
        "disk_met": disk <= 1.1 * largest,
    }  # fmt: skip


NAME_MODULE = "benchmarks.extraction"


def main(argv: list[str]) -> None:
    """Child entry point: `python -m benchmarks.extraction ours|old BUCKET ORG/EP [SCRATCH]`."""
    kind, *args = argv
    print(json.dumps(child_ours(*args) if kind == "ours" else child_old(*args)))


if __name__ == "__main__":
    main(sys.argv[1:])
