"""Stage `frame_conversion`: data parquet → frame rows, column-wise polars vs a per-row loop.

Ours: ``episode_pipeline.lerobot.frames.frames_table`` (JSON text of ``observation``/``action``
built column-wise with ``struct.json_encode``). Baseline: the naive way, what a port of the
replaced worker's per-row loop does — read the rows, then for each row convert the timestamp and
``json.dumps`` the state and action. Both read the same file from disk and end with rows ready
for the database (a polars frame for ours, a list of tuples for the baseline).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow.parquet as pq

from benchmarks.common import (
    BenchContext,
    Result,
    median_of,
    rate_result,
    timed,
    write_data_parquet,
)
from episode_pipeline.lerobot.frames import frames_table

NAME = "frame_conversion"


def baseline_rows(path: Path) -> list[tuple]:
    """The per-row Python loop: one dict per row, json.dumps for each vector."""
    rows = pq.read_table(path).to_pylist()
    out = []
    for order, row in enumerate(rows):
        state = row["observation.state"]
        action = row["action"]
        out.append(
            (
                order,
                row.get("episode_index"),
                row.get("frame_index"),
                math.floor(row["timestamp"] * 1000 + 0.5),
                json.dumps({"state": state}),
                json.dumps(action) if action is not None else None,
            )
        )
    return out


def _check_same(path: Path) -> None:
    """Both ways give the same rows (same count, timestamps and vectors to float32 precision)."""
    ours = frames_table(path, path=str(path))
    theirs = baseline_rows(path)
    if ours.height != len(theirs):
        raise AssertionError(f"{NAME}: {ours.height} rows vs baseline {len(theirs)}")
    for index in {0, len(theirs) // 2, len(theirs) - 1}:
        mine = ours.row(index)
        if mine[3] != theirs[index][3]:
            raise AssertionError(f"{NAME}: timestamp_ms differs at row {index}")
        a = json.loads(mine[4])["state"]
        b = json.loads(theirs[index][4])["state"]
        if any(abs(x - y) > 1e-4 * max(1.0, abs(y)) for x, y in zip(a, b, strict=True)):
            raise AssertionError(f"{NAME}: observation differs at row {index}: {a} vs {b}")


def run(ctx: BenchContext) -> list[Result]:
    config = ctx.config
    path = write_data_parquet(
        ctx.workdir / "frames" / "file-000.parquet", config.rows, config.state_dim
    )
    _check_same(path)
    ours_s, base_s = median_of(
        config.repeats,
        lambda: timed(lambda: frames_table(path, path=str(path))),
        lambda: timed(lambda: baseline_rows(path)),
    )
    details = {
        "rows": config.rows,
        "state_dim": config.state_dim,
        "parquet_bytes": path.stat().st_size,
    }
    return [
        rate_result(
            NAME,
            "rows_per_second",
            config.rows,
            "rows/s",
            ours_s,
            base_s,
            baseline_name="naive: pyarrow to_pylist + per-row json.dumps",
            details=details,
        )
    ]
