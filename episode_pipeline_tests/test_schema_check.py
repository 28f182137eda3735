"""The production guard: every column the pipeline writes must exist, or the error names it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace

import psycopg
import pytest
from dagster import DagsterResourceFunctionError, asset, materialize

from episode_pipeline.db.connection import connect
from episode_pipeline.db.schema_check import (
    REQUIRED_COLUMNS,
    SchemaMismatch,
    check_schema,
    missing_columns,
)
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.settings import load_settings


def test_missing_columns_lists_absent_tables_and_columns() -> None:
    existing = {
        "episodes": set(REQUIRED_COLUMNS["episodes"]) - {"fps"},
        "frames": set(REQUIRED_COLUMNS["frames"]),
        "episode_metadata": set(REQUIRED_COLUMNS["episode_metadata"]) | {"extra"},
    }
    missing = missing_columns(existing)
    assert "episodes.fps" in missing
    assert {m for m in missing if not m.startswith("entity_versions.")} == {"episodes.fps"}
    assert {m for m in missing if m.startswith("entity_versions.")} == {
        f"entity_versions.{c}" for c in REQUIRED_COLUMNS["entity_versions"]
    }


def test_required_columns_cover_what_the_contract_writes() -> None:
    assert {"mp4_s3_path", "parquet_s3_path", "frame_count", "fps", "duration_seconds"} <= set(
        REQUIRED_COLUMNS["episodes"]
    )
    assert {"timestamp_ms", "observation", "action"} <= set(REQUIRED_COLUMNS["frames"])


@pytest.mark.integration
def test_migrated_database_passes(db_conn: psycopg.Connection) -> None:
    check_schema(db_conn)


@pytest.fixture
def incomplete_schema(db_conn: psycopg.Connection) -> Iterator[str]:
    """A scratch schema with an older, incomplete copy of the tables (no entity_versions)."""
    schema = f"old_{uuid.uuid4().hex[:8]}"
    db_conn.execute(f"CREATE SCHEMA {schema}")
    db_conn.execute(
        f"CREATE TABLE {schema}.episodes (id text PRIMARY KEY, org_id text, status text, "
        "processed_at timestamptz, mp4_s3_path text, parquet_s3_path text, frame_count integer, "
        "duration_seconds integer, updated_at timestamptz)"  # no fps
    )
    db_conn.execute(
        f"CREATE TABLE {schema}.frames (episode_id text, frame_order integer, "
        "lerobot_episode_index integer, frame_index integer, timestamp_ms bigint, "
        "observation jsonb)"  # no action
    )
    db_conn.execute(
        f"CREATE TABLE {schema}.episode_metadata (episode_id text, meta_key text, value text, "
        "status text, created_at timestamptz, updated_at timestamptz)"
    )
    try:
        yield schema
    finally:
        db_conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.mark.integration
def test_incomplete_schema_names_every_missing_column(
    db_conn: psycopg.Connection, incomplete_schema: str
) -> None:
    with pytest.raises(SchemaMismatch) as raised:
        check_schema(db_conn, schema=incomplete_schema)
    expected = ["episodes.fps", "frames.action"] + [
        f"entity_versions.{c}" for c in REQUIRED_COLUMNS["entity_versions"]
    ]
    assert raised.value.missing == expected
    message = str(raised.value)
    assert incomplete_schema in message
    for name in expected:
        assert name in message


@pytest.mark.integration
def test_a_run_fails_at_start_naming_the_missing_columns(db_conn: psycopg.Connection) -> None:
    """A production database that misses a migration: the run stops before writing anything."""
    settings = load_settings().database
    database = f"app_{uuid.uuid4().hex[:8]}"
    db_conn.execute(f"CREATE DATABASE {database}")
    try:
        with connect(replace(settings, name=database), autocommit=True) as app:
            app.execute("CREATE TABLE episodes (id text PRIMARY KEY, org_id text, status text)")
        postgres = PostgresResource.from_settings(replace(settings, name=database))

        @asset(required_resource_keys={"postgres"})
        def uses_the_database() -> None:
            raise AssertionError("must not run against an incomplete schema")

        with pytest.raises(DagsterResourceFunctionError) as error:
            materialize([uses_the_database], resources={"postgres": postgres})
        cause = error.value.__cause__
        assert isinstance(cause, SchemaMismatch)
        assert {"episodes.fps", "frames.action"} <= set(cause.missing)
    finally:
        db_conn.execute(f"DROP DATABASE {database} WITH (FORCE)")
