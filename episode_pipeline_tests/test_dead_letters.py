"""Operating the dead-letter queue on the real stack: three failures move an upload's message to
the DLQ, `episode-pipeline dlq list` shows it with the failed run's error, the cause is fixed,
`dlq redrive` sends it back, and the sensor's retry processes the episode."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from dagster import DagsterInstance, SensorResult, SkipReason

from episode_pipeline import cli
from episode_pipeline.db.connection import connect
from episode_pipeline.db.episodes import ensure_episode_row, episode_row
from episode_pipeline.instance import app_state
from episode_pipeline.local.upload import upload_episode
from episode_pipeline.orchestration import upload_runs
from episode_pipeline.runtime import metrics
from episode_pipeline_tests.support import new_ref
from episode_pipeline_tests.support.queues import (
    PrivateQueue,
    depth,
    execute,
    redeliver,
    report_done,
    tick,
)
from episode_pipeline_tests.test_forged_events import Log, forged_event

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
    assert row["reason"] == "run_failed"
    assert row["why"].startswith(f"3 failed run(s) of 3; last failed run {failed_runs[-1]}: ")
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


def test_a_missing_object_and_bad_bodies_are_dead_lettered_with_their_reasons(
    private_queue: Callable[..., PrivateQueue],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    """An event for an object never put (or one whose key decodes to another object's), a body
    that is not JSON and a key that names no episode: each is left on every receive, named in
    the tick's log and counted by reason, and once SQS dead-letters them `dlq list` says why."""
    private = private_queue(visibility_timeout=1)  # back after 1 s, not 15 minutes
    instance = DagsterInstance.get()  # the instance the CLI reads (DAGSTER_HOME)
    ghost = new_ref()
    key = f"{ghost.prefix}never-put.tar.zst"
    bodies = {
        "ghost": forged_event(private.storage.name, key, 1 << 20, "0" * 32),
        "not-json": "{not json",
        "outside": forged_event(private.storage.name, "uploads/x/take.tar.zst", 1, "0" * 32),
    }
    ids = {
        name: private.queue.send(body) for name, body in bodies.items()
    }  # beside the bucket's s3:TestEvent, which the first tick deletes

    receives = 0
    while True:
        log = Log()
        with metrics.counting_tick() as counts:
            result = upload_runs.evaluate_uploads(
                SimpleNamespace(instance=instance, log=log), private.queue, private.storage
            )
        if isinstance(result, SkipReason):  # SQS moved all three on the fourth receive
            break
        receives += 1
        assert receives <= 3 and not result.run_requests
        assert counts.by_reason == {"MessagesLeft": {"no_object": 1, "malformed": 1, "bad_key": 1}}
        (named,) = [line for line in log.lines if "does not exist" in line]
        assert ids["ghost"] in named and named.endswith(": no_object")
        (bad_key,) = [line for line in log.lines if ids["outside"] in line and "left" in line]
        assert "bad_key: Records[0].s3.object.key: S3 key 'uploads/x/take.tar.zst'" in bad_key
        time.sleep(1.5)
    assert receives == 3 and depth(private.queue) == (0, 0)

    rows = {
        row["message_id"]: row
        for row in json.loads(dlq_cli(monkeypatch, capsys, private, "list", "--json"))
    }
    assert rows.keys() == set(ids.values())
    ghost_row = rows[ids["ghost"]]
    assert (ghost_row["episode"], ghost_row["key"], ghost_row["runs"]) == (
        ghost.partition_key,
        key,
        0,
    )
    assert ghost_row["reason"] == "no_object"
    assert ghost_row["why"].startswith(
        f"no object at s3://{private.storage.name}/{key} (HEAD 404 at receive 3"
    )
    assert rows[ids["not-json"]]["reason"] == "malformed"
    assert rows[ids["not-json"]]["why"].startswith("body is not JSON")
    assert rows[ids["outside"]]["reason"] == "bad_key"
    text = dlq_cli(monkeypatch, capsys, private, "list")
    assert f"why: no_object: no object at s3://{private.storage.name}/{key}" in text
    assert "why: malformed: body is not JSON" in text


def test_a_run_never_created_is_named_at_the_next_receive(
    private_queue: Callable[..., PrivateQueue], archive: Path
) -> None:
    """The tick requests a run and the daemon never creates it (its tick failed after the
    evaluation, e.g. adding the partition): the next receive finds no run, says so, counts it
    and records it for `dlq list`."""
    private = private_queue(visibility_timeout=1)
    instance = DagsterInstance.get()
    ref = new_ref()
    upload_episode(archive, ref, private.settings)
    (request,) = tick(instance, private).run_requests  # never submitted: no run is created
    time.sleep(1.5)
    log = Log()
    with metrics.counting_tick() as counts:
        again = upload_runs.evaluate_uploads(
            SimpleNamespace(instance=instance, log=log), private.queue, private.storage
        )
    assert isinstance(again, SensorResult) and len(again.run_requests) == 1  # asked again
    assert counts.by_reason == {"MessagesLeft": {"no_run": 1}}
    (named,) = [line for line in log.lines if "no_run:" in line]
    assert f"{request.run_key} has no run at receive 2" in named
    (message,) = upload_runs.held_messages(again.run_requests[0].tags)
    recorded = app_state.recorded_dead_letter_reasons(instance, [message.message_id])[
        message.message_id
    ]
    assert (recorded.kind, recorded.receive) == ("no_run", 2)
