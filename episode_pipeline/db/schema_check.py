"""What the database offers the pipeline, read once per run, and the guard that stops a run early.

In production the tables belong to the application; the pipeline never migrates them. So the
pipeline requires only the columns the contract names (docs/contract.md#episode-columns) and
fills every other column it knows (org, frame order, LeRobot indices, timestamps) only when the
table has it. What it cannot work without is named before anything is written: a missing contract
column, and a NOT NULL column without a default that the pipeline would leave empty (every insert
would fail on it halfway through an episode).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import psycopg

from episode_pipeline.lerobot.frames import FRAMES_TABLE_COLUMNS

# table -> the columns the contract names: required.
REQUIRED_COLUMNS: Mapping[str, tuple[str, ...]] = {
    "episodes": (
        "id",
        "status",
        "processed_at",
        "mp4_s3_path",
        "parquet_s3_path",
        "frame_count",
        "fps",
        "duration_seconds",
    ),
    "frames": tuple(column.name for column in FRAMES_TABLE_COLUMNS if column.required),
    "episode_metadata": ("episode_id", "meta_key", "value", "status"),
    "entity_versions": ("entity_type", "entity_id", "version", "operation", "data"),
}
# table -> the columns the pipeline fills when the table has them.
OPTIONAL_COLUMNS: Mapping[str, tuple[str, ...]] = {
    "episodes": ("org_id", "updated_at"),
    "frames": tuple(column.name for column in FRAMES_TABLE_COLUMNS if not column.required),
    "episode_metadata": ("created_at", "updated_at"),
    "entity_versions": ("created_at",),
}
TABLES = tuple(REQUIRED_COLUMNS)


@dataclass(frozen=True)
class ColumnInfo:
    name: str
    not_null: bool
    has_default: bool  # a DEFAULT, an identity or a generated column: the server fills it


@dataclass(frozen=True)
class DatabaseSchema:
    """The pipeline's tables as this database has them."""

    name: str  # the PostgreSQL schema (namespace)
    columns: Mapping[str, Mapping[str, ColumnInfo]]  # table -> column name -> info
    entity_versions_unique: bool  # a unique index on (entity_type, entity_id, version)

    def has(self, table: str, column: str) -> bool:
        return column in self.columns.get(table, {})

    def optional_present(self, table: str) -> tuple[str, ...]:
        return tuple(c for c in OPTIONAL_COLUMNS.get(table, ()) if self.has(table, c))

    def missing(self) -> list[str]:
        """`table.column` for every contract column the database lacks."""
        return [
            f"{table}.{column}"
            for table, columns in REQUIRED_COLUMNS.items()
            for column in columns
            if not self.has(table, column)
        ]

    def unfillable(self) -> list[str]:
        """`table.column` NOT NULL without a default that the pipeline does not write."""
        return [
            f"{table}.{info.name}"
            for table, columns in self.columns.items()
            for info in columns.values()
            if info.not_null
            and not info.has_default
            and info.name not in (*REQUIRED_COLUMNS[table], *OPTIONAL_COLUMNS[table])
        ]


class SchemaMismatch(RuntimeError):
    """The database lacks columns the contract names, or demands values the pipeline lacks."""

    def __init__(self, missing: list[str], unfillable: list[str], schema: str) -> None:
        self.missing = missing
        self.unfillable = unfillable
        problems = []
        if missing:
            problems.append(
                f"is missing {len(missing)} column(s) the pipeline writes: {', '.join(missing)}"
            )
        if unfillable:
            problems.append(
                f"has NOT NULL column(s) without a default that the pipeline does not fill: "
                f"{', '.join(unfillable)}"
            )
        super().__init__(
            f"database schema {schema!r} {' and '.join(problems)} (locally: `episode-pipeline "
            "stack up` applies the migrations)"
        )


def read_schema(conn: psycopg.Connection, schema: str = "public") -> DatabaseSchema:
    rows = conn.execute(
        """
        SELECT table_name, column_name, is_nullable = 'NO',
               column_default IS NOT NULL OR is_identity = 'YES' OR is_generated = 'ALWAYS'
          FROM information_schema.columns
         WHERE table_schema = %s AND table_name = ANY(%s)
        """,
        (schema, list(TABLES)),
    ).fetchall()
    columns: dict[str, dict[str, ColumnInfo]] = {}
    for table, column, not_null, has_default in rows:
        columns.setdefault(table, {})[column] = ColumnInfo(column, not_null, has_default)
    # Any unique index (or constraint) over exactly these columns lets an upsert use it.
    unique = conn.execute(
        """
        SELECT EXISTS (
            SELECT 1 FROM pg_index i
              JOIN pg_class t ON t.oid = i.indrelid
              JOIN pg_namespace n ON n.oid = t.relnamespace
             WHERE n.nspname = %s AND t.relname = 'entity_versions' AND i.indisunique
               AND i.indpred IS NULL
               AND (SELECT array_agg(a.attname::text ORDER BY a.attname)
                      FROM pg_attribute a
                     WHERE a.attrelid = t.oid AND a.attnum = ANY(i.indkey))
                   = ARRAY['entity_id', 'entity_type', 'version']
        )
        """,
        (schema,),
    ).fetchone()[0]
    return DatabaseSchema(schema, columns, bool(unique))


def check_schema(conn: psycopg.Connection, schema: str = "public") -> DatabaseSchema:
    """The database's schema; raises SchemaMismatch naming every problem at once."""
    found = read_schema(conn, schema)
    missing, unfillable = found.missing(), found.unfillable()
    if missing or unfillable:
        raise SchemaMismatch(missing, unfillable, schema)
    return found
