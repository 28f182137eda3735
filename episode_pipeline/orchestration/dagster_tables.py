"""Every statement of the services on Dagster's own tables (`runs`, `run_tags`, `event_logs`,
`asset_event_tags`, `asset_check_executions`, `dynamic_partitions`, `kvs`), each behind a named
function: retention's prune (orchestration/retention.py) and the event log's check lookup
(orchestration/event_log.py) call them. Dagster's schema is no public API: a Dagster upgrade
re-checks this file, with dagster_compat.py and instance/. The plugins' storages
(instance/event_log_storage.py) keep their own statements; the application's state in `kvs`
(its keys and values) is instance/app_state.py's.

PostgreSQL's (dagster-postgres): the run and event-log storages share one database.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from dagster import AssetCheckKey, DagsterEventType, DagsterInstance, DagsterRunStatus
from dagster_postgres import PostgresRunStorage

from episode_pipeline.dagster_compat import AssetCheckExecutionsTable
from episode_pipeline.defs.asset_keys import RAW_ARCHIVE_KEY
from episode_pipeline.defs.partitions import BATCHES_PARTITION_NAME, EPISODES_PARTITION_NAME
from episode_pipeline.instance.app_state import (
    DEAD_LETTER_REASON_PREFIX,
    EXPIRES_BY,
    UPLOAD_DONE_PREFIX,
    upload_done_key,
    upload_record,
)
from episode_pipeline.instance.run_tags import CAMPAIGN_TAG, IN_FLIGHT_STATUSES, UPLOAD_TAG

RAW_ARCHIVE_ASSET_KEY = RAW_ARCHIVE_KEY.to_string()  # as the event log stores it: '["raw_archive"]'
ASSET_EVENTS = (
    DagsterEventType.ASSET_MATERIALIZATION.value,
    DagsterEventType.ASSET_OBSERVATION.value,
)


def connect(instance: DagsterInstance) -> Any:
    """A connection to the database holding both the run and the event-log storage."""
    storage = instance.run_storage
    if not isinstance(storage, PostgresRunStorage):  # ours is pooled (instance/storage.py)
        raise RuntimeError(
            f"retention needs Dagster's PostgreSQL storage (dagster-postgres), not "
            f"{type(storage).__name__}: the pruning statements are PostgreSQL's"
        )
    return storage.connect()  # type: ignore[attr-defined]


def _in_flight() -> list[str]:
    return [status.value for status in IN_FLIGHT_STATUSES]


# -- retention: which episodes have settled -----------------------------------------------------

_CANDIDATES = sa.text(
    """
    SELECT partition,
           (array_agg(status ORDER BY id DESC))[1] AS latest_status,
           max(coalesce(end_time, extract(epoch FROM update_timestamp))) AS last_ended,
           extract(epoch FROM max(create_timestamp)) AS latest_created
      FROM runs
     WHERE partition IS NOT NULL
     GROUP BY partition
    HAVING NOT bool_or(status = ANY(:in_flight))
       AND max(coalesce(end_time, extract(epoch FROM update_timestamp))) <
           CASE WHEN (array_agg(status ORDER BY id DESC))[1] = :success
                THEN :succeeded_cutoff ELSE :failed_cutoff END
     ORDER BY last_ended
     LIMIT :limit
    """
)
# Reported uploads only (run_id ''): a run logs an observation of the bytes it reads when none
# was reported (a reprocessed or campaign run of a pruned episode), after its own creation; that
# one is no upload waiting, and would keep the episode for ever.
_NEWEST_OBSERVATIONS = sa.text(
    """
    SELECT partition, extract(epoch FROM max(timestamp))
      FROM event_logs
     WHERE asset_key = :asset_key AND dagster_event_type = :observation
       AND partition = ANY(:partitions) AND run_id = ''
     GROUP BY partition
    """
)
# Per partition: any run in flight; the newest status and end among the runs that are not the
# campaign's; the newest run's creation (all runs: a reported upload after it waits).
_CAMPAIGN_EPISODES = sa.text(
    """
    SELECT r.partition,
           bool_or(r.status = ANY(:in_flight)),
           (array_agg(r.status ORDER BY r.id DESC) FILTER (WHERE t.run_id IS NULL))[1],
           max(coalesce(r.end_time, extract(epoch FROM r.update_timestamp)))
               FILTER (WHERE t.run_id IS NULL),
           extract(epoch FROM max(r.create_timestamp))
      FROM runs r
      LEFT JOIN run_tags t
        ON t.run_id = r.run_id AND t.key = :campaign_tag AND t.value = :campaign
     WHERE r.partition = ANY(:partitions)
     GROUP BY r.partition
    """
)


def settled_partitions(
    conn: Any, succeeded_cutoff: float, failed_cutoff: float, limit: int
) -> list[tuple[str, str, float, float]]:
    """The oldest partitions with no run in flight whose latest run ended before its cutoff
    (the succeeded one when that run succeeded): (partition, latest status, last ended, latest
    created), oldest end first."""
    return conn.execute(
        _CANDIDATES,
        {
            "in_flight": _in_flight(),
            "success": DagsterRunStatus.SUCCESS.value,
            "succeeded_cutoff": succeeded_cutoff,
            "failed_cutoff": failed_cutoff,
            "limit": limit,
        },
    ).fetchall()


def newest_observations(conn: Any, partitions: list[str]) -> dict[str, Any]:
    """Partition → the epoch seconds of its newest reported upload's observation, where one is."""
    return dict(
        conn.execute(
            _NEWEST_OBSERVATIONS,
            {
                "asset_key": RAW_ARCHIVE_ASSET_KEY,
                "observation": DagsterEventType.ASSET_OBSERVATION.value,
                "partitions": partitions,
            },
        ).fetchall()
    )


def campaign_partition_runs(
    conn: Any, campaign_id: str, partitions: Sequence[str]
) -> dict[str, tuple[bool, str | None, float | None, float | None]]:
    """Partition → (a run in flight, the newest status and end among runs not the campaign's,
    the newest run's creation), for the partitions that have runs."""
    return {
        partition: (bool(in_flight), status, ended, created)
        for partition, in_flight, status, ended, created in conn.execute(
            _CAMPAIGN_EPISODES,
            {
                "partitions": list(partitions),
                "in_flight": _in_flight(),
                "campaign_tag": CAMPAIGN_TAG,
                "campaign": campaign_id,
            },
        ).fetchall()
    }


# -- retention: the deletes ---------------------------------------------------------------------

_RUNS_OF = sa.text(
    "SELECT run_id FROM runs WHERE partition = ANY(:partitions) AND NOT (status = ANY(:in_flight))"
)
_SUCCEEDED_UPLOADS = sa.text(
    """
    SELECT t.value, r.run_id, coalesce(r.end_time, extract(epoch FROM r.update_timestamp))
      FROM run_tags t JOIN runs r ON r.run_id = t.run_id
     WHERE t.key = :upload_tag AND t.run_id = ANY(:run_ids) AND r.status = :success
    """
)
_KEEP_UPLOAD_RECORDS = sa.text(
    "INSERT INTO kvs (key, value) VALUES (:key, :value)"
    " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
)
# Child rows first, the runs last, the partition only if no run of it appeared meanwhile: a pass
# cut short is finished by the next one.
_DELETES = (
    (
        "asset_event_tags",
        "DELETE FROM asset_event_tags WHERE event_id IN (SELECT id FROM event_logs"
        " WHERE run_id = ANY(:run_ids) AND dagster_event_type = ANY(:asset_events))",
    ),
    (
        "asset_event_tags",
        "DELETE FROM asset_event_tags WHERE event_id IN (SELECT id FROM event_logs"
        " WHERE run_id = '' AND asset_key = :asset_key AND partition = ANY(:partitions))",
    ),
    ("event_logs", "DELETE FROM event_logs WHERE run_id = ANY(:run_ids)"),
    (
        "event_logs",
        "DELETE FROM event_logs WHERE run_id = '' AND asset_key = :asset_key"
        " AND dagster_event_type = ANY(:asset_events) AND partition = ANY(:partitions)",
    ),
    ("check_executions", "DELETE FROM asset_check_executions WHERE run_id = ANY(:run_ids)"),
    ("run_tags", "DELETE FROM run_tags WHERE run_id = ANY(:run_ids)"),
    ("runs", "DELETE FROM runs WHERE run_id = ANY(:run_ids)"),
    (
        "partitions",
        "DELETE FROM dynamic_partitions d WHERE partitions_def_name = ANY(:partitions_defs)"
        " AND partition = ANY(:partitions)"
        " AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.partition = d.partition)",
    ),
)


def delete_episodes(conn: Any, partitions: Sequence[str]) -> dict[str, int]:
    """Delete the finished runs of these partitions, their events and the partitions; first
    keep the record of each upload they succeeded for. Returns rows deleted by kind."""
    params: dict[str, Any] = {
        "partitions": list(partitions),
        "in_flight": _in_flight(),
        "asset_key": RAW_ARCHIVE_ASSET_KEY,
        "asset_events": list(ASSET_EVENTS),
        # An episode's ORG/EP never equals a batch key (no '/'): one statement prunes both.
        "partitions_defs": [EPISODES_PARTITION_NAME, BATCHES_PARTITION_NAME],
        "upload_tag": UPLOAD_TAG,
        "success": DagsterRunStatus.SUCCESS.value,
    }
    params["run_ids"] = [row[0] for row in conn.execute(_RUNS_OF, params).fetchall()]
    counts = {"runs": 0, "upload_records_kept": 0}
    records = {
        upload_done_key(upload): upload_record(run_id, float(ended))
        for upload, run_id, ended in conn.execute(_SUCCEEDED_UPLOADS, params).fetchall()
    }
    if records:
        conn.execute(
            _KEEP_UPLOAD_RECORDS,
            [{"key": key, "value": value} for key, value in records.items()],
        )
        counts["upload_records_kept"] = len(records)
    for kind, statement in _DELETES:
        deleted = conn.execute(sa.text(statement), params).rowcount
        counts[kind] = counts.get(kind, 0) + max(deleted, 0)
    return counts


_LIVE_PARTITIONS = sa.text(
    "SELECT count(*) FROM dynamic_partitions WHERE partitions_def_name = :partitions_def"
)
# A record of `app_state.EXPIRES_BY`'s, by the epoch seconds its value holds in `:field`.
_EXPIRE_RECORDS = sa.text(
    "DELETE FROM kvs WHERE key LIKE :prefix AND (value::json ->> :field)::float < :cutoff"
)


def live_episode_partitions(conn: Any) -> int:
    """The episode partitions Dagster holds (idx_dynamic_partitions)."""
    return int(
        conn.execute(_LIVE_PARTITIONS, {"partitions_def": EPISODES_PARTITION_NAME}).scalar() or 0
    )


def _expire(conn: Any, prefix: str, cutoff: float) -> int:
    params = {"prefix": prefix + "%", "field": EXPIRES_BY[prefix], "cutoff": cutoff}
    return int(conn.execute(_EXPIRE_RECORDS, params).rowcount)


def expire_upload_records(conn: Any, cutoff: float) -> int:
    """Delete the upload-done records of successes that ended before `cutoff`; how many."""
    return _expire(conn, UPLOAD_DONE_PREFIX, cutoff)


def expire_dead_letter_reasons(conn: Any, cutoff: float) -> int:
    """Delete the uploads sensor's reasons for leaving a message, left before `cutoff`."""
    return _expire(conn, DEAD_LETTER_REASON_PREFIX, cutoff)


# -- the event log: an episode's check executions -----------------------------------------------


def check_executions(
    instance: DagsterInstance,
    check_keys: Sequence[AssetCheckKey],
    run_ids: Sequence[str],
    partition_key: str,
) -> list[Mapping[str, Any]]:
    """The rows of `asset_check_executions` of these checks in these runs for this partition,
    newest first: by run id, which the table's unique index holds after the asset key and check
    name."""
    table = AssetCheckExecutionsTable
    query = (
        sa.select(
            table.c.id,
            table.c.asset_key,
            table.c.check_name,
            table.c.run_id,
            table.c.execution_status,
            table.c.evaluation_event,
            table.c.create_timestamp,
            table.c.partition,
        )
        .where(
            table.c.asset_key.in_({key.asset_key.to_string() for key in check_keys}),
            table.c.check_name.in_({key.name for key in check_keys}),
            table.c.run_id.in_(run_ids),
            table.c.partition == partition_key,
        )
        .order_by(table.c.id.desc())
    )
    with instance.event_log_storage.index_connection() as connection:  # type: ignore[attr-defined]
        return list(connection.execute(query).mappings())
