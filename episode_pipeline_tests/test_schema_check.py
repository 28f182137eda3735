"""The production guard: the contract's columns must exist and nothing NOT NULL may stay empty,
or the error names each `table.column`; every other column is used only where it exists."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace

import psycopg
import pytest
from dagster import DagsterResourceFunctionError, asset, materialize

from episode_pipeline.db.connection import connect
from episode_pipeline.db.schema_check import (
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    ColumnInfo,
    DatabaseSchema,
    SchemaMismatch,
    check_schema,
    read_schema,
)
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.local.stack_env import load_settings


def schema_of(tables: dict[str, set[str]], not_null: dict[str, set[str]] | None = None):
    not_null = not_null or {}
    columns = {
        table: {
            name: ColumnInfo(name, name in not_null.get(table, set()), has_default=False)
            for name in names
        }
        for table, names in tables.items()
    }
    return DatabaseSchema("public", columns, entity_versions_unique=False)


def test_missing_columns_lists_absent_tables_and_columns() -> None:
    existing = {
        "episodes": set(REQUIRED_COLUMNS["episodes"]) - {"fps"},
        "frames": set(REQUIRED_COLUMNS["frames"]),
        "episode_metadata": set(REQUIRED_COLUMNS["episode_metadata"]) | {"extra"},
    }
    missing = schema_of(existing).missing()
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


def test_only_the_contracts_columns_are_required() -> None:
    # What the pipeline can fill but the replaced worker's contract never named is optional.
    assert "org_id" not in REQUIRED_COLUMNS["episodes"]
    assert {"org_id", "updated_at"} <= set(OPTIONAL_COLUMNS["episodes"])
    assert "frame_order" in OPTIONAL_COLUMNS["frames"]
    tables = {table: set(columns) for table, columns in REQUIRED_COLUMNS.items()}
    assert schema_of(tables).missing() == []


def test_not_null_columns_the_pipeline_leaves_empty_are_named() -> None:
    tables = {table: set(columns) for table, columns in REQUIRED_COLUMNS.items()}
    tables["episodes"] |= {"robot_serial", "org_id"}
    tables["frames"] |= {"camera_count"}
    not_null = {"episodes": {"robot_serial", "org_id", "status"}, "frames": {"camera_count"}}
    found = schema_of(tables, not_null)
    # org_id is one the pipeline fills, status one it writes: neither is a problem.
    assert found.unfillable() == ["episodes.robot_serial", "frames.camera_count"]


@pytest.mark.integration
def test_migrated_database_passes(db_conn: psycopg.Connection) -> None:
    found = check_schema(db_conn)
    assert found.entity_versions_unique
    assert found.optional_present("frames") == OPTIONAL_COLUMNS["frames"]


@pytest.mark.integration
def test_a_not_null_column_without_default_is_named_at_start(db_conn: psycopg.Connection) -> None:
    schema = f"app_{uuid.uuid4().hex[:8]}"
    db_conn.execute(f"CREATE SCHEMA {schema}")
    try:
        for table, columns in REQUIRED_COLUMNS.items():
            db_conn.execute(
                f"CREATE TABLE {schema}.{table} ({', '.join(f'{c} text' for c in columns)})"
            )
        db_conn.execute(f"ALTER TABLE {schema}.episodes ADD COLUMN robot_serial text NOT NULL")
        db_conn.execute(
            f"ALTER TABLE {schema}.frames ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY"
        )
        db_conn.execute(f"ALTER TABLE {schema}.frames ADD COLUMN kind text NOT NULL DEFAULT 'x'")
        assert not read_schema(db_conn, schema).entity_versions_unique
        with pytest.raises(SchemaMismatch, match=r"episodes\.robot_serial") as raised:
            check_schema(db_conn, schema=schema)
        assert raised.value.missing == []
        assert raised.value.unfillable == ["episodes.robot_serial"]  # identity, default: fine
    finally:
        db_conn.execute(f"DROP SCHEMA {schema} CASCADE")


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
