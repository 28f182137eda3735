"""Rows of the application's `episodes` the pipeline cannot key, on the real stack: every read
skips them, counts them and names them; reconciliation still finds a lost upload beside them,
its cursors move past them, and every listing answers (docs/contract.md#episode-ids)."""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from dagster import SensorResult, build_sensor_context

from episode_pipeline import cli
from episode_pipeline.config.settings import ReconcileSettings
from episode_pipeline.db.episodes import ensure_episode_row, invalid_episode_rows
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.defs.sensors.reconcile import reconciliation_sensors
from episode_pipeline.orchestration.lost_uploads import reconcile_tick
from episode_pipeline.reprocess import Selection, select_episodes
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.uploads.lost_uploads import Cursor
from episode_pipeline_tests.support import new_ref

pytestmark = pytest.mark.integration

ORG = "poison-org"
BAD_ORG = "bad org"
# (org_id, id, status): what an application may write; `''` sorts before every other id.
POISON = [
    (ORG, "", "uploaded"),
    (ORG, "--help", "failed"),
    (ORG, "a b", "uploaded"),
    (ORG, "x" * 300, "failed"),
    (ORG, "épisode-ü", "uploaded"),
    (BAD_ORG, f"ep-{uuid.uuid4().hex[:8]}", "failed"),
]
AT_ONCE = ReconcileSettings(lost_upload_after_seconds=0, episodes_per_tick=100_000)
# One row a page for each pass, however many rows the session's table holds.
ONE_A_TICK = ReconcileSettings(
    lost_upload_after_seconds=0, episodes_per_tick=1, pending_per_tick=1, walk_cycle_seconds=10**9
)


@pytest.fixture
def poison_rows(db_conn: Any) -> Iterator[list[tuple[str, str, str]]]:
    for org, episode_id, status in POISON:
        db_conn.execute(
            "INSERT INTO episodes (id, org_id, status) VALUES (%s, %s, %s)",
            (episode_id, org, status),
        )
    yield POISON
    db_conn.execute("DELETE FROM episodes WHERE id = ANY(%s)", ([p[1] for p in POISON],))


@pytest.fixture
def lost_upload(tmp_path: Path, settings: Any, db_conn: Any) -> tuple[Any, Any]:
    """A good episode whose archive is in S3 (a bucket with no notification: its event never
    arrived), and the settings that reach that bucket."""
    settings = dataclasses.replace(settings, bucket=f"poison-{uuid.uuid4().hex[:8]}")
    bucket = Bucket(settings.bucket, settings.aws)
    bucket.client.create_bucket(
        Bucket=bucket.name, CreateBucketConfiguration={"LocationConstraint": settings.aws.region}
    )
    archive = write_sample(tmp_path / "take.tar.zst", SampleSpec(seconds=1.0, cameras=1))
    ref = new_ref(ORG)
    ensure_episode_row(db_conn, ref)
    bucket.upload_file(archive["archive"], f"{ref.prefix}take.tar.zst")
    return ref, settings


def shown(episode_id: str) -> str:
    return repr(episode_id) if len(episode_id) <= 40 else repr(episode_id[:40])


def test_reconciliation_finds_a_lost_upload_beside_rows_it_cannot_key(
    poison_rows: list, lost_upload: tuple, instance: Any, caplog: pytest.LogCaptureFixture
) -> None:
    ref, settings = lost_upload
    resources = {
        "postgres": PostgresResource.from_settings(settings.database),
        "s3": S3BucketResource.from_settings(settings),
    }
    waiting, _ = reconciliation_sensors(AT_ONCE)
    context = build_sensor_context(instance=instance, resources=resources)
    result = waiting(context)  # the sensor as the daemon ticks it: no exception
    assert isinstance(result, SensorResult)
    assert ref.partition_key in [r.partition_key for r in result.run_requests]

    # The same tick's report: each unkeyable row once (both passes saw the `uploaded` ones),
    # each named in the log.
    log = logging.getLogger("poison-test")
    bucket = Bucket(settings.bucket, settings.aws)
    postgres = resources["postgres"]
    with caplog.at_level(logging.WARNING, logger="poison-test"), postgres.connect() as conn:
        report = reconcile_tick(instance, conn, bucket, AT_ONCE, Cursor(), datetime.now(UTC), log)
    ids = [row.episode_id for row in report.invalid]
    assert {p[1] for p in poison_rows} <= set(ids) and len(ids) == len(set(ids))
    assert f"skipped {len(report.invalid)} row(s) the pipeline cannot key" in report.describe(
        AT_ONCE
    )
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped")]
    for _, episode_id, _ in poison_rows:
        assert sum(shown(episode_id) in line for line in logged) == 1, episode_id


def test_both_cursors_move_past_the_id_that_sorts_first(
    poison_rows: list, settings: Any, instance: Any
) -> None:
    """`''` is the first id in any order; with one row a page, a cursor that read it as "the
    start" would read it again every tick and never move."""
    bucket = Bucket(settings.bucket, settings.aws)
    postgres = PostgresResource.from_settings(settings.database)
    now = datetime.now(UTC)
    with postgres.connect() as conn:
        first = reconcile_tick(instance, conn, bucket, ONE_A_TICK, Cursor(), now)
        assert first.cursor == Cursor(walk="", pending="")
        assert [row.episode_id for row in first.invalid] == [""]
        second = reconcile_tick(instance, conn, bucket, ONE_A_TICK, first.cursor, now)
    assert second.cursor.walk not in (None, "") and second.cursor.pending not in (None, "")
    assert "" not in [row.episode_id for row in second.invalid]


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_every_listing_answers_and_status_invalid_names_the_rows(
    poison_rows: list, episode_row: Any, db_conn: Any, capsys: pytest.CaptureFixture
) -> None:
    good = episode_row(ORG)
    failed = episode_row(ORG, status="failed")

    code, out, err = run_cli(capsys, "status", "--org", ORG, "--limit", "20", "--json")
    assert code == 0, err
    assert {r["episode_id"] for r in json.loads(out)} >= {good.episode_id, failed.episode_id}
    assert "skipped 5 row(s) of this page the pipeline cannot key" in err

    code, out, err = run_cli(capsys, "status", "--limit", "20")
    assert code == 0, err
    assert good.episode_id in out and "status --invalid" in err

    code, out, err = run_cli(capsys, "status", "--failed", "--limit", "20", "--json")
    assert code == 0, err
    assert failed.partition_key in {r["episode"] for r in json.loads(out)}
    assert "skipped 3 row(s)" in err  # '--help', the long one, the bad org's

    code, out, err = run_cli(capsys, "status", "--invalid", "--json", "--limit", "20")
    assert code == 0, err
    rows = {(r["org_id"], r["id"]): r for r in json.loads(out)}
    assert set(rows) >= {(org, episode_id) for org, episode_id, _ in poison_rows}
    assert (good.org_id, good.episode_id) not in rows
    assert "invalid org id 'bad org'" in rows[(BAD_ORG, poison_rows[-1][1])]["reason"]
    assert rows[(ORG, "x" * 300)]["status"] == "failed"

    code, out, err = run_cli(capsys, "status", "--invalid", "--org", BAD_ORG)
    assert code == 0, err
    assert out.strip().splitlines() == [
        f"id {poison_rows[-1][1]!r}  org_id 'bad org'  status failed: "
        + rows[(BAD_ORG, poison_rows[-1][1])]["reason"]
    ]
    code, out, _ = run_cli(capsys, "status", "--invalid", "--limit", "2")
    assert code == 0 and len(out.strip().splitlines()) == 2

    # reprocess's selection: the good rows, the bad ones skipped and named.
    refs, skipped = select_episodes(db_conn, Selection(org=ORG, status="failed"))
    assert failed in refs
    assert sorted(row.episode_id for row in skipped) == sorted(["--help", "x" * 300])


def test_postgres_and_the_rule_agree_on_which_rows_are_unkeyable(
    db_conn: Any, poison_rows: list, episode_row: Any
) -> None:
    """`status --invalid` narrows the scan in SQL with keys.ID_PATTERN: on ids at the edges of
    the rule, PostgreSQL's `~` and Python's `re` must say the same."""
    edges = [f"A{'z' * 127}", "a.b_c-9", "ß", "a..b", "ep\n", "9"]
    edge_rows = []
    for episode_id in edges:
        db_conn.execute(
            "INSERT INTO episodes (id, org_id, status) VALUES (%s, %s, 'processed')",
            (f"{episode_id}", "edge-org"),
        )
        edge_rows.append(episode_id)
    try:
        found = {row.row.episode_id for row in invalid_episode_rows(db_conn, "edge-org", 50)}
    finally:
        db_conn.execute("DELETE FROM episodes WHERE id = ANY(%s)", (edge_rows,))
    assert found == {"ß", "a..b", "ep\n"}
