"""The metric lines against the EMF specification, the sensor wrapper and health's verdict,
without servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dagster import RunRequest, SensorResult, build_sensor_context, sensor

from episode_pipeline.config.settings import HealthSettings, Settings
from episode_pipeline.definitions import build_definitions
from episode_pipeline.defs.sensors.metered import is_metered, metered
from episode_pipeline.health import (
    Backlog,
    SensorHealth,
    Throughput,
    failure_streak,
    judge,
    percentile,
)
from episode_pipeline.local.dev import dev_environment
from episode_pipeline.runtime import metrics
from episode_pipeline_tests.support.dagster_internals import TickStatus

ROOT = Path(__file__).resolve().parents[1]
# CloudWatch's units (the EMF specification's enum) and the contract's sensor names.
CLOUDWATCH_UNITS = {"Seconds", "Microseconds", "Milliseconds", "Bytes", "Count", "None"}
CONTRACT_SENSORS = {
    "episode_uploads",
    "episode_upload_done",
    "episode_upload_heartbeat",
    "episode_failed_on_run_failure",
    "waiting_uploads",
    "stale_processing",
    "orphaned_runs",
    "dagster_retention",
    "campaign_driver",
}


def assert_emf(document: dict) -> None:
    """The structure the EMF specification requires of every document."""
    aws = document["_aws"]
    assert isinstance(aws["Timestamp"], int) and aws["Timestamp"] > 1_600_000_000_000
    assert aws["CloudWatchMetrics"], "a document without a directive publishes nothing"
    for directive in aws["CloudWatchMetrics"]:
        assert directive["Namespace"] == metrics.NAMESPACE
        assert 1 <= len(directive["Metrics"]) <= 100
        for dimension_set in directive["Dimensions"]:
            assert 1 <= len(dimension_set) <= 30
            for name in dimension_set:
                assert isinstance(document[name], str), name  # a dimension's value is a string
        for metric in directive["Metrics"]:
            assert metric["Unit"] in CLOUDWATCH_UNITS
            assert isinstance(document[metric["Name"]], int | float), metric


def lines_of(written: list[str]) -> list[dict]:
    assert all(line.endswith("\n") and line.count("\n") == 1 for line in written)
    return [json.loads(line) for line in written]


def test_an_episode_line_follows_the_specification() -> None:
    written: list[str] = []
    emitter = metrics.Emitter("prod-a", write=written.append, clock=lambda: 1_700_000_000.5)
    emitter.episode_processed(
        "acme/ep\n1",
        "run-1",
        latency_seconds=12.3456,
        run_wall_seconds=8,
        bytes_in=10,
        bytes_out=20,
    )
    (document,) = lines_of(written)
    assert_emf(document)
    assert document["_aws"]["Timestamp"] == 1_700_000_000_500
    assert document["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["Deployment"]]
    assert document["Deployment"] == "prod-a"
    assert document["episode"] == "acme/ep\n1"  # escaped: still one line
    assert (document["EpisodesProcessed"], document["EpisodeLatencySeconds"]) == (1, 12.346)
    assert (document["BytesIn"], document["BytesOut"], document["RunWallSeconds"]) == (10, 20, 8)


def test_a_failure_is_counted_overall_and_by_cause() -> None:
    written: list[str] = []
    metrics.Emitter("local", write=written.append).episode_failed("a/b", "r", "transcode", 3.0)
    (document,) = lines_of(written)
    assert_emf(document)
    failed, wall = document["_aws"]["CloudWatchMetrics"]
    assert failed["Dimensions"] == [["Deployment"], ["Deployment", "Cause"]]
    assert [m["Name"] for m in failed["Metrics"]] == ["EpisodesFailed"]
    assert wall["Dimensions"] == [["Deployment"]]  # the wall time is not split by cause
    assert (document["Cause"], document["EpisodesFailed"], document["RunWallSeconds"]) == (
        "transcode",
        1,
        3.0,
    )


def test_undeclared_metrics_and_missing_dimensions_are_refused() -> None:
    with pytest.raises(ValueError, match="undeclared metric 'Typo'"):
        metrics.emf_document(
            [metrics.Directive((("Deployment",),), {"Typo": 1})], {"Deployment": "x"}, 0
        )
    with pytest.raises(ValueError, match="no value for"):
        metrics.emf_document(
            [metrics.Directive((("Deployment", "Sensor"),), {"SensorTicks": 1})],
            {"Deployment": "x"},
            0,
        )
    with pytest.raises(ValueError, match="undeclared"):
        metrics.count("Typo")


def test_the_deployment_is_the_declared_setting() -> None:
    assert metrics.Emitter.from_env({}).deployment == "local"
    assert metrics.Emitter.from_env({"METRICS_DEPLOYMENT": "ep-prod"}).deployment == "ep-prod"


def test_counts_belong_to_the_tick_that_made_them() -> None:
    metrics.count(metrics.UPLOADS_RECEIVED, 5)  # outside a tick: nowhere, no error
    with metrics.counting_tick({metrics.UPLOADS_RECEIVED: 0}) as counts:
        metrics.count(metrics.UPLOADS_RECEIVED, 2)
        metrics.count(metrics.UPLOADS_RECEIVED)
        metrics.gauge(metrics.LIVE_PARTITIONS, 40)
        metrics.gauge(metrics.LIVE_PARTITIONS, 41)
    assert counts.values == {metrics.UPLOADS_RECEIVED: 3, metrics.LIVE_PARTITIONS: 41}


def test_the_wrapper_writes_one_line_per_tick_and_one_for_a_failing_tick() -> None:
    written: list[str] = []
    emitter = metrics.Emitter("t", write=written.append)

    @sensor(name="episode_uploads", job_name="episode")
    def requesting(context):
        metrics.count(metrics.UPLOADS_RECEIVED, 2)
        return SensorResult(run_requests=[RunRequest(run_key="a"), RunRequest(run_key="b")])

    @sensor(name="waiting_uploads", job_name="episode")
    def failing(context):
        metrics.count(metrics.LOST_UPLOADS_FOUND, 1)
        raise RuntimeError("wedged")

    metered(requesting, lambda: emitter).evaluate_tick(build_sensor_context())
    with pytest.raises(RuntimeError, match="wedged"):
        metered(failing, lambda: emitter).evaluate_tick(build_sensor_context())
    ok, failed = lines_of(written)
    for document in (ok, failed):
        assert_emf(document)
        assert document["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["Deployment", "Sensor"]]
    assert ok["Sensor"] == "episode_uploads"
    assert (ok["SensorTicks"], ok["SensorTickFailures"], ok["UploadsReceived"]) == (1, 0, 2)
    assert ok["RunsRequested"] == 2 and ok["TickSeconds"] >= 0
    assert (failed["Sensor"], failed["SensorTicks"], failed["SensorTickFailures"]) == (
        "waiting_uploads",
        1,
        1,
    )
    assert "LostUploadsFound" not in failed  # a failed tick's partial counts would mislead


def test_every_sensor_of_the_code_location_is_metered_under_its_contract_name() -> None:
    defs = build_definitions(Settings.from_env({"DATA_BUCKET": "data", "DB_HOST": "db"}))
    sensors = list(defs.sensors)
    assert {s.name for s in sensors} == CONTRACT_SENSORS
    assert all(is_metered(defs.resolve_sensor_def(s.name)) for s in sensors)


def test_the_operations_doc_lists_every_metric() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    assert metrics.metrics_table() in text, "paste runtime.metrics.metrics_table() in the doc"


# -- health's verdict ---------------------------------------------------------------------------

LIMITS = HealthSettings()


def rates(processed: int = 10, failed: int = 0) -> Throughput:
    return Throughput(3600, processed, failed, 30.0, 60.0, processed, {"bad_archive": failed})


def queue(visible: int = 0, queued: int = 0, oldest: float | None = None) -> Backlog:
    return Backlog(visible, 0, 0, queued, oldest, "the oldest queued run")


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 95), percentile([7.0], 95)) == (
        50.0,
        95.0,
        7.0,
    )
    assert percentile([], 50) is None


def test_a_failure_streak_counts_the_newest_failures_in_a_row() -> None:
    F, S, K, R = TickStatus.FAILURE, TickStatus.SUCCESS, TickStatus.SKIPPED, TickStatus.STARTED
    assert failure_streak([R, F, F, F, S, F]) == 3
    assert failure_streak([K, F, F]) == 0
    assert failure_streak([]) == 0


def test_the_verdict_names_each_way_to_be_unhealthy() -> None:
    fresh = {"SENSOR": 5.0}
    assert judge(rates(), queue(), [], fresh, LIMITS) == []
    # A stopped daemon matters only while uploads wait.
    assert judge(rates(), queue(), [], {}, LIMITS) == []
    (reason,) = judge(rates(), queue(visible=4), [], {"SENSOR": 900.0}, LIMITS)
    assert "sensor daemon is stopped (heartbeat 900 s old" in reason and "4 upload(s)" in reason
    failing = SensorHealth("episode_uploads", 1.0, "FAILURE", 3, "boom")
    (reason,) = judge(rates(), queue(), [failing], fresh, LIMITS)
    assert reason == "sensor episode_uploads failed its last 3 ticks: boom"
    (reason,) = judge(rates(processed=2, failed=3), queue(), [], fresh, LIMITS)
    assert reason.startswith("failure rate 60% over 20%") and "bad_archive 3" in reason
    # Two failures of two runs are below the minimum count: no verdict on a rate of nothing.
    assert judge(rates(processed=0, failed=2), queue(), [], fresh, LIMITS) == []
    (reason,) = judge(rates(), queue(queued=1, oldest=4000.0), [], fresh, LIMITS)
    assert reason.startswith("the oldest upload has waited 4000 s")


def test_the_output_can_be_turned_off_and_is_checked() -> None:
    silent = metrics.Emitter.from_env({"METRICS_OUTPUT": "off"})
    silent.sensor_tick("episode_uploads", 0.1, False, {})  # writes nothing (no stdout here)
    assert silent.write is not metrics.write_stdout
    assert metrics.Emitter.from_env({"METRICS_OUTPUT": "stdout"}).write is metrics.write_stdout
    with pytest.raises(RuntimeError, match="METRICS_OUTPUT='stderr' is not one of stdout, off"):
        metrics.Emitter.from_env({"METRICS_OUTPUT": "stderr"})


def test_a_laptop_writes_the_metric_lines_to_a_file_not_the_terminal(tmp_path: Path) -> None:
    """`dev` and `demo` give the daemon, the code server and the runs one file of the stack's
    (`local/dev.py`); each process appends whole lines to it. An exported METRICS_OUTPUT wins."""
    stack_env = {"DAGSTER_HOME": str(tmp_path / "dagster")}
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("METRICS_OUTPUT", raising=False)
        path = dev_environment(stack_env)["METRICS_OUTPUT"]
        patch.setenv("METRICS_OUTPUT", "stdout")
        assert dev_environment(stack_env)["METRICS_OUTPUT"] == "stdout"
    assert path == str(tmp_path / "metrics.jsonl")
    emitter = metrics.Emitter.from_env({"METRICS_OUTPUT": path})
    emitter.sensor_tick("episode_uploads", 0.1, False, {})
    emitter.sensor_tick("waiting_uploads", 0.2, True, {})
    lines = Path(path).read_text().splitlines()
    assert [json.loads(line)["Sensor"] for line in lines] == ["episode_uploads", "waiting_uploads"]
    with pytest.raises(RuntimeError, match="nor an absolute file path"):
        metrics.Emitter.from_env({"METRICS_OUTPUT": "metrics.jsonl"})


def test_a_reason_is_counted_only_for_a_metric_declared_by_reason() -> None:
    """The reason's line is published under the metric's `Reason` dimension set: a metric
    declared without one would publish its reason nowhere, so it is refused at the call."""
    assert metrics.METRICS[metrics.MESSAGES_LEFT].dimensions[-1] == (
        metrics.DEPLOYMENT, metrics.SENSOR, metrics.REASON,
    )  # fmt: skip
    with pytest.raises(ValueError, match="UploadsReceived is not declared by Reason"):
        metrics.count_reason(metrics.UPLOADS_RECEIVED, "malformed")
