"""Versioned SQL migrations, applied idempotently (local stack and tests only).

Production never migrates from the pipeline: the schema there belongs to the application that owns
Aurora, and the pipeline only runs `schema_check.check_schema`. Locally the stack applies every
`migrations/NNN_name.sql` file that `schema_migrations` does not list yet, each in one transaction,
under an advisory lock so two processes starting at once cannot apply a file twice.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import psycopg

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
_FILE_PATTERN = re.compile(r"^(?P<version>\d{3,})_(?P<name>[A-Za-z0-9_]+)\.sql$")
# Any constant works; it only has to be the same in every process that migrates this database.
ADVISORY_LOCK_KEY = 0x65705F6D6967  # "ep_mig"

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    text PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


class MigrationError(RuntimeError):
    """A migration file that is misnamed, edited after it was applied, or fails to apply."""


@dataclass(frozen=True)
class Migration:
    version: str
    name: str
    path: Path
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The migration files in version order; a misnamed .sql file is an error, not skipped."""
    migrations: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_PATTERN.match(path.name)
        if not match:
            raise MigrationError(f"{path}: migration file name must look like 001_description.sql")
        migrations.append(Migration(match["version"], match["name"], path, path.read_text()))
    versions = [m.version for m in migrations]
    duplicates = sorted({v for v in versions if versions.count(v) > 1})
    if duplicates:
        raise MigrationError(f"{directory}: duplicate migration version(s) {', '.join(duplicates)}")
    return migrations


def pending(applied: dict[str, str], migrations: list[Migration]) -> list[Migration]:
    """Migrations not yet applied; raises when an applied file's content changed since."""
    for migration in migrations:
        checksum = applied.get(migration.version)
        if checksum is not None and checksum != migration.checksum:
            raise MigrationError(
                f"{migration.path}: already applied as version {migration.version} but its content "
                "changed; add a new numbered file instead of editing an applied one"
            )
    return [m for m in migrations if m.version not in applied]


def apply_migrations(conn: psycopg.Connection, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply pending migrations to `conn`'s database; returns the versions applied (maybe none).

    The connection must be in autocommit mode: each file gets its own transaction, and the
    session-level advisory lock spans all of them.
    """
    if not conn.autocommit:
        raise MigrationError("apply_migrations needs an autocommit connection")
    migrations = discover(directory)
    conn.execute("SELECT pg_advisory_lock(%s)", (ADVISORY_LOCK_KEY,))
    try:
        conn.execute(_CREATE_TABLE)
        rows = conn.execute("SELECT version, checksum FROM schema_migrations").fetchall()
        applied_versions: list[str] = []
        for migration in pending(dict(rows), migrations):
            try:
                with conn.transaction():
                    conn.execute(migration.sql)  # type: ignore[arg-type]  # file content, no params
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name, checksum) "
                        "VALUES (%s, %s, %s)",
                        (migration.version, migration.name, migration.checksum),
                    )
            except psycopg.Error as error:
                raise MigrationError(f"{migration.path}: failed to apply: {error}") from error
            applied_versions.append(migration.version)
        return applied_versions
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (ADVISORY_LOCK_KEY,))


def main() -> int:
    """`python -m episode_pipeline.db.migrate`: migrate the database the DB_* variables name (the
    local stack migrates its own on `stack up`)."""
    from episode_pipeline.config.settings import DatabaseSettings
    from episode_pipeline.db.connection import connect

    with connect(DatabaseSettings.from_env(os.environ), autocommit=True) as conn:
        applied = apply_migrations(conn)
    print(f"applied: {', '.join(applied)}" if applied else "schema up to date", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
