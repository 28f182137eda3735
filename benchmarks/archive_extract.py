"""Stage `archive_extraction`: one-pass streaming vs decompress-and-untar-to-disk.

Ours: ``episode_pipeline.archive.stream.ArchiveReader`` over the ``.tar.zst``, handling members
exactly as ``extraction.extract_archive`` does — parquets spooled to a temporary file (their row
count is in the footer) and deleted after, every other member read straight from the stream
(where the pipeline hands it to a multipart upload; here the bytes go nowhere).
Baseline: the conventional worker pipeline "download, zstd, untar" — ``zstd -dc ARCHIVE | tar -x``
into a temporary directory, then every extracted file read back (what uploading them does). The
temp directory's removal is *not* timed, which favours the baseline.

Each side runs in its own child process so its peak RSS (``VmHWM``) is its own; the baseline's
RSS is the largest of its processes (zstd, tar and the Python reader). Peak temporary disk is
measured, not computed: allocated blocks of the largest spooled file (ours) and of the whole
extracted tree (baseline). Both read the archive from the same local file (page cache warm after
the first pass), so network time — identical for both — is left out.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NAME = "archive_extraction"
CHUNK = 1 << 20
MiB = 1 << 20


def _allocated(path: Path) -> int:
    """Bytes of disk the file really occupies (like du), not its apparent size."""
    return path.stat().st_blocks * 512


def _peak_rss_self() -> int:
    """This process's own high-water RSS (VmHWM), in bytes.

    Not ``ru_maxrss``: Linux carries that over from the parent across fork+exec, so a child of
    the (large) runner would report the runner's size.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # pragma: no cover


def _drain(fileobj: Any, buffer: bytearray) -> int:
    total = 0
    while True:
        got = fileobj.readinto(buffer)
        if not got:
            return total
        total += got


def child_ours(archive: Path, scratch: Path) -> dict[str, Any]:
    """Stream every member once, spooling parquets like the extraction does."""
    from episode_pipeline.archive.stream import ArchiveReader, spooled

    buffer = bytearray(CHUNK)
    members = total = peak_disk = largest = 0
    started = time.perf_counter()
    with archive.open("rb") as raw:
        for member in ArchiveReader(raw, name=str(archive)):
            members += 1
            largest = max(largest, member.size)
            if member.path.endswith(".parquet"):
                with spooled(member, scratch) as path:
                    peak_disk = max(peak_disk, _allocated(path))
                    with path.open("rb") as spooled_file:  # the upload reads it back
                        total += _drain(spooled_file, buffer)
            else:
                total += _drain(member.fileobj, buffer)
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "bytes": total,
        "members": members,
        "largest_member_bytes": largest,
        "peak_disk_bytes": peak_disk,
        "peak_rss_bytes": _peak_rss_self(),
    }


def child_baseline(archive: Path, scratch: Path) -> dict[str, Any]:
    """`zstd -dc | tar -x` into a temp dir, then read every file back; measure the tree."""
    target = Path(tempfile.mkdtemp(prefix="untar-", dir=scratch))
    buffer = bytearray(CHUNK)
    started = time.perf_counter()
    unzstd = subprocess.Popen(["zstd", "-dcq", str(archive)], stdout=subprocess.PIPE)
    untar = subprocess.Popen(["tar", "-x", "-C", str(target)], stdin=unzstd.stdout)
    assert unzstd.stdout is not None
    unzstd.stdout.close()  # tar owns the pipe now; zstd gets SIGPIPE if tar dies
    # wait4 gives each tool's own ru_maxrss (at worst inflated to this small process's size at
    # fork time, which the reader's own VmHWM below already covers).
    tool_rss = 0
    for process in (untar, unzstd):
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        tool_rss = max(tool_rss, usage.ru_maxrss * 1024)
    if untar.returncode != 0 or unzstd.returncode != 0:
        raise RuntimeError(
            f"zstd | tar failed on {archive} ({unzstd.returncode}, {untar.returncode})"
        )
    members = total = disk = largest = 0
    for path in sorted(p for p in target.rglob("*") if p.is_file()):
        members += 1
        disk += _allocated(path)
        largest = max(largest, path.stat().st_size)
        with path.open("rb") as handle:
            total += _drain(handle, buffer)
    seconds = time.perf_counter() - started
    shutil.rmtree(target)
    return {
        "seconds": seconds,
        "bytes": total,
        "members": members,
        "largest_member_bytes": largest,
        "peak_disk_bytes": disk,
        "peak_rss_bytes": max(_peak_rss_self(), tool_rss),
        "tools_peak_rss_bytes": tool_rss,
    }


def _run_child(kind: str, archive: Path, scratch: Path) -> dict[str, Any]:
    from benchmarks.common import REPO_ROOT

    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.archive_extract", kind, str(archive), str(scratch)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{NAME}: the {kind} child failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def build_archive(workdir: Path, config: Any) -> tuple[Path, dict[str, Any]]:
    """A real sample episode (mp4s, parquets, meta) plus incompressible mp4-named padding.

    Encoded videos are already compressed, so random bytes are the honest stand-in for a long
    multi-camera recording; they make the archive big enough to measure without minutes of
    FFmpeg encoding.
    """
    from episode_pipeline.lerobot.sample import SampleSpec, pack_archive, write_dataset

    folder = workdir / "dataset"
    spec = SampleSpec(cameras=config.cameras, seconds=config.seconds, width=640, height=480)
    write_dataset(folder, spec)
    padding = config.archive_padding_mb * MiB
    per_file = padding // max(1, config.padding_files)
    for index in range(config.padding_files if padding else 0):
        target = folder / f"videos/observation.images.pad{index}/chunk-000/file-000.mp4"
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("wb") as handle:
            remaining = per_file
            while remaining:
                block = min(remaining, 8 * MiB)
                handle.write(os.urandom(block))
                remaining -= block
    # A long recording's data file beside the sample's short one: what ours has to spool.
    from benchmarks.common import write_data_parquet

    write_data_parquet(folder / "data/chunk-000/file-001.parquet", config.rows, config.state_dim)
    archive = workdir / "episode.tar.zst"
    members = pack_archive(folder, archive, root_folder=spec.root_folder)
    expanded = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    shutil.rmtree(folder)
    return archive, {
        "archive_bytes": archive.stat().st_size,
        "expanded_file_bytes": expanded,
        "members": len(members),
        "cameras": spec.cameras,
        "seconds": spec.seconds,
        "resolution": f"{spec.width}x{spec.height}",
        "padding_bytes": per_file * config.padding_files if padding else 0,
    }


def run(ctx: Any) -> list[Any]:
    from benchmarks.common import Result, median

    config = ctx.config
    archive, facts = build_archive(ctx.workdir / "archive", config)
    scratch = ctx.workdir / "archive" / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    ours: list[dict[str, Any]] = []
    base: list[dict[str, Any]] = []
    for _ in range(config.repeats):
        ours.append(_run_child("ours", archive, scratch))
        base.append(_run_child("baseline", archive, scratch))
    if {r["bytes"] for r in ours} != {r["bytes"] for r in base}:
        raise AssertionError(
            f"{NAME}: ours read {ours[0]['bytes']} bytes, baseline {base[0]['bytes']}"
        )
    data_bytes = ours[0]["bytes"]
    ours_s = [r["seconds"] for r in ours]
    base_s = [r["seconds"] for r in base]
    return [
        Result(
            stage=NAME,
            metric="throughput",
            ours=round(data_bytes / MiB / median(ours_s), 1),
            baseline=round(data_bytes / MiB / median(base_s), 1),
            unit="MiB/s",
            better="higher",
            repeats=config.repeats,
            details={
                **facts,
                "member_bytes": data_bytes,
                "ours_seconds": [round(s, 4) for s in ours_s],
                "baseline_seconds": [round(s, 4) for s in base_s],
            },
        ),
        Result(
            stage=NAME,
            metric="peak_temp_disk",
            ours=round(max(r["peak_disk_bytes"] for r in ours) / MiB, 3),
            baseline=round(max(r["peak_disk_bytes"] for r in base) / MiB, 3),
            unit="MiB",
            better="lower",
            details={
                "ours": "largest spooled parquet (allocated blocks)",
                "baseline": "extracted tree (allocated blocks)",
                "largest_member_mib": round(ours[0]["largest_member_bytes"] / MiB, 3),
            },
            repeats=config.repeats,
        ),
        Result(
            stage=NAME,
            metric="peak_rss",
            ours=round(max(r["peak_rss_bytes"] for r in ours) / MiB, 1),
            baseline=round(max(r["peak_rss_bytes"] for r in base) / MiB, 1),
            unit="MiB",
            better="lower",
            repeats=config.repeats,
            details={
                "ours": "VmHWM of the Python process streaming the archive",
                "baseline": "largest of zstd, tar (ru_maxrss via wait4) and the reader (VmHWM)",
            },
        ),
    ]


def main(argv: list[str]) -> None:
    """Child entry point: `python -m benchmarks.archive_extract ours|baseline ARCHIVE SCRATCH`."""
    kind, archive, scratch = argv
    work = child_ours if kind == "ours" else child_baseline
    print(json.dumps(work(Path(archive), Path(scratch))))


if __name__ == "__main__":
    main(sys.argv[1:])
