"""The benchmark runner works end to end on tiny sizes and writes the expected result files.

Structure only: no figure is asserted (speed is reported by `make bench`, never tested). The
stages that start processes of their own at every size (`startup`: `episode-pipeline process`;
`end_to_end`: a private stack and the daemon; `hls`: FFmpeg) are left to `make bench`; their
pure parts are tested here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import report as bench_report
from benchmarks import run as bench_run
from benchmarks.batch import Steps
from benchmarks.common import Result
from benchmarks.sensor import Drain, ShardedQueue, shard_sizes
from episode_pipeline.local.stack import StackInfo

QUICK_STAGES = ["sensor", "frames_load", "frame_conversion", "extraction", "campaign_ledger"]
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
    "baseline_name",
    "ours_samples",
    "baseline_samples",
    "ours_spread",
    "baseline_spread",
    "target",
    "met",
}


def test_result_ratio_factor_spread_and_target() -> None:
    faster = Result("s", "m", ours=300.0, baseline=100.0, unit="rows/s", better="higher")
    smaller = Result(
        "s", "m", ours=10.0, baseline=200.0, unit="MiB", better="lower", ours_samples=[9.0, 12.0]
    )
    assert (faster.ratio, faster.factor) == (3.0, 3.0)
    assert (smaller.ratio, smaller.factor) == (0.05, 20.0)
    assert smaller.as_dict()["factor"] == 20.0
    assert smaller.as_dict()["ours_spread"] == [9.0, 12.0]
    assert faster.as_dict()["ours_spread"] is None  # one sample has no spread
    assert faster.expect_factor(2.5, "at least 2.5x").met is True
    assert faster.expect_factor(3.5, "at least 3.5x").met is False
    # a rate of nothing (a campaign that never reached its steady state) is written, not a crash
    stalled = Result("s", "m", ours=0.0, baseline=11.6, unit="episodes/s", better="higher")
    assert "| - |" in "\n".join(bench_report.results_table([stalled.as_dict()]))


def test_the_sensor_schedule_waits_the_interval_between_ticks_but_not_after_the_last() -> None:
    drain = Drain(tick_seconds=[2.0, 12.0, 3.0, 0.5], tick_requests=[300, 300, 100, 0])
    # 10 s (interval) + 12 s (a tick longer than the interval) + 3 s (the last one's own time).
    assert drain.schedule_seconds(interval=10) == 25.0
    assert Drain().schedule_seconds(interval=10) == 0.0


class FakeShard:
    """A queue holding `size` messages; counts its calls (a hand-written fake of UploadQueue)."""

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.waiting = [f"{name}-{index}" for index in range(size)]
        self.receives = 0
        self.renewed: list[str] = []

    def receive(self, max_messages: int = 10) -> list[dict[str, str]]:
        self.receives += 1
        batch, self.waiting = self.waiting[:max_messages], self.waiting[max_messages:]
        return [{"MessageId": m, "ReceiptHandle": f"handle-{m}"} for m in batch]

    def extend_visibility_many(self, handles: list[str], seconds: int | None = None) -> dict:
        self.renewed += handles
        return {}


def test_a_sharded_queue_drains_every_shard_once_and_answers_empty_once() -> None:
    assert shard_sizes(3, 25) == [10, 10, 5]
    shards = [FakeShard(name, size) for name, size in (("a", 10), ("b", 10), ("c", 5))]
    queue = ShardedQueue(shards, 25)  # type: ignore[arg-type]
    received = [m["MessageId"] for _ in range(3) for m in queue.receive()]
    assert len(set(received)) == 25 and not any(s.waiting for s in shards)
    assert queue.receive() == []  # drained: one empty answer, as one queue gives
    assert sum(s.receives for s in shards) == 4
    queue.extend_visibility_many(["handle-c-0", "handle-a-3"])
    assert (shards[0].renewed, shards[2].renewed) == (["handle-a-3"], ["handle-c-0"])


@pytest.mark.integration
def test_quick_run_writes_results(stack: StackInfo, tmp_path: Path) -> None:
    out = tmp_path / "results"
    stages = [arg for name in QUICK_STAGES for arg in ("--stage", name)]
    code = bench_run.main(["--quick", *stages, "--out", str(out), "--stack-home", stack.home])
    assert code == 0

    report = json.loads((out / "latest.json").read_text())
    assert report["schema_version"] == bench_run.SCHEMA_VERSION
    assert {"generated_at", "config", "machine", "facts", "stages", "results"} <= set(report)
    assert report["config"]["quick"] is True
    assert {"cores", "python", "packages", "platform", "git_commit"} <= set(report["machine"])
    assert report["facts"]["postgres"] and report["facts"]["load"]
    assert {name: s["status"] for name, s in report["stages"].items()} == dict.fromkeys(
        QUICK_STAGES, "ok"
    )
    assert {r["stage"] for r in report["results"]} == set(QUICK_STAGES)
    for row in report["results"]:
        assert set(row) == RESULT_KEYS
        assert row["ours"] > 0 and row["baseline"] > 0
        assert row["better"] in {"higher", "lower"}
        assert row["baseline_name"]
    sensor = next(r for r in report["results"] if r["metric"] == "uploads_per_minute")
    # Structure, not speed: every queued upload got exactly one run request.
    assert sensor["details"]["missing_runs"] == sensor["details"]["duplicate_runs"] == 0
    disk = next(r for r in report["results"] if r["metric"] == "peak_temp_disk")
    # Streaming never needs more scratch disk than the whole extraction.
    assert disk["ours"] < disk["baseline"]

    summary = (out / "latest.md").read_text()
    assert "| frames_load |" in summary
    assert "Machine:" in summary


@pytest.mark.integration
def test_stack_of_the_session_is_left_running(stack: StackInfo, tmp_path: Path) -> None:
    """--stack-home on a running stack must not stop it (the smoke test shares the session's)."""
    from episode_pipeline.local.stack import stack_status

    bench_run.main(["--quick", "--stage", "frame_conversion", "--out", str(tmp_path),
                    "--stack-home", stack.home])  # fmt: skip
    assert stack_status(Path(stack.home)).running


def test_batch_steps_pair_each_start_with_its_end_and_give_medians() -> None:
    steps = Steps()
    steps.add_run(
        [
            ("hls_renditions", "STEP_START", 10.0),
            ("episode", "STEP_START", 11.0),  # steps may overlap
            ("hls_renditions", "STEP_SUCCESS", 14.0),
            ("episode", "STEP_FAILURE", 12.5),
            ("frames", "STEP_SUCCESS", 20.0),  # no start seen: not counted
        ]
    )
    steps.add_run([("hls_renditions", "STEP_START", 0.0), ("hls_renditions", "STEP_SUCCESS", 6.0)])
    steps.materialized.update({"hls_renditions", "episode"})
    assert steps.summary() == {
        "runs": 2,
        "materialized": ["episode", "hls_renditions"],
        "step_seconds_median": {"episode": 1.5, "hls_renditions": 5.0},
        "step_runs": {"episode": 1, "hls_renditions": 2},
    }
