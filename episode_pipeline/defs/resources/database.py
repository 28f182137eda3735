"""PostgreSQL as a Dagster resource: the connection settings in config, the connecting in one place.

The resource only carries settings; `episode_pipeline.db.connection.connect` does the work
(password, SSL, RDS IAM token, refreshed before it expires). Every `connect()` opens a fresh
connection, so a long run never holds a connection whose token has lapsed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from typing import Any

import psycopg
from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field, PrivateAttr

from episode_pipeline.config.settings import DEFAULT_REGION, DatabaseSettings
from episode_pipeline.db.connection import connect as db_connect
from episode_pipeline.db.schema_check import DatabaseSchema, check_schema, read_schema
from episode_pipeline.defs.resources.secret_config import resolved, secret_field

PASSWORD_ENV = "DB_PASSWORD"
# The resource's field for each `DatabaseSettings` field: the same name, but for the database's.
_FIELD = {"name": "database"}


class PostgresResource(ConfigurableResource):
    """Connection settings for the pipeline's PostgreSQL (Aurora on AWS, pgserver locally)."""

    host: str = Field(description="Host name, or the Unix socket directory locally.")
    port: int = Field(default=5432)
    database: str = Field(default="postgres")
    user: str = Field(default="postgres")
    password: str | None = Field(
        default=None,
        description="Secret: pass EnvVar('DB_PASSWORD') so the UI shows the variable, not the "
        "value. Ignored when iam_auth is true.",
    )
    ssl: bool = Field(default=False, description="Require TLS (DB_SSL).")
    iam_auth: bool = Field(
        default=False, description="Connect with an RDS IAM token (DB_IAM_AUTH)."
    )
    region: str = Field(default=DEFAULT_REGION, description="AWS region for the IAM token.")
    connect_timeout_seconds: int = Field(default=10, description="DB_CONNECT_TIMEOUT_SECONDS")
    statement_timeout_seconds: int = Field(default=900, description="DB_STATEMENT_TIMEOUT_SECONDS")
    lock_timeout_seconds: int = Field(default=60, description="DB_LOCK_TIMEOUT_SECONDS")
    idle_in_transaction_timeout_seconds: int = Field(
        default=600, description="DB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS"
    )
    keepalive_idle_seconds: int = Field(default=30, description="DB_KEEPALIVE_IDLE_SECONDS")
    check_schema_on_start: bool = Field(
        default=True,
        description="Before a run uses the database, check that every column the contract "
        "names exists and that no NOT NULL column would be left empty (in production the "
        "application owns the schema), and fail naming each `table.column`.",
    )

    _tables: Any = PrivateAttr(default=None)  # DatabaseSchema, read once per run

    @classmethod
    def from_settings(
        cls, db: DatabaseSettings, *, password_env: str = PASSWORD_ENV
    ) -> PostgresResource:
        """Build from `load_settings().database`.

        When the password came from the environment variable `password_env`, it is passed as an
        `EnvVar`, so Dagster never displays or stores the secret itself.
        """
        values = {_FIELD.get(f.name, f.name): getattr(db, f.name) for f in fields(db)}
        return cls(**{**values, "password": secret_field(db.password, password_env)})

    def database_settings(self) -> DatabaseSettings:
        values = {
            f.name: getattr(self, _FIELD.get(f.name, f.name)) for f in fields(DatabaseSettings)
        }
        return DatabaseSettings(**{**values, "password": resolved(self.password)})

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
