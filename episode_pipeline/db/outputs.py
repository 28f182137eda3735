"""`episode_outputs`: what produced each episode, outliving Dagster's retention (migration 004).

One row per episode, replaced at each processing in the transaction that marks it `processed`:
the assets' code versions (and their digest), the figures a campaign's canary compares, the
run and its wall time (what `campaign plan` estimates from).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from episode_pipeline.episodes.code_versions import code_version_digest
from episode_pipeline.episodes.keys import EpisodeRef

OUTPUTS_TABLE = "episode_outputs"


def has_outputs_table(conn: psycopg.Connection) -> bool:
    """The table is the pipeline's own: a database without migration 004 records nothing."""
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (OUTPUTS_TABLE,)).fetchone()
    return bool(row and row[0])


def record_output(
    conn: psycopg.Connection,
    ref: EpisodeRef,
    code_versions: Mapping[str, str],
    figures: Mapping[str, Any],
    *,
    run_id: str | None,
    wall_seconds: float | None,
    archive_bytes: int | None,
) -> str:
    """Replace the episode's record; returns the code versions' digest."""
    digest = code_version_digest(code_versions)
    conn.execute(
        """
        INSERT INTO episode_outputs AS o (org_id, episode_id, code_versions, code_version,
                                          figures, run_id, wall_seconds, archive_bytes)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
        ON CONFLICT (org_id, episode_id) DO UPDATE
           SET code_versions = EXCLUDED.code_versions, code_version = EXCLUDED.code_version,
               figures = EXCLUDED.figures, run_id = EXCLUDED.run_id,
               wall_seconds = EXCLUDED.wall_seconds, archive_bytes = EXCLUDED.archive_bytes,
               processed_at = now()
        """,
        (
            ref.org_id,
            ref.episode_id,
            Jsonb(dict(code_versions)),
            digest,
            Jsonb(dict(figures)),
            run_id,
            wall_seconds,
            archive_bytes,
        ),
    )
    return digest


def output_record(conn: psycopg.Connection, ref: EpisodeRef) -> dict[str, Any] | None:
    row = conn.execute(
        "SELECT code_versions, code_version, figures, run_id, wall_seconds, archive_bytes,"
        " processed_at FROM episode_outputs WHERE org_id = %s AND episode_id = %s",
        (ref.org_id, ref.episode_id),
    ).fetchone()
    if row is None:
        return None
    names = ("code_versions", "code_version", "figures", "run_id", "wall_seconds")
    return dict(zip((*names, "archive_bytes", "processed_at"), row, strict=True))


def measured_run_seconds(conn: psycopg.Connection, limit: int = 1000) -> tuple[float | None, int]:
    """The median run wall time over the newest records, and how many it is over."""
    row = conn.execute(
        """
        SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY wall_seconds), count(*)
          FROM (SELECT wall_seconds FROM episode_outputs WHERE wall_seconds IS NOT NULL
                 ORDER BY processed_at DESC LIMIT %s) newest
        """,
        (limit,),
    ).fetchone()
    if row is None or not row[1]:
        return None, 0
    return float(row[0]), int(row[1])
