"""The benchmark runner works end to end on tiny sizes and writes the expected result files.

Structure only: no figure is asserted (speed is reported by `make bench`, never tested).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import run as bench_run
from benchmarks.common import Result
from episode_pipeline.local.stack import StackInfo

RESULT_KEYS = {
    "stage",
    "metric",
    "ours",
    "baseline",
    "ratio",
    "factor",
    "unit",
    "better",
    "repeats",
    "details",
}
EXPECTED_METRICS = {
    ("pg_load", "rows_per_second"),
    ("frame_conversion", "rows_per_second"),
    ("archive_extraction", "throughput"),
    ("archive_extraction", "peak_temp_disk"),
    ("archive_extraction", "peak_rss"),
}


def test_result_ratio_and_factor_directions() -> None:
    faster = Result("s", "m", ours=300.0, baseline=100.0, unit="rows/s", better="higher")
    smaller = Result("s", "m", ours=10.0, baseline=200.0, unit="MiB", better="lower")
    assert (faster.ratio, faster.factor) == (3.0, 3.0)
    assert (smaller.ratio, smaller.factor) == (0.05, 20.0)
    assert smaller.as_dict()["factor"] == 20.0


@pytest.mark.integration
def test_quick_run_writes_results(stack: StackInfo, tmp_path: Path) -> None:
    out = tmp_path / "results"
    code = bench_run.main(["--quick", "--out", str(out), "--stack-home", stack.home])
    assert code == 0

    report = json.loads((out / "latest.json").read_text())
    assert report["schema_version"] == bench_run.SCHEMA_VERSION
    assert {"generated_at", "config", "machine", "facts", "stages", "results"} <= set(report)
    assert report["config"]["quick"] is True
    assert {"cores", "python", "packages", "platform"} <= set(report["machine"])
    assert report["machine"]["packages"]["polars"]
    assert report["facts"]["postgres"]
    assert {name: s["status"] for name, s in report["stages"].items()} == dict.fromkeys(
        bench_run.STAGES, "ok"
    )
    assert {(r["stage"], r["metric"]) for r in report["results"]} == EXPECTED_METRICS
    for row in report["results"]:
        assert set(row) == RESULT_KEYS
        assert row["ours"] > 0 and row["baseline"] > 0
        assert row["better"] in {"higher", "lower"}
    archive = next(r for r in report["results"] if r["metric"] == "peak_temp_disk")
    # Structure, not speed: streaming never needs more scratch disk than the full extraction.
    assert archive["ours"] < archive["baseline"]

    summary = (out / "latest.md").read_text()
    assert "| pg_load | rows_per_second |" in summary
    assert "Machine:" in summary


@pytest.mark.integration
def test_stack_of_the_session_is_left_running(stack: StackInfo, tmp_path: Path) -> None:
    """--stack-home on a running stack must not stop it (the smoke test shares the session's)."""
    from episode_pipeline.local.stack import stack_status

    bench_run.main(["--quick", "--stage", "pg_load", "--out", str(tmp_path), "--stack-home",
                    stack.home])  # fmt: skip
    assert stack_status(Path(stack.home)).running
