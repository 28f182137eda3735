"""What every stage shares: the result record, timing, synthetic data and machine facts.

Figures are ratios against a baseline measured in the same process run on the same data, so
they compare implementations rather than machines; absolute numbers are kept for context only.
"""

from __future__ import annotations

import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
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
    """One measured figure: ours vs the baseline on the same data.

    ``ratio`` is always ``ours / baseline``; ``better`` says which direction wins, and
    ``factor`` is the advantage (>1 means ours wins) so a reader never has to invert it.
    """

    stage: str
    metric: str
    ours: float
    baseline: float
    unit: str
    better: str  # "higher" | "lower"
    repeats: int = 1
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.ours / self.baseline if self.baseline else math.inf

    @property
    def factor(self) -> float:
        if self.better == "higher":
            return self.ratio
        return self.baseline / self.ours if self.ours else math.inf

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ratio"] = _finite(self.ratio)
        data["factor"] = _finite(self.factor)
        return data


def _finite(value: float) -> float | None:
    return float(f"{value:.4g}") if math.isfinite(value) else None


@dataclass
class Config:
    """Sizes for one run; ``quick()`` is for the smoke test (seconds, not minutes)."""

    rows: int = 100_000  # frame rows for the PostgreSQL load and the conversion
    state_dim: int = 6  # floats in observation.state and action (SO-101 arm: 6 joints)
    archive_padding_mb: int = 160  # incompressible mp4-named members added to the sample
    padding_files: int = 4
    cameras: int = 2
    seconds: float = 4.0
    repeats: int = 3
    quick: bool = False

    @classmethod
    def quick_config(cls) -> Config:
        return cls(
            rows=2_000,
            archive_padding_mb=4,
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


def rows_per_second_result(
    stage: str,
    rows: int,
    ours_s: list[float],
    base_s: list[float],
    *,
    repeats: int,
    details: dict[str, Any],
) -> Result:
    """A rows/s comparison from the seconds each side took for the same `rows`."""
    return Result(
        stage=stage,
        metric="rows_per_second",
        ours=round(rows / median(ours_s)),
        baseline=round(rows / median(base_s)),
        unit="rows/s",
        better="higher",
        repeats=repeats,
        details={
            "rows": rows,
            **details,
            "ours_seconds": [round(s, 4) for s in ours_s],
            "baseline_seconds": [round(s, 4) for s in base_s],
        },
    )


def write_data_parquet(path: Path, rows: int, state_dim: int, *, seed: int = 0) -> Path:
    """A LeRobot v3.0 data parquet (the column types lerobot writes) with `rows` frames."""
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
    pq.write_table(table, path)
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
    """The checked-out commit, read from .git files (no git command is run)."""
    git = REPO_ROOT / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
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
    """What a stage gets: sizes, a scratch directory, and the database on demand.

    ``database()`` starts the embedded stack the first time a stage asks for it, so stages that
    do not need PostgreSQL never pay for it. ``facts`` collects run facts a stage learns (e.g.
    the PostgreSQL server version) for the results file.
    """

    config: Config
    workdir: Path
    database: Callable[[], Any]
    facts: dict[str, Any] = field(default_factory=dict)
