"""PostgreSQL as a Dagster resource: the connection settings in config, the connecting in one place.

The resource only carries settings; `episode_pipeline.db.connection.connect` does the work
(password, SSL, RDS IAM token, refreshed before it expires). Every `connect()` opens a fresh
connection, so a long run never holds a connection whose token has lapsed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from dagster import InitResourceContext
from pydantic import Field, PrivateAttr

from episode_pipeline.config.settings import DatabaseSettings
from episode_pipeline.db.connection import connect as db_connect
from episode_pipeline.db.schema_check import DatabaseSchema, check_schema, read_schema
from episode_pipeline.defs.resources.settings_fields import SettingsFields, settings_resource

# Every `DatabaseSettings` field, under the same name but for the database's.
_DATABASE = SettingsFields(DatabaseSettings, rename={"name": "database"})


class PostgresResource(settings_resource(_DATABASE)):
    """Connection settings for the pipeline's PostgreSQL (Aurora on AWS, pgserver locally): a
    field for each `DatabaseSettings` setting (`database` for its `name`)."""

    check_schema_on_start: bool = Field(
        default=True,
        description="Before a run uses the database, check that every column the contract "
        "names exists and that no NOT NULL column would be left empty (in production the "
        "application owns the schema), and fail naming each `table.column`.",
    )

    _tables: Any = PrivateAttr(default=None)  # DatabaseSchema, read once per run

    @classmethod
    def from_settings(cls, db: DatabaseSettings) -> PostgresResource:
        """Build from the settings' database group (`Settings.database`).

        A password that came from `DB_PASSWORD` is passed as an `EnvVar`, so Dagster never
        displays or stores the secret itself.
        """
        return cls(**_DATABASE.values(db))

    def database_settings(self) -> DatabaseSettings:
        return _DATABASE.read(self)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        if self.check_schema_on_start:
            with self.connect() as conn:
                self._tables = check_schema(conn)

    def database_schema(self) -> DatabaseSchema:
        """The tables as this database has them: read once per run (at start) and kept."""
        if self._tables is None:
            with self.connect() as conn:
                self._tables = read_schema(conn)
        return self._tables

    @contextmanager
    def connect(self, *, autocommit: bool = False) -> Iterator[psycopg.Connection]:
        """A new connection, closed on exit (no implicit commit: use `transaction()` for that)."""
        conn = db_connect(self.database_settings(), autocommit=autocommit)
        try:
            yield conn
        finally:
            conn.close()

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection]:
        """A connection whose work is committed on success and rolled back on any error."""
        with self.connect() as conn:
            try:
                yield conn
            except BaseException:
                conn.rollback()
                raise
            conn.commit()
