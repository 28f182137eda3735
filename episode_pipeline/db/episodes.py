"""Every SQL statement that touches an episode's row and metadata, in one place.

Each function takes an open psycopg connection; the caller owns the transaction, so an asset can
put several of these in one commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
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
from episode_pipeline.episodes.keys import (
    FORBIDDEN_IN_ID,
    ID_PATTERN,
    EpisodeRef,
    UnkeyableRow,
    ref_of_row,
)

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


def is_processing(conn: psycopg.Connection, schema: DatabaseSchema, ref: EpisodeRef) -> bool:
    """The episode's row says `processing` (locked until the transaction ends)."""
    where, params = _episode_is(schema, ref)
    row = conn.execute(
        sql.SQL("SELECT status FROM episodes WHERE {} FOR UPDATE").format(where), params
    ).fetchone()
    return row is not None and row[0] == PROCESSING


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


# -- reading the application's rows: a row the pipeline cannot key is skipped, never fatal ------


@dataclass
class KeyedRows:
    """Rows read from `episodes`, split by `ref_of_row`: `rows` are (ref, *the other columns),
    `invalid` the rows the pipeline cannot key (skipped, counted, listed by `status
    --invalid`)."""

    rows: list[tuple[Any, ...]] = field(default_factory=list)
    invalid: list[UnkeyableRow] = field(default_factory=list)

    @property
    def refs(self) -> list[EpisodeRef]:
        return [row[0] for row in self.rows]


def keyed_rows(rows: Iterable[Sequence[Any]]) -> KeyedRows:
    """Each `(org_id, id, *rest)` row as `(EpisodeRef, *rest)`, or in `invalid`."""
    keyed = KeyedRows()
    for org_id, episode_id, *rest in rows:
        ref = ref_of_row(org_id, episode_id)
        if isinstance(ref, UnkeyableRow):
            keyed.invalid.append(ref)
        else:
            keyed.rows.append((ref, *rest))
    return keyed


def recent_episode_refs(
    conn: psycopg.Connection,
    org_id: str | None = None,
    limit: int = 50,
    status: str | None = None,
) -> KeyedRows:
    """The `limit` most recently changed episodes (of one org or all, of one status or any),
    newest first: one bounded query (`episodes_newest_first_idx`, or the status index), never
    the whole table. A row the pipeline cannot key is in `invalid`, not in the page."""
    filters = {column: value for column, value in (("status", status), ("org_id", org_id)) if value}
    where = [f"{column} = %s" for column in filters]
    params = list(filters.values())
    rows = conn.execute(
        f"SELECT org_id, id::text FROM episodes {'WHERE ' + ' AND '.join(where) if where else ''} "
        "ORDER BY updated_at DESC NULLS LAST, id DESC LIMIT %s",
        (*params, limit),
    ).fetchall()
    return keyed_rows(rows)


def failed_episode_refs(
    conn: psycopg.Connection, org_id: str | None = None, limit: int = 50
) -> KeyedRows:
    """The `limit` most recently changed episodes with status `failed`."""
    return recent_episode_refs(conn, org_id, limit, status=FAILED)


def unkeyable_sql(org_id: sql.Composable, episode_id: sql.Composable) -> sql.Composable:
    """The rows `ref_of_row` rejects, found by PostgreSQL with the same pattern (keys.ID_PATTERN)
    over these two text expressions: a filter for queries whose rows never pass through Python
    (a campaign's ledger is filled by INSERT … SELECT)."""
    return sql.SQL(
        "({org} IS NULL OR NOT ({org} ~ {pattern} AND {episode} ~ {pattern}"
        " AND strpos({org}, {forbidden}) = 0 AND strpos({episode}, {forbidden}) = 0))"
    ).format(
        org=org_id,
        episode=episode_id,
        pattern=sql.Literal(f"^{ID_PATTERN}$"),
        forbidden=sql.Literal(FORBIDDEN_IN_ID),
    )


# An id column of type uuid always matches, so only a text id can be invalid.
_UNKEYABLE = unkeyable_sql(sql.Identifier("org_id"), sql.SQL("id::text"))


@dataclass(frozen=True)
class InvalidEpisodeRow:
    """A row of `episodes` the pipeline skips, as `status --invalid` shows it."""

    row: UnkeyableRow
    status: str | None
    updated_at: datetime | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.row.episode_id,
            "org_id": self.row.org_id,
            "status": self.status,
            "updated_at": self.updated_at,
            "reason": self.row.reason,
        }


def invalid_episode_rows(
    conn: psycopg.Connection, org_id: str | None = None, limit: int = 50
) -> list[InvalidEpisodeRow]:
    """The `limit` most recently changed rows the pipeline cannot key, with the reason: what
    the application must fix (docs/operations.md#rows-the-pipeline-cannot-key). Few or none
    such rows exist, so the filter may read the whole table: an operator's command, never a
    sensor's."""
    schema = read_schema(conn)
    if not schema.has("episodes", "org_id"):
        return []
    where: list[sql.Composable] = [_UNKEYABLE]
    params: list[Any] = []
    if org_id is not None:
        where.append(sql.SQL("org_id = %s"))
        params.append(org_id)
    updated_at = sql.SQL("updated_at" if schema.has("episodes", "updated_at") else "NULL")
    rows = conn.execute(
        sql.SQL(
            "SELECT org_id, id::text, status, {updated_at} FROM episodes WHERE {where}"
            " ORDER BY {updated_at} DESC NULLS LAST, id DESC LIMIT %s"
        ).format(updated_at=updated_at, where=sql.SQL(" AND ").join(where)),
        (*params, limit),
    ).fetchall()
    found = []
    for org, episode_id, status, changed in rows:
        row = ref_of_row(org, episode_id)
        if isinstance(row, UnkeyableRow):  # the rule decides; the SQL only narrows the scan
            found.append(InvalidEpisodeRow(row, status, changed))
    return found


# -- reconciliation (orchestration/lost_uploads.py, orchestration/stale_processing.py) -----------


@dataclass
class EpisodePage(KeyedRows):
    """One page of a keyset walk by id: `rows` are (ref, processed_at). `last_id` is the last id
    read, an unkeyable row's too, so the next page starts past it; `full` says more may follow."""

    last_id: str | None = None
    full: bool = False


def episodes_after(
    conn: psycopg.Connection, schema: DatabaseSchema, after_id: str | None, limit: int
) -> EpisodePage:
    """Up to `limit` episodes whose id sorts after `after_id` (None = from the first), in id
    order, with `processed_at`: one page of a walk over every episode that no kind of row can
    stall (keyset paging on the primary key, not oldest-first; a row the pipeline cannot key
    is in `invalid`, and the walk moves past it). Any id type: a `uuid` id compares with the
    previous page's last id, and the first page has no bound at all.

    Needs `episodes.org_id` (the upload's prefix): without it nothing can be reconciled.
    """
    if not schema.has("episodes", "org_id"):
        return EpisodePage()
    return _episode_page(conn, schema, sql.SQL("TRUE"), (), after_id, limit)


def pending_episodes(
    conn: psycopg.Connection,
    schema: DatabaseSchema,
    after_id: str | None,
    limit: int,
    settled_seconds: int,
    lookback_seconds: int,
) -> EpisodePage:
    """A page (by id, after `after_id`) of the episodes never processed: status `uploaded`, and
    where the table keeps `updated_at`, last changed between `lookback_seconds` and
    `settled_seconds` ago (a younger upload may still be announced; an older one is left to
    the full walk). The status filter is served by an index on `episodes.status`."""
    if not schema.has("episodes", "org_id"):
        return EpisodePage()
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
    after_id: str | None,
    limit: int,
) -> EpisodePage:
    processed_at = sql.SQL("processed_at" if schema.has("episodes", "processed_at") else "NULL")
    after: sql.Composable = sql.SQL("")
    if after_id is not None:
        after, params = sql.SQL(" AND id > %s"), (*params, after_id)
    rows = conn.execute(
        sql.SQL("SELECT org_id, id::text, {} FROM episodes WHERE {}{} ORDER BY id LIMIT %s").format(
            processed_at, where, after
        ),
        (*params, limit),
    ).fetchall()
    keyed = keyed_rows(rows)
    return EpisodePage(
        keyed.rows,
        keyed.invalid,
        last_id=rows[-1][1] if rows else None,
        full=len(rows) == limit,
    )


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
) -> KeyedRows:
    """Episodes `processing` with no change for `older_than_seconds` (every one when the table
    keeps no `updated_at`), with the `updated_at` seen, for `fail_if_still_processing`."""
    if not schema.has("episodes", "org_id"):
        return KeyedRows()
    if not schema.has("episodes", "updated_at"):
        rows = conn.execute(
            "SELECT org_id, id::text, NULL FROM episodes WHERE status = %s", (PROCESSING,)
        ).fetchall()
    else:
        rows = conn.execute(
            """
            SELECT org_id, id::text, updated_at FROM episodes
             WHERE status = %s AND updated_at < now() - make_interval(secs => %s)
            """,
            (PROCESSING, older_than_seconds),
        ).fetchall()
    return keyed_rows(rows)


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
