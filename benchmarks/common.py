"""What every stage shares: the result record, timing, synthetic data and machine facts.

Figures are ratios against a baseline measured in the same process run on the same data, so
they compare implementations rather than machines; absolute numbers are kept for context only.
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("polars", "pyarrow", "psycopg", "zstandard", "dagster", "numpy")


@dataclass
class Result:
    """One measured figure: ours vs a baseline measured in the same run on the same data.

    ``ratio`` is always ``ours / baseline``; ``better`` says which direction wins, and
    ``factor`` is the advantage (>1 means ours wins) so a reader never has to invert it.
    ``baseline_name`` says what the baseline is (the old way, or the machine's limit);
    ``ours_samples``/``baseline_samples`` are the per-repeat values the medians come from.
    ``target`` is the issue's target for this figure and ``met`` whether this run met it.
    """

    stage: str
    metric: str
    ours: float
    baseline: float
    unit: str
    better: str  # "higher" | "lower"
    repeats: int = 1
    details: dict[str, Any] = field(default_factory=dict)
    baseline_name: str = ""
    ours_samples: list[float] = field(default_factory=list)
    baseline_samples: list[float] = field(default_factory=list)
    target: str | None = None
    met: bool | None = None

    @property
    def ratio(self) -> float:
        return self.ours / self.baseline if self.baseline else math.inf

    @property
    def factor(self) -> float:
        if self.better == "higher":
            return self.ratio
        return self.baseline / self.ours if self.ours else math.inf

    def expect_factor(self, minimum: float, text: str) -> Result:
        """Set the target: the advantage must be at least `minimum` (`text` says it in words)."""
        self.target = text
        self.met = self.factor >= minimum
        return self

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ratio"] = _finite(self.ratio)
        data["factor"] = _finite(self.factor)
        data["ours_spread"] = spread(self.ours_samples)
        data["baseline_spread"] = spread(self.baseline_samples)
        return data


def spread(samples: list[float]) -> list[float] | None:
    """[min, max] of the repeats (None for fewer than two)."""
    if len(samples) < 2:
        return None
    return [_finite(min(samples)), _finite(max(samples))]


def _finite(value: float) -> float | None:
    return float(f"{value:.4g}") if math.isfinite(value) else None


def rate_result(
    stage: str,
    metric: str,
    amount: float,
    unit: str,
    ours_s: list[float],
    base_s: list[float],
    *,
    baseline_name: str,
    details: dict[str, Any] | None = None,
    baseline_amount: float | None = None,
) -> Result:
    """A throughput comparison (`amount` per second) from each repeat's seconds on each side
    (the baseline's `baseline_amount`, when it did less of the same work)."""
    ours = [amount / s for s in ours_s]
    base = [(amount if baseline_amount is None else baseline_amount) / s for s in base_s]
    return Result(
        stage=stage,
        metric=metric,
        ours=_round(median(ours)),
        baseline=_round(median(base)),
        unit=unit,
        better="higher",
        repeats=min(len(ours_s), len(base_s)),
        details={
            **(details or {}),
            "ours_seconds": [round(s, 4) for s in ours_s],
            "baseline_seconds": [round(s, 4) for s in base_s],
        },
        baseline_name=baseline_name,
        ours_samples=[_round(v) for v in ours],
        baseline_samples=[_round(v) for v in base],
    )


def seconds_result(
    stage: str,
    metric: str,
    ours_s: list[float],
    base_s: list[float],
    *,
    baseline_name: str,
    details: dict[str, Any] | None = None,
) -> Result:
    """A wall-time comparison (lower wins) from each repeat's seconds on each side."""
    return Result(
        stage=stage,
        metric=metric,
        ours=round(median(ours_s), 3),
        baseline=round(median(base_s), 3),
        unit="s",
        better="lower",
        repeats=min(len(ours_s), len(base_s)),
        details=details or {},
        baseline_name=baseline_name,
        ours_samples=[round(s, 3) for s in ours_s],
        baseline_samples=[round(s, 3) for s in base_s],
    )


def _round(value: float) -> float:
    return round(value) if abs(value) >= 100 else round(value, 3)


@dataclass
class Config:
    """Sizes for one run; ``quick()`` is for the smoke test (seconds, not minutes)."""

    rows: int = 100_000  # frame rows for the PostgreSQL load and the conversion
    state_dim: int = 6  # floats in observation.state and action (SO-101 arm: 6 joints)
    wide_state_dim: int = 50  # a humanoid's state/action vectors
    wide_rows: int = 30_000  # rows for the wide vectors (jsonb parsing makes them slow)
    old_rows: int = 10_000  # rows the old INSERT batches load (their rows/s is flat in the count)
    stream_rows: int = 1_000_000  # the long episode whose load must keep memory flat
    memory_repeats: int = 3  # child runs per side for peak-RSS figures
    startup_seconds: float = 2.0  # the episode `process` starts up for (one camera)
    batch_k: int = 10  # episodes in the batch run measured against a batch of one
    batch_seconds: float = 2.0  # each of its short episodes
    batch_cameras: int = 1  # cameras of each (docs/scale.md's campaign episode: 2 cameras, 30 s)
    e2e_cameras: int = 3  # the episode taken from upload to `processed` through the daemon
    e2e_seconds: float = 60.0
    # 320x240 keeps `make bench` inside ten minutes on 2 cores: at 640x480 (common LeRobot
    # cameras) this stage alone takes over four (results/end_to_end-640x480/).
    e2e_width: int = 320
    e2e_height: int = 240
    sensor_uploads: int = 1_000  # uploads queued at once for the uploads sensor (4 ticks)
    heartbeat_runs: int = 5_000  # queued runs whose messages one heartbeat renews
    # fleet: the store grows through these sizes; every figure is N against the first
    fleet_sizes: str = "1000,10000"  # full run: 1000,10000,100000,1000000; 0: no fleet,
    # only the storage of one real processed episode
    # sizes up to this are every run kept (no retention); above, what a deployment with
    # retention holds: all application rows, Dagster's window (fleet_state.FleetState.settle)
    fleet_unpruned_max: int = 100_000
    fleet_per_day: int = 10_000  # the fleet's uploads a day: runs' spacing, retention's window
    fleet_new_uploads: int = 300  # new uploads one uploads tick decides
    # make bench's sizes are cut to fit its time; the full run sets the (README)
    fleet_burst: int = 300  # runs in flight for the heartbeat, then succeeding at once (1,000)
    fleet_reconcile_ticks: int = 1  # reconciliation ticks walked at each size (2)
    fleet_s3_objects: int = 1_000  # episodes with an archive in S3 (the walk's first pages)
    fleet_all_events: int = 0  # 1: clone every event of the template run, not only assets'
    fleet_daemon_uploads: int = 100  # uploads queued at once until their runs exist (300)
    fleet_ui: int = 1  # 0: skip the UI's GraphQL queries (no webserver, no browser); 2: only them
    # the UI's pages also on Dagster's own event-log storage up to this size (10,000: 45-161 s a
    # page, minutes of make bench; the committed UI runs set 10000)
    fleet_ui_baseline_max: int = 1_000
    # > 0: only the campaign figures at each size, over a slice of this many seconds
    # (fleet_campaign.py; results/fleet-campaign/)
    fleet_campaign_seconds: int = 0
    fleet_campaign_ceiling_runs: int = 120  # stand-in runs of the run queue's ceiling (0: none)
    # the campaign's K: 1, the episode job's runs; above (25, the default), the batch job's, at
    # the default plan's run rate (fleet_campaign.paced_concurrency)
    fleet_campaign_k: int = 1
    fleet_campaign_run_seconds: float = 1.0  # a stand-in run's seconds (a batch's K share them)
    ledger_sizes: str = "100000,1000000"  # campaign_ledger's campaigns (rows each)
    footprint_images: int = 0  # 1: footprint also builds and weighs `make image`'s (podman)
    archive_padding_mb: int = 64  # incompressible mp4-named members added to the sample
    big_archive_mb: int = 2048  # the big archive whose extraction's peak RSS is checked (0: skip)
    padding_files: int = 4
    cameras: int = 2
    seconds: float = 4.0
    repeats: int = 3
    quick: bool = False

    @classmethod
    def quick_config(cls) -> Config:
        return cls(
            rows=2_000,
            wide_rows=500,
            old_rows=1_500,
            stream_rows=20_000,
            memory_repeats=1,
            startup_seconds=1.0,
            batch_k=2,
            batch_seconds=1.0,
            e2e_cameras=1,
            e2e_seconds=1.0,
            sensor_uploads=30,
            heartbeat_runs=25,
            fleet_sizes="100,300",
            fleet_new_uploads=30,
            fleet_burst=20,
            fleet_reconcile_ticks=1,
            fleet_s3_objects=100,
            fleet_daemon_uploads=20,
            ledger_sizes="3000,6000",
            archive_padding_mb=4,
            big_archive_mb=0,
            padding_files=2,
            cameras=1,
            seconds=1.0,
            repeats=1,
            quick=True,
        )


def median_of(repeats: int, *calls: Callable[[], float]) -> list[list[float]]:
    """Run the calls interleaved `repeats` times (A B A B ...) so drift hits both alike."""
    samples: list[list[float]] = [[] for _ in calls]
    for _ in range(repeats):
        for index, call in enumerate(calls):
            samples[index].append(call())
    return samples


def timed(call: Callable[[], Any]) -> float:
    """Wall seconds of one call."""
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def median(values: list[float]) -> float:
    return statistics.median(values)


def peak_rss_self() -> int:
    """This process's own high-water RSS (VmHWM), in bytes.

    Not ``ru_maxrss``: Linux carries that over from the parent across fork+exec, so a child of
    the (large) runner would report the runner's size.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # pragma: no cover


def run_child(
    module: str, args: list[str], *, env: dict[str, str] | None = None, timeout: float = 600
) -> dict[str, Any]:
    """`python -m module args` from the repository; its last stdout line is JSON, returned.

    Each measured side runs in its own process so its memory and imports are its own.
    """
    out = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=timeout,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_data_parquet(path: Path, rows: int, state_dim: int, *, seed: int = 0) -> Path:
    """A LeRobot v3.0 data parquet (lerobot's column types and row groups) with `rows` frames."""
    rng = np.random.default_rng(seed)
    fps = 30
    t = np.arange(rows) / fps
    phase = rng.uniform(0, math.pi, size=state_dim)
    state = (30.0 * np.sin(t[:, None] * 1.5 + phase[None, :])).astype(np.float32)
    action = (state + rng.normal(0, 0.5, size=state.shape)).astype(np.float32)
    episode_len = 900  # 30 s episodes, as a long recording session would have

    def vectors(values: np.ndarray) -> pa.FixedSizeListArray:
        return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), state_dim)

    table = pa.table(
        {
            "action": vectors(action),
            "observation.state": vectors(state),
            "timestamp": pa.array(((np.arange(rows) % episode_len) / fps).astype(np.float32)),
            "frame_index": pa.array(np.arange(rows) % episode_len, type=pa.int64()),
            "episode_index": pa.array(np.arange(rows) // episode_len, type=pa.int64()),
            "index": pa.array(np.arange(rows), type=pa.int64()),
            "task_index": pa.array(np.zeros(rows), type=pa.int64()),
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=episode_len)  # v3.0: one row group per episode
    return path


def _first_line(command: list[str]) -> str | None:
    if shutil.which(command[0]) is None:
        return None
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0].strip("* ") if text else None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    return None


def _git_commit() -> str | None:
    """The checked-out commit, read from .git files (no git command is run).

    In a worktree `.git` is a file naming its own git directory, whose `commondir` holds the
    branches.
    """
    git = REPO_ROOT / ".git"
    try:
        if git.is_file():
            git = (REPO_ROOT / git.read_text().strip().removeprefix("gitdir: ")).resolve()
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        common = git / "commondir"
        if common.exists():
            git = (git / common.read_text().strip()).resolve()
        if (git / ref).exists():
            return (git / ref).read_text().strip()
        packed = git / "packed-refs"
        if packed.exists():
            for line in packed.read_text().splitlines():
                if line.endswith(" " + ref):
                    return line.split()[0]
    except OSError:
        pass
    return None


def machine_facts() -> dict[str, Any]:
    """What the ratios were measured on: cores, CPU, memory, Python and library versions."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "cpu": _cpu_model(),
        "memory_gib": _memory_gib(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "packages": versions,
        "zstd": _first_line(["zstd", "--version"]),
        "tar": _first_line(["tar", "--version"]),
        "git_commit": _git_commit(),
    }


@dataclass
class BenchContext:
    """What a stage gets: sizes, a scratch directory, and the local stack on demand.

    ``stack()`` starts the embedded stack (PostgreSQL, moto) the first time a stage asks for it
    and returns its `StackInfo`; ``database()`` is its PostgreSQL as a resource. Stages that need
    neither never pay for them. ``facts`` collects run facts a stage learns (e.g. the PostgreSQL
    server version) for the results file.
    """

    config: Config
    workdir: Path
    stack: Callable[[], Any]
    database: Callable[[], Any]
    facts: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)  # the running stage's, reset per stage

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a part of the stage (set-up, one side's repeats...): where `make bench`'s minutes
        go, in the results beside the stage's total."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = round(self.phases.get(name, 0.0) + time.perf_counter() - started, 2)


@contextmanager
def private_stack(ctx: BenchContext, name: str) -> Iterator[Any]:
    """A stack of a stage's own under its work folder (`name`), stopped afterwards."""
    from episode_pipeline.local.stack import start_stack, stop_stack

    home = ctx.workdir / name
    info = start_stack(home)
    try:
        yield info
    finally:
        stop_stack(home, save_objects=False)
