"""Every SQL statement that touches an episode's row and metadata, in one place.

Each function takes an open psycopg connection; the caller owns the transaction, so an asset can
put several of these in one commit.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from episode_pipeline.db.schema_check import DatabaseSchema, read_schema
from episode_pipeline.episodes.episode_rows import (
    CREATE_OPERATION,
    ENTITY_TYPE,
    FIRST_VERSION,
    EpisodeColumns,
    MetadataItem,
    entity_version_data,
)
from episode_pipeline.episodes.keys import EpisodeRef

PROCESSING = "processing"
PROCESSED = "processed"
FAILED = "failed"
UPLOADED = "uploaded"


class EpisodeNotFound(LookupError):
    """The application creates the episode row; the pipeline never does.

    See docs/contract.md#status-transitions.
    """


class EpisodeOrgMismatch(ValueError):
    """The episode id already exists under another org."""


def ensure_episode_row(conn: psycopg.Connection, ref: EpisodeRef) -> None:
    """Create the row if absent (status `uploaded`), as the application does before an upload.

    Only the local `upload` command does this; the pipeline itself never creates episodes.
    """
    conn.execute(
        "INSERT INTO episodes (id, org_id, status) VALUES (%s, %s, %s) ON CONFLICT (id) DO NOTHING",
        (ref.episode_id, ref.org_id, UPLOADED),
    )
    row = conn.execute("SELECT org_id FROM episodes WHERE id = %s", (ref.episode_id,)).fetchone()
    if row is None or row[0] != ref.org_id:
        raise EpisodeOrgMismatch(
            f"episodes.org_id for episode {ref.episode_id!r} is {row[0] if row else None!r}, "
            f"not {ref.org_id!r}"
        )


def _episode_is(schema: DatabaseSchema, ref: EpisodeRef) -> tuple[sql.Composable, tuple[str, ...]]:
    """`id = %s`, plus `AND org_id = %s` where the table has the column (the org check)."""
    if schema.has("episodes", "org_id"):
        return sql.SQL("id = %s AND org_id = %s"), (ref.episode_id, ref.org_id)
    return sql.SQL("id = %s"), (ref.episode_id,)


def _touched(schema: DatabaseSchema, table: str) -> sql.Composable:
    """`, updated_at = now()` where the table keeps one."""
    return sql.SQL(", updated_at = now()") if schema.has(table, "updated_at") else sql.SQL("")


def mark_processing(conn: psycopg.Connection, schema: DatabaseSchema, ref: EpisodeRef) -> None:
    where, params = _episode_is(schema, ref)
    cursor = conn.execute(
        sql.SQL("UPDATE episodes SET status = %s{} WHERE {}").format(
            _touched(schema, "episodes"), where
        ),
        (PROCESSING, *params),
    )
    if cursor.rowcount == 0:
        raise EpisodeNotFound(
            f"episode {ref.episode_id!r} of org {ref.org_id!r} has no row in `episodes`: "
            "the application creates it before the upload"
        )


def mark_processed(
    conn: psycopg.Connection, schema: DatabaseSchema, ref: EpisodeRef, columns: EpisodeColumns
) -> datetime:
    """Status, processed_at and the contract's columns in one statement; returns processed_at."""
    where, params = _episode_is(schema, ref)
    row = conn.execute(
        sql.SQL(
            """
            UPDATE episodes
               SET status = %s, processed_at = now(){},
                   mp4_s3_path = %s, parquet_s3_path = %s,
                   frame_count = %s, fps = %s, duration_seconds = %s
             WHERE {}
         RETURNING processed_at
            """
        ).format(_touched(schema, "episodes"), where),
        (
            PROCESSED,
            columns.mp4_s3_path,
            columns.parquet_s3_path,
            columns.frame_count,
            columns.fps,
            columns.duration_seconds,
            *params,
        ),
    ).fetchone()
    if row is None:
        raise EpisodeNotFound(f"episode {ref.episode_id!r} of org {ref.org_id!r} has no row")
    return row[0]


def mark_failed(
    conn: psycopg.Connection, schema: DatabaseSchema, ref: EpisodeRef, run_started_at: datetime
) -> bool:
    """Failed, unless the episode was processed since this run started.

    `processed` stays when only the metadata write fails (it runs after the episode is
    processed), and a late failure of an older run never undoes a newer run's `processed`; any
    other failure, including one in a re-run of a processed episode, is `failed`. Returns
    whether the row changed.
    """
    where, params = _episode_is(schema, ref)
    cursor = conn.execute(
        sql.SQL(
            """
            UPDATE episodes SET status = %s{}
             WHERE {} AND NOT (status = %s AND processed_at >= %s)
            """
        ).format(_touched(schema, "episodes"), where),
        (FAILED, *params, PROCESSED, run_started_at),
    )
    return cursor.rowcount > 0


def replace_metadata(
    conn: psycopg.Connection, schema: DatabaseSchema, ref: EpisodeRef, items: list[MetadataItem]
) -> None:
    """Replace the pipeline's keys of the episode and (over)write its version-1 record.

    Keys the application added beside ours are left alone. `entity_versions` is upserted on its
    unique index when the table has one; otherwise updated, then inserted if absent, under a
    lock on the episode so two runs cannot both insert.
    """
    conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
        (f"episode_metadata:{ref.episode_id}",),
    )
    conn.execute(
        "DELETE FROM episode_metadata WHERE episode_id = %s AND meta_key = ANY(%s)",
        (ref.episode_id, [item.meta_key for item in items]),
    )
    with conn.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO episode_metadata (episode_id, meta_key, value, status)"
            " VALUES (%s, %s, %s, %s)",
            [(ref.episode_id, item.meta_key, item.value, item.status) for item in items],
        )
    key = (ENTITY_TYPE, ref.episode_id, FIRST_VERSION)
    data = (CREATE_OPERATION, Jsonb(entity_version_data(items)))
    stamp = sql.SQL(", created_at = now()")
    if not schema.has("entity_versions", "created_at"):
        stamp = sql.SQL("")
    if schema.entity_versions_unique:
        conn.execute(
            sql.SQL(
                """
                INSERT INTO entity_versions (entity_type, entity_id, version, operation, data)
                VALUES (%s, %s, %s, %s, %s)
                ON CONFLICT (entity_type, entity_id, version)
                DO UPDATE SET operation = EXCLUDED.operation, data = EXCLUDED.data{}
                """
            ).format(stamp),
            (*key, *data),
        )
        return
    updated = conn.execute(
        sql.SQL(
            "UPDATE entity_versions SET operation = %s, data = %s{}"
            " WHERE entity_type = %s AND entity_id = %s AND version = %s"
        ).format(stamp),
        (*data, *key),
    )
    if updated.rowcount == 0:
        conn.execute(
            "INSERT INTO entity_versions (entity_type, entity_id, version, operation, data)"
            " VALUES (%s, %s, %s, %s, %s)",
            (*key, *data),
        )


def episode_row(conn: psycopg.Connection, ref: EpisodeRef) -> dict[str, Any] | None:
    cursor = conn.execute("SELECT * FROM episodes WHERE id = %s", (ref.episode_id,))
    row = cursor.fetchone()
    if row is None:
        return None
    return dict(zip([column.name for column in cursor.description], row, strict=True))


def metadata_values(conn: psycopg.Connection, ref: EpisodeRef) -> dict[str, str | None]:
    rows = conn.execute(
        "SELECT meta_key, value FROM episode_metadata WHERE episode_id = %s ORDER BY meta_key",
        (ref.episode_id,),
    ).fetchall()
    return dict(rows)


def frame_rows(conn: psycopg.Connection, ref: EpisodeRef) -> int:
    row = conn.execute("SELECT count(*) FROM frames WHERE episode_id = %s", (ref.episode_id,))
    return int(row.fetchone()[0])


def timestamp_regressions(
    conn: psycopg.Connection, schema: DatabaseSchema, ref: EpisodeRef
) -> int | None:
    """Rows whose timestamp is not after the previous row's within the same LeRobot episode.

    None when `frames` keeps no `frame_order`: without it the rows have no order to check.
    """
    if not schema.has("frames", "frame_order"):
        return None
    by_episode = sql.SQL("")
    if schema.has("frames", "lerobot_episode_index"):
        by_episode = sql.SQL("PARTITION BY lerobot_episode_index")
    row = conn.execute(
        sql.SQL(
            """
            SELECT count(*) FROM (
                SELECT timestamp_ms,
                       lag(timestamp_ms) OVER ({} ORDER BY frame_order) AS previous
                  FROM frames WHERE episode_id = %s
            ) ordered
            WHERE previous IS NOT NULL AND timestamp_ms <= previous
            """
        ).format(by_episode),
        (ref.episode_id,),
    )
    return int(row.fetchone()[0])


def waiting_uploads(
    conn: psycopg.Connection, older_than_seconds: int, limit: int
) -> list[EpisodeRef]:
    """Episodes still `uploaded` long after their last change: their event may have been lost.

    Needs `episodes.org_id` (the upload's prefix) and `episodes.updated_at` (its age): on a table
    without them nothing is reconciled.
    """
    schema = read_schema(conn)
    if not (schema.has("episodes", "org_id") and schema.has("episodes", "updated_at")):
        return []
    rows = conn.execute(
        """
        SELECT org_id, id FROM episodes
         WHERE status = %s AND updated_at < now() - make_interval(secs => %s)
         ORDER BY updated_at LIMIT %s
        """,
        (UPLOADED, older_than_seconds, limit),
    ).fetchall()
    return [EpisodeRef(org_id, episode_id) for org_id, episode_id in rows]


def recent_episode_refs(
    conn: psycopg.Connection,
    org_id: str | None = None,
    limit: int = 50,
    status: str | None = None,
) -> list[EpisodeRef]:
    """The `limit` most recently changed episodes (of one org or all, of one status or any),
    newest first: one bounded query (`episodes_newest_first_idx`, or the status index), never
    the whole table."""
    filters = {column: value for column, value in (("status", status), ("org_id", org_id)) if value}
    where = [f"{column} = %s" for column in filters]
    params = list(filters.values())
    rows = conn.execute(
        f"SELECT org_id, id FROM episodes {'WHERE ' + ' AND '.join(where) if where else ''} "
        "ORDER BY updated_at DESC NULLS LAST, id DESC LIMIT %s",
        (*params, limit),
    ).fetchall()
    return [EpisodeRef(org_id, episode_id) for org_id, episode_id in rows]


def failed_episode_refs(
    conn: psycopg.Connection, org_id: str | None = None, limit: int = 50
) -> list[EpisodeRef]:
    """The `limit` most recently changed episodes with status `failed`."""
    return recent_episode_refs(conn, org_id, limit, status=FAILED)


# -- reconciliation (defs/sensors/reconcile.py) --------------------------------------------------


def episodes_after(
    conn: psycopg.Connection, schema: DatabaseSchema, after_id: str, limit: int
) -> list[tuple[EpisodeRef, datetime | None]]:
    """Up to `limit` episodes whose id sorts after `after_id` ('' = from the first), in id
    order, with `processed_at`: one page of a walk over every episode that no kind of row can
    stall (keyset paging on the primary key, not oldest-first). Any id type: a `uuid` id
    compares with the previous page's last id, and the first page has no bound at all.

    Needs `episodes.org_id` (the upload's prefix): without it nothing can be reconciled.
    """
    if not schema.has("episodes", "org_id"):
        return []
    return _episode_page(conn, schema, sql.SQL("TRUE"), (), after_id, limit)


def pending_episodes(
    conn: psycopg.Connection,
    schema: DatabaseSchema,
    after_id: str,
    limit: int,
    settled_seconds: int,
    lookback_seconds: int,
) -> list[tuple[EpisodeRef, datetime | None]]:
    """A page (by id, after `after_id`) of the episodes never processed: status `uploaded`, and
    where the table keeps `updated_at`, last changed between `lookback_seconds` and
    `settled_seconds` ago (a younger upload may still be announced; an older one is left to
    the full walk). The status filter is served by an index on `episodes.status`."""
    if not schema.has("episodes", "org_id"):
        return []
    where: sql.Composable = sql.SQL("status = %s")
    params: tuple[Any, ...] = (UPLOADED,)
    if schema.has("episodes", "updated_at"):
        where = sql.SQL(
            "status = %s AND updated_at < now() - make_interval(secs => %s)"
            " AND updated_at >= now() - make_interval(secs => %s)"
        )
        params = (UPLOADED, settled_seconds, lookback_seconds)
    return _episode_page(conn, schema, where, params, after_id, limit)


def _episode_page(
    conn: psycopg.Connection,
    schema: DatabaseSchema,
    where: sql.Composable,
    params: tuple[Any, ...],
    after_id: str,
    limit: int,
) -> list[tuple[EpisodeRef, datetime | None]]:
    processed_at = sql.SQL("processed_at" if schema.has("episodes", "processed_at") else "NULL")
    after: sql.Composable = sql.SQL("")
    if after_id:
        after, params = sql.SQL(" AND id > %s"), (*params, after_id)
    rows = conn.execute(
        sql.SQL("SELECT org_id, id::text, {} FROM episodes WHERE {}{} ORDER BY id LIMIT %s").format(
            processed_at, where, after
        ),
        (*params, limit),
    ).fetchall()
    return [(EpisodeRef(org_id, episode_id), done) for org_id, episode_id, done in rows]


def estimated_episode_count(conn: psycopg.Connection) -> int:
    """The planner's row estimate of `episodes` (no scan), or an exact count if never analyzed."""
    row = conn.execute(
        "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass('episodes')"
    ).fetchone()
    if row is not None and row[0] is not None and row[0] > 0:
        return int(row[0])
    return int(conn.execute("SELECT count(*) FROM episodes").fetchone()[0])


def stale_processing(
    conn: psycopg.Connection, schema: DatabaseSchema, older_than_seconds: int
) -> list[tuple[EpisodeRef, datetime | None]]:
    """Episodes `processing` with no change for `older_than_seconds` (every one when the table
    keeps no `updated_at`), with the `updated_at` seen, for `fail_if_still_processing`."""
    if not schema.has("episodes", "org_id"):
        return []
    if not schema.has("episodes", "updated_at"):
        rows = conn.execute(
            "SELECT org_id, id, NULL FROM episodes WHERE status = %s", (PROCESSING,)
        ).fetchall()
    else:
        rows = conn.execute(
            """
            SELECT org_id, id, updated_at FROM episodes
             WHERE status = %s AND updated_at < now() - make_interval(secs => %s)
            """,
            (PROCESSING, older_than_seconds),
        ).fetchall()
    return [(EpisodeRef(org_id, episode_id), seen) for org_id, episode_id, seen in rows]


def fail_if_still_processing(
    conn: psycopg.Connection, schema: DatabaseSchema, ref: EpisodeRef, seen: datetime | None
) -> bool:
    """`failed`, only if the row is still `processing` as last seen: a run that started (or
    finished) since then changed `updated_at` and keeps its own outcome. Returns whether it
    changed."""
    where, params = _episode_is(schema, ref)
    unchanged = sql.SQL("")
    extra: tuple[Any, ...] = ()
    if schema.has("episodes", "updated_at"):
        unchanged, extra = sql.SQL(" AND updated_at IS NOT DISTINCT FROM %s"), (seen,)
    cursor = conn.execute(
        sql.SQL("UPDATE episodes SET status = %s{} WHERE {} AND status = %s{}").format(
            _touched(schema, "episodes"), where, unchanged
        ),
        (FAILED, *params, PROCESSING, *extra),
    )
    return cursor.rowcount > 0
