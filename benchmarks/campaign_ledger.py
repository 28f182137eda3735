"""Stage `campaign_ledger`: what the campaign driver's reads of its ledger cost per tick, at each
of `ledger_sizes` rows (100,000 and 1,000,000), with migration 006's indexes and without them.

A campaign of N rows is written straight into the stack's `campaign_episodes` (the state a
campaign reaches a third of the way: a third succeeded, its live budget of 500 added partitions
— 200 succeeded, to prune, and 300 requested — 1 % failed and waiting, the rest pending). Each
figure is one statement of the driver's tick (`db/campaigns.py`), timed in a transaction that is
rolled back, so every repeat reads the same state:

- `claim`: a wave's claim (`claim_wave`'s SELECT, 500 rows, `FOR UPDATE SKIP LOCKED`);
- `claimable`: the claimable rows counted up to a wave, against the old unbounded count;
- `live_added`: the campaign's live partitions (`live_added_partitions`);
- `settled_added`: the added partitions to prune (`settled_added_partitions`, 2,000);
- `forget`: 200 pruned partitions forgotten by key, against the old `org || '/' || episode`
  match (a scan of the campaign's rows per partition);
- `state_counts`: the per-state counts the tick reports: **not** bounded (an index-only scan
  of the campaign's rows), its growth from the first size to the next is its figure.

The baseline is the same statement with migration 006's two indexes dropped inside the
transaction (PostgreSQL's DDL is transactional: the rollback restores them).
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from benchmarks.common import BenchContext, Result, median_of, seconds_result

NAME = "campaign_ledger"
WAVE = 500
PRUNE = 2_000
FORGET = 200
LIVE_SUCCEEDED, LIVE_REQUESTED = 200, 300
INDEXES_006 = ("campaign_episodes_claim_order_idx", "campaign_episodes_added_idx")
OLD_CLAIMABLE_COUNT = (
    "SELECT count(*) FROM campaign_episodes WHERE campaign_id = %s AND (state = 'pending'"
    " OR (state = 'failed' AND (retry_after IS NULL OR retry_after <= %s)))"
)
OLD_FORGET = (
    "UPDATE campaign_episodes SET partition_added = false"
    " WHERE campaign_id = %s AND org_id || '/' || episode_id = %s"
)


def write_campaign(conn: Any, campaign_id: str, rows: int) -> None:
    """N rows in a third-of-the-way state (see the module), positions in selection order."""
    conn.execute(
        "INSERT INTO campaigns (id, name, selection, target_code_version, state, settings,"
        " governor) VALUES (%s, 'bench', '{}', 'v2', 'running', '{}', '{\"limit\": 8}')",
        (campaign_id,),
    )
    done = rows // 3
    conn.execute(
        """
        INSERT INTO campaign_episodes
            (campaign_id, org_id, episode_id, position, state, attempts, retry_after,
             partition_added, wave)
        SELECT %(id)s, 'bench-org-' || (i %% 50), 'bench-ep-' || i, i,
               CASE WHEN i < %(done)s THEN 'succeeded'
                    WHEN i < %(done)s + %(live_requested)s THEN 'requested'
                    WHEN i %% 100 = 7 THEN 'failed'
                    ELSE 'pending' END,
               CASE WHEN i %% 100 = 7 AND i >= %(done)s + %(live_requested)s THEN 1 ELSE 0 END,
               CASE WHEN i %% 100 = 7 THEN now() + interval '1 hour' END,
               i >= %(done)s - %(live_succeeded)s AND i < %(done)s + %(live_requested)s,
               CASE WHEN i < %(done)s + %(live_requested)s THEN i / 500 END
          FROM generate_series(0, %(rows)s - 1) AS i
        """,
        {
            "id": campaign_id,
            "done": done,
            "rows": rows,
            "live_requested": LIVE_REQUESTED,
            "live_succeeded": LIVE_SUCCEEDED,
        },
    )
    conn.execute("ANALYZE campaign_episodes")


def timed(database: Any, statement: Callable[[Any], object], *, drop_006: bool) -> float:
    """One statement's seconds in a transaction rolled back (006's indexes dropped first when
    asked: the baseline)."""
    with database.connect() as conn, conn.transaction(force_rollback=True):
        if drop_006:
            for index in INDEXES_006:
                conn.execute(f"DROP INDEX {index}")
        started = time.perf_counter()
        statement(conn)
        return time.perf_counter() - started


def statements(campaign_id: str, rows: int) -> dict[str, tuple[Callable, Callable]]:
    """figure → (ours, the baseline's statement); both run on each side's indexes."""
    from episode_pipeline.db import campaigns as db
    from episode_pipeline.episodes.keys import EpisodeRef

    now = datetime.now(UTC)
    done = rows // 3
    pruned = [
        EpisodeRef(f"bench-org-{i % 50}", f"bench-ep-{i}")
        for i in range(done - LIVE_SUCCEEDED, done - LIVE_SUCCEEDED + FORGET)
    ]

    def claim(conn: Any) -> None:
        assert len(db.claim_wave(conn, campaign_id, 10_000, WAVE, 1, now)) == WAVE

    def old_forget(conn: Any) -> None:
        conn.cursor().executemany(OLD_FORGET, [(campaign_id, ref.partition_key) for ref in pruned])

    return {
        "claim": (claim, claim),
        "claimable": (
            lambda conn: db.claimable_count(conn, campaign_id, now, WAVE),
            lambda conn: conn.execute(OLD_CLAIMABLE_COUNT, (campaign_id, now)).fetchone(),
        ),
        "live_added": (
            lambda conn: db.live_added_partitions(conn, campaign_id),
            lambda conn: db.live_added_partitions(conn, campaign_id),
        ),
        "settled_added": (
            lambda conn: db.settled_added_partitions(conn, campaign_id, PRUNE),
            lambda conn: db.settled_added_partitions(conn, campaign_id, PRUNE),
        ),
        "forget": (lambda conn: db.forget_partitions(conn, campaign_id, pruned), old_forget),
        "state_counts": (
            lambda conn: db.state_counts(conn, campaign_id),
            lambda conn: db.state_counts(conn, campaign_id),
        ),
    }


def run(ctx: BenchContext) -> list[Result]:
    database = ctx.database()
    sizes = [int(size) for size in ctx.config.ledger_sizes.split(",") if size.strip()]
    results: list[Result] = []
    counts_at: dict[int, list[float]] = {}
    for rows in sizes:
        campaign_id = f"bench-ledger-{uuid.uuid4().hex[:6]}"
        with ctx.phase(f"set-up: {rows:,} ledger rows"), database.transaction() as conn:
            write_campaign(conn, campaign_id, rows)
        try:
            for figure, (ours, baseline) in statements(campaign_id, rows).items():
                with ctx.phase(f"{figure} @{rows:,}"):
                    ours_s, base_s = median_of(
                        ctx.config.repeats,
                        lambda ours=ours: timed(database, ours, drop_006=False),
                        lambda baseline=baseline: timed(database, baseline, drop_006=True),
                    )
                if figure == "state_counts":
                    counts_at[rows] = ours_s
                    continue
                results.append(
                    seconds_result(
                        NAME, f"tick_{figure}@{rows:,}", ours_s, base_s,
                        baseline_name="the same read without migration 006's indexes"
                        + (" (the old statement)" if figure in ("claimable", "forget") else ""),
                        details={"rows": rows},
                    )
                )  # fmt: skip
        finally:
            with database.transaction() as conn:
                conn.execute("DELETE FROM campaigns WHERE id = %s", (campaign_id,))
    for smaller, larger in itertools.pairwise(sizes):
        results.append(
            seconds_result(
                NAME, f"tick_state_counts@{larger:,}", counts_at[larger], counts_at[smaller],
                baseline_name=f"the same at {smaller:,} rows (its growth: not bounded)",
                details={"rows": larger, "baseline_rows": smaller},
            )
        )  # fmt: skip
    return results
