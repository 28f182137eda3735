"""Check, before writing anything, that the database has every column the pipeline writes.

In production the schema belongs to the application that owns Aurora; the pipeline never
migrates it. A renamed or missing column would otherwise surface as a failed COPY halfway through
an episode, so every run starts by checking, and the error names every missing `table.column`.
"""

from __future__ import annotations

from collections.abc import Mapping

import psycopg

from episode_pipeline.lerobot.frames import FRAME_COLUMNS

# table -> columns the pipeline reads or writes. Serial ids and created_at defaults are listed
# too where the pipeline reads them back (episode_metadata, entity_versions upserts key on them).
REQUIRED_COLUMNS: Mapping[str, tuple[str, ...]] = {
    "episodes": (
        "id",
        "org_id",
        "status",
        "processed_at",
        "mp4_s3_path",
        "parquet_s3_path",
        "frame_count",
        "fps",
        "duration_seconds",
        "updated_at",
    ),
    "frames": ("episode_id", *FRAME_COLUMNS),
    "episode_metadata": (
        "episode_id",
        "meta_key",
        "value",
        "status",
        "created_at",
        "updated_at",
    ),
    "entity_versions": (
        "entity_type",
        "entity_id",
        "version",
        "operation",
        "data",
        "created_at",
    ),
}


class SchemaMismatch(RuntimeError):
    """The database lacks tables or columns the pipeline writes."""

    def __init__(self, missing: list[str], schema: str) -> None:
        self.missing = missing
        super().__init__(
            f"database schema {schema!r} is missing {len(missing)} column(s) the pipeline writes: "
            f"{', '.join(missing)} (locally: `episode-pipeline stack up` applies the migrations)"
        )


def missing_columns(
    existing: Mapping[str, set[str]], required: Mapping[str, tuple[str, ...]] = REQUIRED_COLUMNS
) -> list[str]:
    """`table.column` for every required column absent from `existing` (table -> columns)."""
    return [
        f"{table}.{column}"
        for table, columns in required.items()
        for column in columns
        if column not in existing.get(table, set())
    ]


def existing_columns(conn: psycopg.Connection, schema: str = "public") -> dict[str, set[str]]:
    rows = conn.execute(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = ANY(%s)",
        (schema, list(REQUIRED_COLUMNS)),
    ).fetchall()
    existing: dict[str, set[str]] = {}
    for table, column in rows:
        existing.setdefault(table, set()).add(column)
    return existing


def check_schema(conn: psycopg.Connection, schema: str = "public") -> None:
    """Raise SchemaMismatch naming every missing `table.column`; return None when complete."""
    missing = missing_columns(existing_columns(conn, schema))
    if missing:
        raise SchemaMismatch(missing, schema)
