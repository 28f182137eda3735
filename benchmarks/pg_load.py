"""Stage `pg_load`: frame rows into PostgreSQL, COPY vs the old worker's 1,000-row INSERT batches.

Ours: ``PostgresPolarsIOManager.replace("frames", frame, "episode_id", ep)`` — one transaction:
advisory lock, DELETE the episode's rows, COPY the frame as CSV written column-wise by polars.
Baseline: what the replaced worker did ("Rows are inserted into frames in batches of
1,000"), made as fair as possible — the same transaction scope and DELETE, parameterised
multi-row ``INSERT … VALUES`` of 1,000 rows at a time, over the same pre-converted rows (the JSON
text is already built, so only the load is compared; conversion is the `frame_conversion`
stage). Both open a fresh connection per call, as a run does, and replace the same episode.
"""

from __future__ import annotations

import uuid
from typing import Any

import polars as pl

from benchmarks.common import (
    BenchContext,
    Result,
    median_of,
    rows_per_second_result,
    timed,
    write_data_parquet,
)
from episode_pipeline.defs.io_managers.postgres_tables import PostgresPolarsIOManager
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.lerobot.frames import FRAME_COLUMNS, frames_table

NAME = "pg_load"
BATCH_ROWS = 1_000
COLUMNS = ("episode_id", *FRAME_COLUMNS)
_JSON_COLUMNS = {"observation", "action"}


def _insert_sql(rows: int) -> str:
    cell = ", ".join("%s::jsonb" if name in _JSON_COLUMNS else "%s" for name in COLUMNS)
    values = ", ".join([f"({cell})"] * rows)
    return f"INSERT INTO frames ({', '.join(COLUMNS)}) VALUES {values}"


def insert_batches(postgres: PostgresResource, episode_id: str, frame: pl.DataFrame) -> int:
    """The old worker's way: DELETE, then 1,000-row INSERT … VALUES batches, one transaction."""
    full_sql = _insert_sql(BATCH_ROWS)
    written = 0
    with postgres.transaction() as conn, conn.cursor() as cur:
        cur.execute("DELETE FROM frames WHERE episode_id = %s", (episode_id,))
        batch: list[Any] = []
        for row in frame.iter_rows():
            batch.extend((episode_id, *row))
            if len(batch) == BATCH_ROWS * len(COLUMNS):
                cur.execute(full_sql, batch)
                written += BATCH_ROWS
                batch = []
        if batch:
            rows = len(batch) // len(COLUMNS)
            cur.execute(_insert_sql(rows), batch)
            written += rows
    return written


def _fingerprint(postgres: PostgresResource, episode_id: str) -> tuple[int, str]:
    """Row count and an md5 over every row's values, to prove both ways stored the same rows."""
    with postgres.connect() as conn:
        row = conn.execute(
            "SELECT count(*), md5(string_agg(concat_ws('|', frame_order, lerobot_episode_index, "
            "frame_index, timestamp_ms, observation::text, action::text), ',' "
            "ORDER BY frame_order)) FROM frames WHERE episode_id = %s",
            (episode_id,),
        ).fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


def run(ctx: BenchContext) -> list[Result]:
    config = ctx.config
    postgres: PostgresResource = ctx.database()
    manager = PostgresPolarsIOManager(postgres=postgres)
    path = write_data_parquet(
        ctx.workdir / "pg" / "file-000.parquet", config.rows, config.state_dim
    )
    frame = frames_table(path, path=str(path))
    episode_id = f"bench-{uuid.uuid4().hex[:8]}"
    with postgres.transaction() as conn:
        conn.execute("INSERT INTO episodes (id, org_id) VALUES (%s, 'bench')", (episode_id,))
        ctx.facts["postgres"] = conn.execute("SHOW server_version").fetchone()[0]
    try:
        # Correctness first (and a warm-up for both paths): the same rows either way.
        manager.replace("frames", frame, "episode_id", episode_id)
        ours_print = _fingerprint(postgres, episode_id)
        insert_batches(postgres, episode_id, frame)
        base_print = _fingerprint(postgres, episode_id)
        if ours_print != base_print or ours_print[0] != frame.height:
            raise AssertionError(
                f"{NAME}: COPY stored {ours_print}, INSERT batches stored {base_print} "
                f"for {frame.height} rows"
            )
        ours_s, base_s = median_of(
            config.repeats,
            lambda: timed(lambda: manager.replace("frames", frame, "episode_id", episode_id)),
            lambda: timed(lambda: insert_batches(postgres, episode_id, frame)),
        )
    finally:
        with postgres.transaction() as conn:
            conn.execute("DELETE FROM episodes WHERE id = %s", (episode_id,))  # cascades
    details = {
        "state_dim": config.state_dim,
        "ours": "PostgresPolarsIOManager.replace: DELETE + COPY (CSV), one transaction",
        "baseline": f"DELETE + INSERT … VALUES in batches of {BATCH_ROWS}, one transaction",
        "same_rows_md5": ours_print[1],
    }
    return [
        rows_per_second_result(
            NAME, frame.height, ours_s, base_s, repeats=config.repeats, details=details
        )
    ]
