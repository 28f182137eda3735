"""The `episode_batches` table: which episodes a batch run processes, in order.

Each function takes an open psycopg connection; the caller owns the transaction (the campaign
driver creates a wave's batches in the transaction that claims its episodes).
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from episode_pipeline.episodes.batches import parse_batch_key
from episode_pipeline.episodes.keys import EpisodeRef


class BatchConflict(ValueError):
    """A batch key already names other episodes: a batch, once made, never changes."""


def create_batch(conn: psycopg.Connection, batch_key: str, refs: Sequence[EpisodeRef]) -> None:
    """Record the batch's episodes in order. Creating the same batch again is a no-op (a driver
    repairing its last tick); the same key with other episodes is a BatchConflict."""
    parse_batch_key(batch_key)
    if not refs:
        raise ValueError(f"batch {batch_key}: a batch needs at least one episode")
    if len(set(refs)) != len(refs):
        raise ValueError(f"batch {batch_key}: an episode appears more than once")
    with conn.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO episode_batches (batch_key, position, org_id, episode_id)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
            [
                (batch_key, position, ref.org_id, ref.episode_id)
                for position, ref in enumerate(refs)
            ],
        )
    stored = batch_episodes(conn, batch_key)
    if stored != list(refs):
        raise BatchConflict(
            f"batch {batch_key} already holds {len(stored)} other episode(s) "
            f"({', '.join(map(str, stored[:3]))}{'…' if len(stored) > 3 else ''})"
        )


def batch_episodes(conn: psycopg.Connection, batch_key: str) -> list[EpisodeRef]:
    """The batch's episodes in order ([] when the key names no batch)."""
    rows = conn.execute(
        "SELECT org_id, episode_id FROM episode_batches WHERE batch_key = %s ORDER BY position",
        (batch_key,),
    ).fetchall()
    return [EpisodeRef(org_id, episode_id) for org_id, episode_id in rows]
