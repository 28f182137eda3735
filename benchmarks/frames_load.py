"""Stage `frames_load`: frame rows into PostgreSQL against the machine's limit and the old way.

Ours: ``PostgresPolarsIOManager.replace("frames", rows, "episode_id", ep)`` — one transaction:
advisory lock, DELETE the episode's rows, COPY … FROM STDIN of text written column-wise by polars.
Limit: the server's own ``COPY frames … FROM '<file>'`` of a file holding the same rows in the
same format, in the same transaction shape (DELETE first): what this schema costs the server
with no client at all (jsonb parsing and the index are the bound). Old way: what the replaced
worker did ("Rows are inserted into frames in batches of 1,000"), made as fair as possible: the
same transaction and DELETE, parameterised multi-row ``INSERT … VALUES`` of 1,000 rows, on the
first `old_rows` (10,000) of the rows: its rows/s is the same for any count of whole batches, and
the whole 100,000 took 45 s a width.

All three load the same pre-converted rows (conversion is the `frame_conversion` stage), into the
same table with its FK, index and unique constraint; after each one's first timed load an md5
over every stored row must be identical. A *fresh* load goes into an emptied, vacuumed episode;
a *replace* first has the episode's rows in place (DELETE then deletes them). Both vector widths
are measured: 6 floats (an SO-101 arm) and 50 (a humanoid), where jsonb parsing dominates.

Memory: a child process streams a long episode's parquet (`stream_rows`, 1,000,000 by default)
into the IO manager as the `frames` asset does (``file_batches`` of episodes/frame_rows.py in
``RowBatches``); its peak RSS is compared with the
same rows held whole (one DataFrame, as a non-streaming asset would; run once,
``WHOLE_REPEATS``) and with a short episode (flat means the long one needs no more than the
short one). The rows go into an unlogged copy
of the table with text columns: the client's memory does not depend on what the server does with
them, and jsonb parsing (measured above) would make these loads cost minutes.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import polars as pl

from benchmarks.common import (
    BenchContext,
    Result,
    median,
    peak_rss_self,
    rate_result,
    run_child,
    timed,
    write_data_parquet,
)
from episode_pipeline.db.partition_tables import RowBatches, copy_chunks
from episode_pipeline.defs.assets.frames import frames_metadata
from episode_pipeline.defs.io_managers.postgres_tables import PostgresPolarsIOManager
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.episodes.frame_rows import FramesRead, file_batches
from episode_pipeline.lerobot.frames import FRAME_COLUMNS, FRAMES_SCHEMA, frames_table

NAME = "frames_load"
INSERT_BATCH_ROWS = 1_000
COLUMNS = (*FRAME_COLUMNS, "episode_id")  # the order ours sends them (partition column last)
_JSON_COLUMNS = {"observation", "action"}
MiB = 1 << 20
LIMIT = "limit: the server's own COPY … FROM a file of the same rows"
OLD = "old: 1,000-row INSERT … VALUES batches"


# -- the three ways ------------------------------------------------------------------------------


def _insert_sql(rows: int) -> str:
    cell = ", ".join("%s::jsonb" if name in _JSON_COLUMNS else "%s" for name in COLUMNS)
    values = ", ".join([f"({cell})"] * rows)
    return f"INSERT INTO frames ({', '.join(COLUMNS)}) VALUES {values}"


def insert_batches(postgres: PostgresResource, episode_id: str, frame: pl.DataFrame) -> int:
    """The old worker's way: DELETE, then 1,000-row INSERT … VALUES batches, one transaction."""
    full_sql = _insert_sql(INSERT_BATCH_ROWS)
    written = 0
    with postgres.transaction() as conn, conn.cursor() as cur:
        cur.execute("DELETE FROM frames WHERE episode_id = %s", (episode_id,))
        batch: list[Any] = []
        for row in frame.select(FRAME_COLUMNS).iter_rows():
            batch.extend((*row, episode_id))
            if len(batch) == INSERT_BATCH_ROWS * len(COLUMNS):
                cur.execute(full_sql, batch)
                written += INSERT_BATCH_ROWS
                batch = []
        if batch:
            rows = len(batch) // len(COLUMNS)
            cur.execute(_insert_sql(rows), batch)
            written += rows
    return written


def write_limit_file(frame: pl.DataFrame, episode_id: str, path: Path) -> Path:
    """The rows exactly as ours sends them, in a file the server process can read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        for chunk in copy_chunks(frame.with_columns(pl.lit(episode_id).alias("episode_id"))):
            handle.write(chunk)
    # The server runs as its own OS user: it needs to read the file and reach its folders.
    for folder in [path.parent, *path.parent.parents]:
        mode = os.stat(folder).st_mode
        if not mode & 0o001:
            os.chmod(folder, mode | 0o711)
    os.chmod(path, 0o644)
    return path


def server_copy(postgres: PostgresResource, episode_id: str, path: Path) -> None:
    """The limit: DELETE + the server reading the rows from its own file system."""
    with postgres.transaction() as conn:
        conn.execute("DELETE FROM frames WHERE episode_id = %s", (episode_id,))
        conn.execute(f"COPY frames ({', '.join(COLUMNS)}) FROM '{path}'")


# -- helpers -------------------------------------------------------------------------------------


def _fingerprint(postgres: PostgresResource, episode_id: str) -> tuple[int, str]:
    """Row count and an md5 over every row's values, to prove each way stored the same rows."""
    with postgres.connect() as conn:
        row = conn.execute(
            "SELECT count(*), md5(string_agg(concat_ws('|', frame_order, lerobot_episode_index, "
            "frame_index, timestamp_ms, observation::text, action::text), ',' "
            "ORDER BY frame_order)) FROM frames WHERE episode_id = %s",
            (episode_id,),
        ).fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


def _settle(postgres: PostgresResource, episode_id: str, *, keep_rows: bool) -> None:
    """Untimed: empty the episode (or not) and VACUUM, so every timed load starts alike."""
    with postgres.connect(autocommit=True) as conn:
        if not keep_rows:
            conn.execute("DELETE FROM frames WHERE episode_id = %s", (episode_id,))
        conn.execute("VACUUM frames")


@contextmanager
def bench_episode(postgres: PostgresResource, facts: dict[str, Any] | None = None) -> Iterator[str]:
    """An `episodes` row for the duration (frames has an FK); deleting it drops its frames."""
    episode_id = f"bench-{uuid.uuid4().hex[:8]}"
    with postgres.transaction() as conn:
        conn.execute("INSERT INTO episodes (id, org_id) VALUES (%s, 'bench')", (episode_id,))
        if facts is not None:
            facts["postgres"] = conn.execute("SHOW server_version").fetchone()[0]
    try:
        yield episode_id
    finally:
        with postgres.transaction() as conn:
            conn.execute("DELETE FROM episodes WHERE id = %s", (episode_id,))


# -- throughput ----------------------------------------------------------------------------------


def measure_width(ctx: BenchContext, state_dim: int, rows: int) -> list[Result]:
    """Fresh load (ours, limit, old) and replace (ours, limit) for one vector width."""
    postgres: PostgresResource = ctx.database()
    manager = PostgresPolarsIOManager(postgres=postgres)
    folder = ctx.workdir / "frames-load"
    path = write_data_parquet(folder / f"state{state_dim}.parquet", rows, state_dim)
    frame = frames_table(path, path=str(path))
    old_frame = frame.head(ctx.config.old_rows)  # INSERTs' rows/s do not depend on the count
    with bench_episode(postgres, ctx.facts) as episode_id:
        limit_file = write_limit_file(frame, episode_id, folder / f"state{state_dim}.copy")
        ways: dict[str, Callable[[], Any]] = {
            "ours": lambda: manager.replace("frames", frame, "episode_id", episode_id),
            "limit": lambda: server_copy(postgres, episode_id, limit_file),
            "old": lambda: insert_batches(postgres, episode_id, old_frame),
        }
        # Correctness first: each way stores exactly the rows ours stores.
        manager.replace("frames", old_frame, "episode_id", episode_id)
        prints = {"ours, old's rows": _fingerprint(postgres, episode_id)}
        fresh: dict[str, list[float]] = {name: [] for name in ways}
        replace: dict[str, list[float]] = {"ours": [], "limit": []}
        for repeat in range(ctx.config.repeats):
            for name, load in ways.items():
                _settle(postgres, episode_id, keep_rows=False)
                fresh[name].append(timed(load))
                if repeat == 0:
                    prints[name] = _fingerprint(postgres, episode_id)
            if (
                prints["ours"] != prints["limit"]
                or prints["old"] != prints["ours, old's rows"]
                or prints["ours"][0] != frame.height
            ):
                raise AssertionError(f"{NAME}: the ways stored different rows: {prints}")
            for name in replace:
                _settle(postgres, episode_id, keep_rows=True)
                replace[name].append(timed(ways[name]))
    details = {
        "rows": frame.height,
        "state_dim": state_dim,
        "copy_text_bytes": limit_file.stat().st_size,
        "same_rows_md5": prints["ours"][1],
    }
    metric = f"rows_per_second_{state_dim}_floats"
    return [
        rate_result(
            NAME, metric, frame.height, "rows/s", fresh["ours"], fresh["limit"],
            baseline_name=LIMIT, details=details,
        ).expect_factor(0.9, "≥ 0.9x the limit"),
        rate_result(
            NAME, metric, frame.height, "rows/s", fresh["ours"], fresh["old"],
            baseline_name=OLD, details={**details, "old_rows": old_frame.height},
            baseline_amount=old_frame.height,
        ),
        rate_result(
            NAME, f"replace_{metric}", frame.height, "rows/s", replace["ours"], replace["limit"],
            baseline_name=LIMIT + " (DELETE of the old rows first, as ours)", details=details,
        ),
    ]  # fmt: skip


def copy_limit_seconds(stack: Any, archive: Path, scratch: Path) -> float:
    """The limit for an archive's frame rows: the server's own COPY of them from a file."""
    from episode_pipeline.archive.stream import ArchiveReader, spooled
    from episode_pipeline.config.settings import DatabaseSettings
    from episode_pipeline.lerobot.layout import MemberKind, member_kind

    postgres = PostgresResource.from_settings(DatabaseSettings.from_env(stack.env))
    frames: list[pl.DataFrame] = []
    with archive.open("rb") as raw:
        for member in ArchiveReader(raw, name=str(archive)):
            if member_kind(member.path) is MemberKind.DATA_PARQUET:
                with spooled(member, scratch) as path:
                    start = sum(f.height for f in frames)
                    frames.append(frames_table(path, path=member.path, frame_order_start=start))
    frame = pl.concat(frames)
    with bench_episode(postgres) as episode_id:
        limit_file = write_limit_file(frame, episode_id, scratch / "frames-limit.copy")
        return timed(lambda: server_copy(postgres, episode_id, limit_file))


# -- memory --------------------------------------------------------------------------------------


def child_memory(parquet: Path, table: str, mode: str) -> dict[str, Any]:
    """Load the parquet's frames into `table`, streamed or held whole; report peak RSS."""
    from episode_pipeline.config.settings import DatabaseSettings

    postgres = PostgresResource.from_settings(DatabaseSettings.from_env(os.environ))
    manager = PostgresPolarsIOManager(postgres=postgres)
    started = time.perf_counter()
    if mode == "stream":
        read = FramesRead(features=None)  # no info.json: each file's own columns, as the asset
        log = logging.getLogger(NAME)
        rows: pl.DataFrame | RowBatches = RowBatches(
            [file_batches(parquet, str(parquet), read, log)],
            FRAMES_SCHEMA,
            partial(frames_metadata, read),
        )
    else:
        rows = frames_table(parquet, path=str(parquet))
    written = manager.replace(table, rows, "episode_id", "bench-memory")
    return {
        "rows": written,
        "seconds": time.perf_counter() - started,
        "peak_rss_bytes": peak_rss_self(),
    }


@contextmanager
def sink_table(postgres: PostgresResource) -> Iterator[str]:
    """An unlogged table with the frames columns as plain text: the client's memory is the same
    whatever the server does with the rows, and jsonb parsing (measured above) would make the
    1,000,000-row loads cost minutes."""
    table = f"bench_frames_sink_{uuid.uuid4().hex[:8]}"
    columns = ", ".join(f"{name} text" for name in COLUMNS)
    with postgres.transaction() as conn:
        conn.execute(f"CREATE UNLOGGED TABLE {table} ({columns})")
    try:
        yield table
    finally:
        with postgres.transaction() as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")


# Holding the rows whole is a reference, not a target: twice the streamed peak, a gap no run's
# noise could close, so it runs once (its two more runs cost 14 s of `make bench`).
WHOLE_REPEATS = 1


def measure_memory(ctx: BenchContext) -> list[Result]:
    config = ctx.config
    postgres: PostgresResource = ctx.database()
    folder = ctx.workdir / "frames-memory"
    long_file = write_data_parquet(folder / "long.parquet", config.stream_rows, config.state_dim)
    short_file = write_data_parquet(folder / "short.parquet", config.rows, config.state_dim)
    env = {**os.environ, **ctx.stack().env}
    runs: dict[str, list[dict[str, Any]]] = {"stream": [], "whole": [], "short": []}
    with sink_table(postgres) as table:
        for repeat in range(config.memory_repeats):
            for kind, parquet, mode in (
                ("stream", long_file, "stream"),
                ("whole", long_file, "whole"),
                ("short", short_file, "stream"),
            ):
                if kind == "whole" and repeat >= WHOLE_REPEATS:
                    continue
                runs[kind].append(
                    run_child(
                        "benchmarks.frames_load", ["memory", str(parquet), table, mode],
                        env=env,
                    )
                )  # fmt: skip
    peak = {kind: [r["peak_rss_bytes"] / MiB for r in found] for kind, found in runs.items()}
    details = {
        "long_rows": config.stream_rows,
        "short_rows": config.rows,
        "state_dim": config.state_dim,
        "long_stream_seconds": [round(r["seconds"], 2) for r in runs["stream"]],
        "ours": "the frames asset's file_batches → RowBatches → COPY into an unlogged text copy "
        "of frames, in a child process (VmHWM)",
    }

    def result(baseline: str, name: str) -> Result:
        return Result(
            stage=NAME,
            metric="peak_rss_long_episode",
            ours=round(median(peak["stream"]), 1),
            baseline=round(median(peak[baseline]), 1),
            unit="MiB",
            better="lower",
            repeats=min(len(peak["stream"]), len(peak[baseline])),
            details=details,
            baseline_name=name,
            ours_samples=[round(v, 1) for v in peak["stream"]],
            baseline_samples=[round(v, 1) for v in peak[baseline]],
        )

    return [
        result("whole", f"the same {config.stream_rows:,} rows held whole (one DataFrame)"),
        result("short", f"a {config.rows:,}-row episode streamed the same way").expect_factor(
            0.9, "flat: ≤ 1.1x the short episode's peak"
        ),
    ]


def run(ctx: BenchContext) -> list[Result]:
    config = ctx.config
    with ctx.phase(f"{config.state_dim} floats"):
        narrow = measure_width(ctx, config.state_dim, config.rows)
    with ctx.phase(f"{config.wide_state_dim} floats"):
        wide = measure_width(ctx, config.wide_state_dim, config.wide_rows)
    with ctx.phase("memory"):
        memory = measure_memory(ctx)
    return [*narrow, *wide, *memory]


def main(argv: list[str]) -> None:
    """Child entry point: `python -m benchmarks.frames_load memory PARQUET TABLE MODE`."""
    _, parquet, table, mode = argv
    print(json.dumps(child_memory(Path(parquet), table, mode)))


if __name__ == "__main__":
    main(sys.argv[1:])
