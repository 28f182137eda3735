"""The metric lines and `health` on the real stack: real runs (one good episode, corrupt
uploads), a real sensor evaluation against a private queue, Dagster's own tick and heartbeat
records on a private instance, so nothing another test does changes what health sees."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dagster import DagsterInstance, build_sensor_context

from episode_pipeline.config.settings import Settings
from episode_pipeline.definitions import build_definitions
from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME
from episode_pipeline.health import check_health, format_health, sensor_selector_id
from episode_pipeline.local.stack import StackInfo
from episode_pipeline.local.upload import upload_episode
from episode_pipeline.runner import process_episode
from episode_pipeline_tests.support import new_ref
from episode_pipeline_tests.support.dagster_internals import (
    DaemonHeartbeat,
    InstigatorType,
    SerializableErrorInfo,
    TickData,
    TickStatus,
    partition_loading_context,
)
from episode_pipeline_tests.support.instances import private_instance
from episode_pipeline_tests.support.queues import PrivateQueue, bucket_resource, queue_resource

SENSORS = ["episode_uploads", "waiting_uploads"]


@pytest.fixture(autouse=True, scope="module")
def metric_lines_on() -> Iterator[None]:
    """The lines go to stdout here, whatever an in-process `process`/`check` of an earlier test
    left in this worker's environment (they default METRICS_OUTPUT to `off`). Module-scoped:
    the module's fixtures run a real episode before any test."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("METRICS_OUTPUT", "stdout")
        yield


@contextlib.contextmanager
def stdout_lines() -> Iterator[list[str]]:
    """What this process writes to fd 1 meanwhile (the metric lines bypass sys.stdout)."""
    lines: list[str] = []
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(1)
        os.dup2(sink.fileno(), 1)
        try:
            yield lines
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode(errors="replace").splitlines())


def emf(lines: list[str], metric: str) -> list[dict]:
    found = []
    for line in lines:
        if line.startswith("{") and '"_aws"' in line:
            document = json.loads(line)  # a metric line is whole: it parses
            if metric in document:
                found.append(document)
    return found


def beat(instance: DagsterInstance, age_seconds: float = 0.0) -> None:
    instance.add_daemon_heartbeat(DaemonHeartbeat(time.time() - age_seconds, "SENSOR", None, None))


@dataclass
class Processed:
    instance: DagsterInstance
    lines: list[str]
    episode: str
    archive_bytes: int


@pytest.fixture(scope="module")
def processed(stack: StackInfo, settings: Settings, archive: Path) -> Iterator[Processed]:
    """One good episode processed by a real in-process run on an instance of its own."""
    with private_instance(stack, "observed") as instance:
        ref = new_ref()
        upload_episode(archive, ref)
        with stdout_lines() as lines:
            outcome = process_episode(ref, instance=instance, settings=settings, quiet=True)
        assert outcome.success, outcome
        yield Processed(instance, lines, ref.partition_key, archive.stat().st_size)


def test_a_processed_episode_writes_its_metric_lines(processed: Processed) -> None:
    (line,) = emf(processed.lines, "EpisodesProcessed")
    assert (line["Deployment"], line["episode"], line["EpisodesProcessed"]) == (
        "local",
        processed.episode,
        1,
    )
    assert line["BytesIn"] == processed.archive_bytes
    assert line["BytesOut"] > line["BytesIn"] // 2  # the extracted files and the HLS tree
    assert 0 < line["RunWallSeconds"] < line["EpisodeLatencySeconds"] < 600
    (sync,) = emf(processed.lines, "SyncFindings")
    (drift,) = emf(processed.lines, "DriftFindings")
    assert (sync["SyncFindings"], drift["DriftFindings"]) == (0, 0)  # a good sample
    assert sync["episode"] == drift["episode"] == processed.episode


def test_health_is_green_on_a_good_state(processed: Processed, settings: Settings) -> None:
    beat(processed.instance)
    report = check_health(processed.instance, settings_without_queue(settings), SENSORS)
    text = format_health(report.as_dict())
    print(text)  # the closing note's healthy output
    assert report.healthy, text
    assert text.startswith("episode-pipeline health: healthy\n")
    assert report.throughput.processed == 1 and report.throughput.latencies == 1
    assert report.throughput.latency_p50_seconds == report.throughput.latency_p95_seconds > 0


def settings_without_queue(settings: Settings) -> Settings:
    """The session's queue is every test's: a test of its own queue state uses a private one."""
    import dataclasses

    return dataclasses.replace(settings, sqs_queue_url=None, dlq_url=None)


def test_health_names_a_stopped_daemon_with_uploads_waiting(
    stack: StackInfo, private_queue, archive: Path
) -> None:
    private: PrivateQueue = private_queue()
    private.storage.upload_file(archive, f"orgs/acme/episodes/{uuid.uuid4().hex[:8]}/a.tar.zst")
    with private_instance(stack, "daemon_stopped") as instance:
        beat(instance, age_seconds=600)  # the daemon's last heartbeat, ten minutes ago
        report = check_health(instance, private.settings, SENSORS)
    text = format_health(report.as_dict())
    print(text)  # the closing note's unhealthy output
    assert not report.healthy
    # The upload's event (moto may add a test event): whatever waits, it is named.
    assert re.fullmatch(
        r"episode-pipeline health: UNHEALTHY: the sensor daemon is stopped \(heartbeat 6[01]\d s "
        r"old, limit 120 s\) with [1-9]\d* upload\(s\) waiting",
        text.splitlines()[0],
    ), text


def test_health_does_not_count_a_campaigns_queued_runs_as_uploads_waiting(
    stack: StackInfo, settings: Settings
) -> None:
    """Issue 32, finding 10: a paused campaign's runs stay queued (its launch limit is 0), a
    running one keeps runs queued on purpose; none is an upload waiting. An upload's queued
    run still is."""
    import dataclasses

    from dagster import DagsterRunStatus

    from episode_pipeline.instance.run_tags import CAMPAIGN_TAG, EPISODE_JOB_NAME, PARTITION_TAG
    from episode_pipeline_tests.support.dagster_internals import create_run_for_test

    plain = settings_without_queue(settings)
    strict = dataclasses.replace(  # any upload queued at all has waited too long
        plain, health=dataclasses.replace(plain.health, oldest_upload_seconds=0)
    )
    with private_instance(stack, "campaign_queued") as instance:
        beat(instance, age_seconds=600)  # the daemon stopped, too: still nothing waits
        # NOT_STARTED: waiting like a queued run (health reads both), without the code
        # location's origin a QUEUED one must carry.
        tags = {CAMPAIGN_TAG: "paused-1", PARTITION_TAG: "acme/c-1"}
        create_run_for_test(
            instance, job_name=EPISODE_JOB_NAME, status=DagsterRunStatus.NOT_STARTED, tags=tags
        )
        report = check_health(instance, strict, SENSORS)
        assert report.healthy, report.reasons
        assert (report.backlog.queued_runs, report.backlog.campaign_queued_runs) == (0, 1)
        assert "(and 1 of campaigns)" in format_health(report.as_dict())

        upload = {PARTITION_TAG: "acme/u-1"}
        create_run_for_test(
            instance, job_name=EPISODE_JOB_NAME, status=DagsterRunStatus.NOT_STARTED, tags=upload
        )
        report = check_health(instance, strict, SENSORS)
    assert report.reasons[0].endswith("with 1 upload(s) waiting"), report.reasons
    assert report.reasons[1].startswith("the oldest upload has waited")


def test_health_names_a_sensor_failing_its_ticks(stack: StackInfo, settings: Settings) -> None:
    with private_instance(stack, "sensor_failing") as instance:
        beat(instance)
        for _ in range(3):  # what the daemon records of a tick that raised
            instance.create_tick(
                TickData(
                    instigator_origin_id="episode_uploads-origin",
                    instigator_name="episode_uploads",
                    instigator_type=InstigatorType.SENSOR,
                    status=TickStatus.FAILURE,
                    timestamp=time.time(),
                    selector_id=sensor_selector_id("episode_uploads"),
                    error=SerializableErrorInfo("QueueDoesNotExist: gone\n", [], "ClientError"),
                )
            )
        report = check_health(instance, settings_without_queue(settings), SENSORS)
    assert report.reasons == [
        "sensor episode_uploads failed its last 3 ticks: QueueDoesNotExist: gone"
    ]
    assert [s.failure_streak for s in report.sensors] == [3, 0]


@pytest.mark.slow(seconds=30)
def test_failed_episodes_write_their_cause_and_raise_the_failure_rate(
    stack: StackInfo, settings: Settings, tmp_path: Path
) -> None:
    corrupt = tmp_path / "corrupt.tar.zst"
    corrupt.write_bytes(b"not a zstd frame at all" * 10)
    with private_instance(stack, "failing") as instance, stdout_lines() as lines:
        beat(instance)
        for _ in range(3):
            ref = new_ref()
            upload_episode(corrupt, ref)
            assert not process_episode(
                ref, instance=instance, settings=settings, quiet=True
            ).success
        report = check_health(instance, settings_without_queue(settings), SENSORS)
    failed = emf(lines, "EpisodesFailed")
    assert [(d["Cause"], d["EpisodesFailed"]) for d in failed] == [("bad_archive", 1)] * 3
    assert all(d["RunWallSeconds"] > 0 for d in failed)
    assert report.throughput.failures_by_cause == {"bad_archive": 3}
    assert report.reasons == [
        "failure rate 100% over 20% in the last 60 min (3 failed, 0 processed; bad_archive 3)"
    ]


def test_a_sensor_evaluation_writes_its_line(
    private_queue, settings: Settings, archive: Path
) -> None:
    private: PrivateQueue = private_queue()
    episode = f"acme/{uuid.uuid4().hex[:8]}"
    private.storage.upload_file(archive, f"orgs/{episode.replace('/', '/episodes/')}/a.tar.zst")
    defs = build_definitions(private.settings)
    uploads = defs.resolve_sensor_def("episode_uploads")
    with DagsterInstance.ephemeral() as instance, stdout_lines() as lines:
        # The daemon adds the partitions a tick requests; the test adds it before the tick.
        instance.add_dynamic_partitions(EPISODES_PARTITION_NAME, [episode])
        context = build_sensor_context(
            instance=instance,
            resources={
                "upload_queue": queue_resource(private.queue),
                "s3": bucket_resource(private.storage),
            },
            definitions=defs,
        )
        with partition_loading_context(dynamic_partitions_store=instance):
            result = uploads.evaluate_tick(context)
    assert [r.partition_key for r in result.run_requests] == [episode]
    (line,) = emf(lines, "SensorTicks")
    assert (line["Sensor"], line["SensorTicks"], line["SensorTickFailures"]) == (
        "episode_uploads",
        1,
        0,
    )
    # The upload's message, and the s3:TestEvent moto sends when the notification is set up.
    assert (line["UploadsReceived"], line["RunsRequested"]) == (2, 1)
    assert 0 < line["TickSeconds"] < 60


@pytest.mark.slow(seconds=30)
def test_the_command_answers_in_text_and_json_with_its_exit_code(stack: StackInfo) -> None:
    """`health` on the session's stack (whatever other tests left there): the exit code is the
    verdict, and the first text line says it."""
    cli = [sys.executable, "-m", "episode_pipeline.cli", "health"]
    as_json = subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=120)
    report = json.loads(as_json.stdout)
    assert as_json.returncode == (0 if report["healthy"] else 1), as_json.stderr
    assert {s["name"] for s in report["sensors"]} >= {"episode_uploads", "dagster_retention"}
    as_text = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    first = as_text.stdout.splitlines()[0]
    if report["healthy"]:
        assert (as_text.returncode, first) == (0, "episode-pipeline health: healthy")
    else:
        assert as_text.returncode == 1 and first.startswith("episode-pipeline health: UNHEALTHY: ")
