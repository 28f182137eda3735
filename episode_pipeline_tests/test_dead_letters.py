"""Operating the dead-letter queue on the real stack: three failures move an upload's message to
the DLQ, `episode-pipeline dlq list` shows it with the failed run's error, the cause is fixed,
`dlq redrive` sends it back, and the sensor's retry processes the episode."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from dagster import DagsterInstance, SensorResult, SkipReason

from episode_pipeline import cli
from episode_pipeline.db.connection import connect
from episode_pipeline.db.episodes import ensure_episode_row, episode_row
from episode_pipeline.local.upload import upload_episode
from episode_pipeline_tests.support import new_ref
from episode_pipeline_tests.support.queues import (
    PrivateQueue,
    depth,
    execute,
    redeliver,
    report_done,
    tick,
)

pytestmark = pytest.mark.integration


def dlq_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, private: PrivateQueue, *argv
) -> str:
    """`episode-pipeline dlq …` against this test's queues (as SQS_* variables would set them)."""
    monkeypatch.setenv("SQS_QUEUE_URL", private.queue.queue_url or "")
    monkeypatch.setenv("SQS_DLQ_URL", private.dlq_url)
    capsys.readouterr()
    assert cli.main(["dlq", *argv]) == 0
    return capsys.readouterr().out


def test_three_failures_then_list_fix_redrive_and_processed(
    private_queue: Callable[..., PrivateQueue],
    archive: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    private = private_queue()
    instance = DagsterInstance.get()  # the instance the CLI reads (DAGSTER_HOME)
    ref = new_ref()
    upload_episode(archive, ref, private.settings)
    with connect(private.settings.database, autocommit=True) as conn:
        conn.execute("DELETE FROM episodes WHERE id = %s", (ref.episode_id,))  # the fault

    failed_runs = []
    for _ in range(3):
        (request,) = tick(instance, private).run_requests
        outcome = execute(instance, private, request)
        assert not outcome.success
        failed_runs.append(outcome.dagster_run.run_id)
        redeliver(private, request.tags)  # back now rather than after 15 minutes
    # The fourth receive finds the message moved to the dead-letter queue.
    assert isinstance(tick(instance, private), SkipReason)
    assert depth(private.queue) == (0, 0)

    (row,) = json.loads(dlq_cli(monkeypatch, capsys, private, "list", "--json"))
    assert row["episode"] == ref.partition_key
    assert row["key"] == f"{ref.prefix}{archive.name}"
    assert row["receive_count"] >= 3
    assert (row["runs"], row["failures"]) == (3, 3)
    assert row["failed_run"] == failed_runs[-1]
    assert row["first_failure"] <= row["last_failure"]
    assert "has no row in `episodes`" in row["error"]
    text = dlq_cli(monkeypatch, capsys, private, "list")
    assert ref.partition_key in text and failed_runs[-1] in text
    assert dlq_cli(monkeypatch, capsys, private, "list", "--json") != "[]"  # listing keeps it

    with connect(private.settings.database, autocommit=True) as conn:
        ensure_episode_row(conn, ref)  # the fix
    out = dlq_cli(monkeypatch, capsys, private, "redrive", ref.partition_key)
    assert "moved 1 message(s)" in out
    assert json.loads(dlq_cli(monkeypatch, capsys, private, "list", "--json")) == []

    result = tick(instance, private)
    assert isinstance(result, SensorResult)
    (retry,) = result.run_requests  # the upload's latest run failed: one retry
    outcome = execute(instance, private, retry)
    assert outcome.success
    report_done(instance, private, outcome.dagster_run.run_id)
    assert depth(private.queue) == (0, 0)
    with connect(private.settings.database) as conn:
        assert episode_row(conn, ref)["status"] == "processed"
