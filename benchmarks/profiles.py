"""Profiles of the stages that miss a target: ``python -m benchmarks.profiles STAGE [--out DIR]``.

The issue asks for the profile behind every missed target, with what it would take; these are
they, written to ``results/profiles/<stage>.txt`` on a private stack (quiet machine, please):

- ``startup``: cProfile (cumulative) and ``-X importtime`` of one ``episode-pipeline process``
  of the stage's episode, precompiled, after one warm-up run;
- ``extraction``: cProfile (own time) of ours on the stage's archive, and tracemalloc's view of
  ours at its peak on a big archive (``--big-mb``, 1 GiB) beside the process's peak RSS;
- ``end_to_end`` and ``hls``: the split each stage records itself (run events, transcode logs,
  /proc CPU sampling), read from ``results/latest.json``: no profiler needed, none added.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import end_to_end, extraction, hls, startup
from benchmarks.common import BenchContext, Config, peak_rss_self
from benchmarks.run import DEFAULT_OUT, _Stack

MiB = 1 << 20
SAMPLE_SECONDS = 0.2


def _stats_text(stats: pstats.Stats | cProfile.Profile | str, sort: str, lines: int) -> str:
    text = io.StringIO()
    pstats.Stats(stats, stream=text).sort_stats(sort).print_stats(lines)  # type: ignore[arg-type]
    return text.getvalue()


def _import_times(stderr: str, top: int = 40) -> list[str]:
    """The slowest cumulative imports from `python -X importtime` output (µs, module)."""
    rows = []
    for line in stderr.splitlines():
        fields = [f.strip() for f in line.removeprefix("import time:").split("|")]
        if line.startswith("import time:") and len(fields) == 3 and fields[1].isdigit():
            rows.append((int(fields[1]), fields[2]))
    return [f"{us:>10}  {name}" for us, name in sorted(rows, reverse=True)[:top]]


def profile_startup(ctx: BenchContext) -> str:
    ref, env = startup.prepare(ctx)
    startup.process_once(env, ref)  # the partition exists, the page cache is warm
    wall = startup.process_once(env, ref)["wall"]
    command = [startup._cli(), "process", ref.partition_key]
    prof = ctx.workdir / "process.prof"
    run = {"env": env, "capture_output": True, "check": True,
           "timeout": startup.PROCESS_TIMEOUT_SECONDS}  # fmt: skip
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "cProfile", "-o", str(prof), *command], **run)
    profiled = time.perf_counter() - started
    imports = subprocess.run([sys.executable, "-X", "importtime", *command], text=True, **run)
    return "\n".join([
        "startup: one `episode-pipeline process` of the stage's episode on a running stack",
        "(precompiled; in-process executor, so the steps run in this process; the transcode is",
        "a child process of its own)",
        "",
        f"process wall {wall:.2f} s unprofiled, {profiled:.2f} s under cProfile",
        "",
        "## cumulative (cProfile of the CLI process)",
        _stats_text(str(prof), "cumulative", 45),
        "## -X importtime: the slowest cumulative imports (µs, module)",
        *_import_times(imports.stderr),
    ])  # fmt: skip


def _traced_peak(call: Callable[[], Any]) -> tuple[int, tracemalloc.Snapshot | None]:
    """Run `call` with tracemalloc sampled every 0.2 s; the largest traced size and its snapshot."""
    tracemalloc.start(8)
    best: list[Any] = [0, None]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(SAMPLE_SECONDS):
            current, _ = tracemalloc.get_traced_memory()
            if current > best[0]:
                best[:] = [current, tracemalloc.take_snapshot()]

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        call()
    finally:
        done.set()
        sampler.join()
        tracemalloc.stop()
    return best[0], best[1]


def profile_extraction(ctx: BenchContext, big_mb: int) -> str:
    info = ctx.stack()
    os.environ.update(info.env)
    with extraction.bench_bucket(info) as bucket:
        padding = ctx.config.archive_padding_mb
        archive, facts = extraction.build_archive(ctx.workdir / "small", ctx.config, padding)
        key = extraction.upload_archive(bucket, archive)
        extraction.child_ours(bucket.name, key)  # warm: the page cache and botocore's model
        prof = cProfile.Profile()
        started = time.perf_counter()
        prof.runcall(extraction.child_ours, bucket.name, key)
        seconds = time.perf_counter() - started
        big_key, big_facts = extraction.upload_packed(
            bucket, ctx.workdir / "big", ctx.config, big_mb
        )
        traced, snapshot = _traced_peak(lambda: extraction.child_ours(bucket.name, big_key))
    where = []
    for stat in snapshot.statistics("traceback")[:6] if snapshot else []:
        where.append(f"{stat.size / MiB:8.1f} MiB in {stat.count} blocks")
        where += ["    " + line for line in stat.traceback.format()[-8:]]
    return "\n".join([
        "extraction: ours (extract_archive as the stage's child runs it, S3 client made first)",
        "",
        f"ours on {facts['archive_bytes'] / MiB:.0f} MiB: {seconds:.2f} s under cProfile",
        f"ours on {big_facts['archive_bytes'] / MiB:.0f} MiB (largest member "
        f"{big_facts['largest_member_bytes'] / MiB:.0f} MiB): peak RSS of this process "
        f"{peak_rss_self() / MiB:.0f} MiB (tracemalloc on), Python objects at the sampled peak "
        f"{traced / MiB:.0f} MiB",
        "",
        "## where the Python memory is at the sampled peak (tracemalloc, top 6)",
        *where,
        "",
        "## CPU of ours on the stage's archive (cProfile, own time)",
        _stats_text(prof, "tottime", 25),
    ])  # fmt: skip


def _recorded(stage: str, results: Path) -> str:
    """A stage's own split from the results file, laid out to be read."""
    report = json.loads(results.read_text())
    rows = [r for r in report["results"] if r["stage"] == stage]
    commit = (report["machine"].get("git_commit") or "-")[:12]
    lines = [
        f"{stage}: where the time goes, from the stage's own split in {results.name}",
        f"(commit {commit}, {report['generated_at']}, medians of {rows[0]['repeats']}; the run's",
        "events, logs and /proc CPU samples: no extra profiler)",
        "",
    ]
    for row in rows:
        lines.append(
            f"{row['metric']}: ours {row['ours']} {row['unit']} (repeats {row.get('ours_samples')})"
            f" vs {row['baseline_name']}: {row['baseline']} ({row.get('baseline_samples')})"
        )
        lines += ["  " + line for line in json.dumps(row["details"], indent=2).splitlines()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profiles", description=__doc__)
    parser.add_argument("stage", choices=(startup.NAME, extraction.NAME, end_to_end.NAME, hls.NAME))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT / "profiles")
    parser.add_argument("--results", type=Path, default=DEFAULT_OUT / "latest.json")
    parser.add_argument("--big-mb", type=int, default=1024, help="extraction's big archive")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix=f"episode-profile-{args.stage}-"))
    stack = _Stack(workdir / "stack-home")
    ctx = BenchContext(config=Config(), workdir=workdir, stack=stack.info, database=stack.database)
    try:
        if args.stage == startup.NAME:
            text = profile_startup(ctx)
        elif args.stage == extraction.NAME:
            text = profile_extraction(ctx, args.big_mb)
        else:
            text = _recorded(args.stage, args.results)
    finally:
        stack.close()
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / f"{args.stage}.txt"
    target.write_text(text + "\n")
    print(f"written: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
