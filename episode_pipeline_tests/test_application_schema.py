"""The whole graph against the application's own tables, not only against our migration.

The application owns `episodes`, `frames`, `episode_metadata` and `entity_versions`; the contract
names only a few of their columns. A database holding just those (UUID ids, no unique index on
`entity_versions`, no `org_id` or `updated_at`) must end `processed` with the same rows in the
contract's columns as the project's own schema, and reprocessing must keep the application's own
metadata keys and leave one version-1 record.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from episode_pipeline.config.settings import Settings
from episode_pipeline.db.connection import connect
from episode_pipeline.db.episodes import ensure_episode_row
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.local.upload import archive_key
from episode_pipeline.runner import process_episode
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline_tests.support.schema import APPLICATION_SCHEMA

pytestmark = pytest.mark.integration

CONTRACT_EPISODE_COLUMNS = (
    "status",
    "mp4_s3_path",
    "parquet_s3_path",
    "frame_count",
    "fps",
    "duration_seconds",
)


@pytest.fixture
def application_settings(settings: Settings, db_conn: psycopg.Connection) -> Iterator[Settings]:
    """Settings whose database holds only the application's contract columns."""
    name = f"application_{uuid.uuid4().hex[:8]}"
    db_conn.execute(f"CREATE DATABASE {name}")
    database = dataclasses.replace(settings.database, name=name)
    try:
        with connect(database, autocommit=True) as conn:
            conn.execute(APPLICATION_SCHEMA)
        yield dataclasses.replace(settings, database=database)
    finally:
        db_conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def upload(settings: Settings, archive: Path, ref: EpisodeRef) -> None:
    """Put the archive where the robot would; the row is created by the caller (the app)."""
    from episode_pipeline.storage.bucket import Bucket

    Bucket(settings.bucket, settings.aws).upload_file(archive, archive_key(archive, ref))


def contract_state(conn: psycopg.Connection, ref: EpisodeRef) -> dict:
    """What the contract's columns hold for the episode, with its own prefix taken out."""
    row = conn.execute(
        f"SELECT {', '.join(CONTRACT_EPISODE_COLUMNS)} FROM episodes WHERE id = %s",
        (ref.episode_id,),
    ).fetchone()
    episode = dict(zip(CONTRACT_EPISODE_COLUMNS, row, strict=True))
    for path in ("mp4_s3_path", "parquet_s3_path"):
        episode[path] = episode[path].removeprefix(ref.prefix)
    frames = conn.execute(
        "SELECT timestamp_ms, observation::text, action::text FROM frames"
        " WHERE episode_id = %s ORDER BY timestamp_ms",
        (ref.episode_id,),
    ).fetchall()
    metadata = conn.execute(
        "SELECT meta_key, value, status FROM episode_metadata WHERE episode_id = %s"
        " ORDER BY meta_key",
        (ref.episode_id,),
    ).fetchall()
    versions = conn.execute(
        "SELECT entity_type, version, operation, data::text FROM entity_versions"
        " WHERE entity_id = %s",
        (ref.episode_id,),
    ).fetchall()
    return {"episode": episode, "frames": frames, "metadata": metadata, "versions": versions}


def test_the_graph_writes_the_same_contract_rows_into_both_schemas(
    tmp_path: Path, settings: Settings, application_settings: Settings, db_conn: psycopg.Connection
) -> None:
    archive = tmp_path / "take.tar.zst"
    write_sample(archive, SampleSpec(codebase_version="v3.0", cameras=1, seconds=1.0))

    ours = EpisodeRef("test-org", f"ep-{uuid.uuid4().hex[:10]}")
    ensure_episode_row(db_conn, ours)
    upload(settings, archive, ours)
    assert process_episode(ours, settings=settings)

    theirs = EpisodeRef("test-org", str(uuid.uuid4()))
    with connect(application_settings.database, autocommit=True) as app:
        app.execute(
            "INSERT INTO episodes (id, status) VALUES (%s, 'uploaded')", (theirs.episode_id,)
        )
        # A key the application added itself: reprocessing must not take it away.
        app.execute(
            "INSERT INTO episode_metadata (episode_id, meta_key, value, status)"
            " VALUES (%s, 'reviewed_by', 'alice', 'editable')",
            (theirs.episode_id,),
        )
    upload(application_settings, archive, theirs)
    for _ in range(2):  # processing, then reprocessing
        outcome = process_episode(theirs, settings=application_settings)
        assert outcome, outcome.errors

    with connect(application_settings.database, autocommit=True) as app:
        application = contract_state(app, theirs)
    project = contract_state(db_conn, ours)

    assert application["episode"]["status"] == "processed"
    assert application["episode"] == project["episode"]
    assert application["frames"] == project["frames"] and len(application["frames"]) == 30
    assert ("reviewed_by", "alice", "editable") in application["metadata"]
    assert [m for m in application["metadata"] if m[0] != "reviewed_by"] == project["metadata"]
    # No unique index: updated, not inserted again, on reprocessing.
    assert application["versions"] == [(t, v, o, d) for t, v, o, d in project["versions"]]
    assert len(application["versions"]) == 1
