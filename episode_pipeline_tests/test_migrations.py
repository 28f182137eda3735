"""Migrations: applied once, in order, idempotently, each file atomically, under a lock."""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from episode_pipeline.config.settings import Settings
from episode_pipeline.db.connection import connect
from episode_pipeline.db.migrate import (
    MIGRATIONS_DIR,
    Migration,
    MigrationError,
    apply_migrations,
    discover,
    pending,
)
from episode_pipeline.db.schema_check import check_schema

# --- pure -----------------------------------------------------------------------------------


def test_discover_orders_files_by_version(tmp_path: Path) -> None:
    (tmp_path / "002_second.sql").write_text("SELECT 2;")
    (tmp_path / "001_first.sql").write_text("SELECT 1;")
    assert [m.version for m in discover(tmp_path)] == ["001", "002"]


def test_misnamed_file_is_an_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "add_things.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match=r"add_things\.sql"):
        discover(tmp_path)


def test_edited_applied_migration_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "001_first.sql"
    migration = Migration("001", "first", path, "SELECT 1;")
    with pytest.raises(MigrationError, match=r"001_first\.sql.*changed"):
        pending({"001": "old-checksum"}, [migration])
    assert pending({"001": migration.checksum}, [migration]) == []


def test_shipped_migrations_start_with_001() -> None:
    assert discover(MIGRATIONS_DIR)[0].path.name == "001_initial.sql"


# --- on a scratch database of the session stack ----------------------------------------------


def _schema_snapshot(conn: psycopg.Connection) -> list[tuple]:
    columns = conn.execute(
        "SELECT table_name, column_name, data_type, is_nullable, column_default "
        "FROM information_schema.columns WHERE table_schema = 'public' ORDER BY 1, 2"
    ).fetchall()
    indexes = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY 1"
    ).fetchall()
    return columns + indexes


@pytest.fixture
def scratch_db(settings: Settings) -> Iterator[Settings]:
    """A new empty database on the stack's server, dropped after the test."""
    name = f"scratch_{uuid.uuid4().hex[:10]}"
    admin_db = replace(settings.database, name="postgres")
    with connect(admin_db, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield replace(settings, database=replace(settings.database, name=name))
    finally:
        with connect(admin_db, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.mark.integration
def test_fresh_database_gets_every_migration_then_nothing(scratch_db: Settings) -> None:
    with connect(scratch_db.database, autocommit=True) as conn:
        assert apply_migrations(conn) == [m.version for m in discover()]
        check_schema(conn)
        before = _schema_snapshot(conn)
        assert apply_migrations(conn) == []
        assert _schema_snapshot(conn) == before
        versions = conn.execute("SELECT version FROM schema_migrations ORDER BY 1").fetchall()
        assert [v for (v,) in versions] == [m.version for m in discover()]


@pytest.mark.integration
def test_session_stack_is_fully_migrated(db_conn: psycopg.Connection) -> None:
    before = _schema_snapshot(db_conn)
    assert apply_migrations(db_conn) == []
    assert _schema_snapshot(db_conn) == before


@pytest.mark.integration
def test_failing_migration_rolls_back_whole_file(scratch_db: Settings, tmp_path: Path) -> None:
    shutil.copy(MIGRATIONS_DIR / "001_initial.sql", tmp_path)
    (tmp_path / "002_broken.sql").write_text(
        "ALTER TABLE episodes ADD COLUMN robot text;\nSELECT * FROM no_such_table;\n"
    )
    with connect(scratch_db.database, autocommit=True) as conn:
        with pytest.raises(MigrationError, match=r"002_broken\.sql"):
            apply_migrations(conn, tmp_path)
        columns = conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'episodes'"
        ).fetchall()
        assert ("robot",) not in columns
        applied = conn.execute("SELECT version FROM schema_migrations").fetchall()
        assert applied == [("001",)]


@pytest.mark.integration
def test_concurrent_migrators_apply_each_file_once(scratch_db: Settings) -> None:
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def migrate() -> None:
        try:
            with connect(scratch_db.database, autocommit=True) as conn:
                results.append(apply_migrations(conn))
        except BaseException as error:  # surfaced by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=migrate) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(results) == [[], [], [m.version for m in discover()]]


def test_apply_needs_autocommit() -> None:
    class NotAutocommit:
        autocommit = False

    with pytest.raises(MigrationError, match="autocommit"):
        apply_migrations(NotAutocommit())  # type: ignore[arg-type]
