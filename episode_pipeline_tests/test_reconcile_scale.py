"""Reconciliation that scales: sized for a million episodes, bounded in S3 requests, and working
on the application's production schema variant (`uuid` ids with `org_id` and `updated_at`).

The pure part sizes the walk and triages an episode; the integration part runs the real
`waiting_uploads` sensor against a database of that schema, a moto bucket with no notification
(every S3 event lost) and an ephemeral Dagster instance.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from dagster import DagsterInstance, SensorResult, build_sensor_context

from episode_pipeline.config.settings import ReconcileSettings, Settings
from episode_pipeline.db.connection import connect
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.defs.sensors.reconcile import reconciliation_sensors
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.orchestration.lost_uploads import reconcile_tick
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline.storage.bucket import Bucket, ObjectInfo
from episode_pipeline.uploads.lost_uploads import Cursor, Visit, triage, walk_page_size
from episode_pipeline_tests.support.schema import APPLICATION_SCHEMA

DEFAULTS = ReconcileSettings()
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_the_walk_visits_a_million_episodes_within_a_day_and_the_s3_budget() -> None:
    page = walk_page_size(1_000_000, DEFAULTS, pending_requests=0)
    ticks_a_day = 24 * 3600 // DEFAULTS.interval_seconds
    assert page * ticks_a_day >= 1_000_000
    assert page <= DEFAULTS.s3_requests_per_hour * DEFAULTS.interval_seconds // 3600
    assert walk_page_size(1_000, DEFAULTS, 0) == DEFAULTS.episodes_per_tick  # the floor
    tight = dataclasses.replace(DEFAULTS, s3_requests_per_hour=12_000)  # 1,000 a tick
    assert walk_page_size(1_000_000, tight, pending_requests=400) == 600


def test_the_cursor_reads_its_old_forms() -> None:
    assert Cursor.parse(None) == Cursor()
    assert Cursor.parse("ep-0042") == Cursor(walk="ep-0042")
    assert Cursor.parse('{"walk":"","pending":"p-1"}') == Cursor(None, "p-1")  # "" was the start
    assert Cursor.parse(Cursor("a", "b").to_json()) == Cursor("a", "b")


def test_the_cursor_moves_past_the_id_that_sorts_first() -> None:
    # '' is an id the application may write (and the pipeline skips): after it is not the start.
    after_empty = Cursor(walk="", pending=None)
    assert Cursor.parse(after_empty.to_json()) == after_empty
    assert Cursor.parse(Cursor().to_json()) == Cursor()


def visit(written_minutes_ago: float | None, **changes: object) -> Visit:
    archive = None
    if written_minutes_ago is not None:
        written = NOW - timedelta(minutes=written_minutes_ago)
        archive = ObjectInfo("orgs/o/episodes/e/take.tar.zst", 1, "etag", None, written)
    return dataclasses.replace(Visit(EpisodeRef("o", "e"), None, False, archive, None), **changes)


def test_triage_sends_only_an_old_unhandled_archive_to_its_head() -> None:
    assert triage(visit(60), DEFAULTS, NOW) is None
    assert "in flight" in (triage(visit(60, in_flight=True), DEFAULTS, NOW) or "")
    assert "no archive" in (triage(visit(None), DEFAULTS, NOW) or "")
    assert "queue may still" in (triage(visit(10), DEFAULTS, NOW) or "")
    processed = visit(60, processed_at=NOW - timedelta(minutes=30))
    assert "processed at" in (triage(processed, DEFAULTS, NOW) or "")
    rerun = visit(60, newest_run_created=NOW - timedelta(minutes=5))
    assert "made after" in (triage(rerun, DEFAULTS, NOW) or "")


# -- on the application's schema ----------------------------------------------------------------

# The production variant (db/schema_check.py): the application's own tables with uuid ids, plus
# the optional episodes.org_id and episodes.updated_at, and an index on the status.
PRODUCTION_SCHEMA = (
    APPLICATION_SCHEMA.replace(
        "id uuid PRIMARY KEY DEFAULT gen_random_uuid(),\n    status",
        "id uuid PRIMARY KEY DEFAULT gen_random_uuid(),\n    org_id text NOT NULL,\n"
        "    updated_at timestamptz NOT NULL DEFAULT now(),\n    status",
        1,
    )
    + "CREATE INDEX episodes_status_idx ON episodes (status);\n"
)
assert "org_id" in PRODUCTION_SCHEMA


@pytest.fixture
def application(
    settings: Settings, db_conn: psycopg.Connection, tmp_path: Path
) -> Iterator[tuple[Settings, psycopg.Connection, Bucket]]:
    """Settings whose database has the production schema, and a bucket that notifies nothing."""
    name = f"reconcile_{uuid.uuid4().hex[:8]}"
    db_conn.execute(f"CREATE DATABASE {name}")
    database = dataclasses.replace(settings.database, name=name)
    app = dataclasses.replace(settings, database=database, bucket=name.replace("_", "-"))
    bucket = Bucket(app.bucket, app.aws)
    bucket.client.create_bucket(
        Bucket=bucket.name, CreateBucketConfiguration={"LocationConstraint": app.aws.region}
    )
    try:
        with connect(database, autocommit=True) as conn:
            conn.execute(PRODUCTION_SCHEMA)
            yield app, conn, bucket
    finally:
        db_conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.mark.integration
def test_lost_uploads_are_found_on_a_uuid_schema_and_the_s3_requests_are_counted(
    application: tuple[Settings, psycopg.Connection, Bucket], tmp_path: Path
) -> None:
    app, conn, bucket = application
    archive = write_sample(tmp_path / "take.tar.zst", SampleSpec(seconds=1.0, cameras=1))

    def row(status: str, processed_hours_ago: float | None = None) -> EpisodeRef:
        ref = EpisodeRef("acme", str(uuid.uuid4()))
        conn.execute(
            "INSERT INTO episodes (id, org_id, status, processed_at, updated_at)"
            " VALUES (%s, %s, %s, now() - make_interval(hours => %s), now())",
            (ref.episode_id, ref.org_id, status, processed_hours_ago),
        )
        return ref

    new = row("uploaded")  # never processed: its event was lost
    reuploaded = row("processed", processed_hours_ago=5)  # uploaded again since: event lost
    done = row("processed", processed_hours_ago=-1)  # processed after its archive was written
    for _ in range(4):
        row("uploaded")  # rows whose robot never uploaded
    for ref in (new, reuploaded, done):
        bucket.upload_file(archive["archive"], f"{ref.prefix}take.tar.zst")
    bucket.put_bytes(f"{done.prefix}processed/hls/master.m3u8", b"#EXTM3U\n")  # not listed
    lost_now = dataclasses.replace(
        DEFAULTS, lost_upload_after_seconds=0, episodes_per_tick=2, walk_cycle_seconds=10**9
    )

    with DagsterInstance.ephemeral() as instance:
        # The sensor's first tick starts from no cursor (a uuid column rejects `id > ''`).
        waiting, _ = reconciliation_sensors(lost_now)
        resources = {
            "postgres": PostgresResource.from_settings(app.database),
            "s3": S3BucketResource.from_settings(app),
        }
        context = build_sensor_context(instance=instance, resources=resources)
        result = waiting(context)
        assert isinstance(result, SensorResult)
        # The pending pass finds the never-processed one at once, whatever the walk's page.
        assert new.partition_key in [r.partition_key for r in result.run_requests]

        # The walk, page after page of two uuids, finds the lost re-upload within one pass.
        walk_only = dataclasses.replace(lost_now, pending_per_tick=0)
        cursor, found, lists = Cursor(), [], 0
        while True:
            report = reconcile_tick(instance, conn, bucket, walk_only, cursor, datetime.now(UTC))
            found += report.lost
            lists += report.s3.lists
            cursor = report.cursor
            assert report.s3.total <= walk_only.s3_requests_per_hour
            assert "S3 requests" in report.describe(walk_only)
            if not cursor.walk:
                break
    assert sorted(found) == sorted([new.partition_key, reuploaded.partition_key])
    assert lists == 7  # one LIST per episode: processed/ is never listed
