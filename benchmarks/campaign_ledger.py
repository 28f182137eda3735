"""Stage `campaign_ledger`: every statement of the campaign driver's tick, at each of
`ledger_sizes` rows (100,000 and 1,000,000): flat, or growing with the campaign?

A campaign of each size is written straight into the stack's `campaign_episodes`, with each
episode's record in `episode_outputs` (the state a campaign reaches a third of the way: a third
succeeded and recorded under the target, a wave of 300 requested — 100 of them recorded since
their claim —, its live budget of 500 added partitions — 200 succeeded, to prune, and the 300
requested —, 1 % failed and waiting, the rest pending). Each figure is one statement of the tick
(`db/campaigns.py`, as `orchestration/campaigns.py` calls it each tick), timed in a
transaction that is rolled back, so every repeat reads the same state, every size and side
interleaved (the load of the shared machine changes during a run):

- reads: the requested rows and those the durable record settles (`requested_rows`,
  `recorded_since_claim`), anything requested (`has_requested`), the canary's wave
  (`canary_episodes`), the claimable rows up to a wave (`claimable_count`), the live and the
  settled added partitions (`live_added_partitions`, `settled_added_partitions`), the
  per-state counts (`fold_counts`, the driver's; `state_counts`, `campaign status`'s);
- writes (each keeps migration 008's counters): a wave's claim (`claim_wave`, 500 rows), the
  outcomes of the 300 requested (`apply_outcome`), their release (`release`), the wave's partitions
  marked added (`mark_partitions_added`) and 200 pruned ones forgotten (`forget_partitions`).

**The figure is each statement's growth**: ours at the largest size against ours at the first
(`tick_<statement>@1,000,000`, ratio ours / baseline; target ≤ 1.5x: flat). Beside it, in
`details`, the same statement as before migration 008 (`before_*`): the counts by
`count(*) … GROUP BY state` over the campaign's rows, the writes with 008's triggers disabled
(inside the rolled-back transaction: PostgreSQL's DDL is transactional). With
`CAMPAIGN_LEDGER_PLANS=FILE` every statement of each figure, on both sides and at each size, is
explained into FILE (`EXPLAIN (ANALYZE, BUFFERS)`, the counters' trigger time included).
"""

from __future__ import annotations

import itertools
import os
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.common import BenchContext, Result, median, median_of

NAME = "campaign_ledger"
WAVE = 500
PRUNE = 2_000  # the driver's PRUNE_PER_TICK
FORGET = 200
LIVE_SUCCEEDED, LIVE_REQUESTED = 200, 300
RECORDED_SINCE_CLAIM = 100  # of the requested: their runs succeeded, pruned from Dagster
GROWTH_LIMIT = 1.5
COUNTER_TRIGGERS = ("campaign_counts_insert", "campaign_counts_update", "campaign_counts_delete")
OLD_STATE_COUNTS = (
    "SELECT state, count(*) FROM campaign_episodes WHERE campaign_id = %s GROUP BY state"
)
TARGET, OLD_VERSION = "v2", "v1"


def orgs(campaign_id: str) -> list[str]:
    return [f"{campaign_id}-org-{i}" for i in range(50)]


def write_campaign(conn: Any, campaign_id: str, rows: int) -> None:
    """N rows in a third-of-the-way state (see the module), positions in selection order, and
    every episode's record."""
    conn.execute(
        "INSERT INTO campaigns (id, name, selection, target_code_version, state, settings,"
        " governor) VALUES (%s, 'bench', '{}', %s, 'running', '{}', '{\"limit\": 8}')",
        (campaign_id, TARGET),
    )
    done = rows // 3
    params = {
        "id": campaign_id,
        "done": done,
        "rows": rows,
        "live_requested": LIVE_REQUESTED,
        "live_succeeded": LIVE_SUCCEEDED,
        "recorded": RECORDED_SINCE_CLAIM,
        "target": TARGET,
        "old": OLD_VERSION,
    }
    conn.execute(
        """
        INSERT INTO campaign_episodes
            (campaign_id, org_id, episode_id, position, state, attempts, retry_after,
             partition_added, wave, batch_key, updated_at)
        SELECT %(id)s, %(id)s || '-org-' || (i %% 50), 'bench-ep-' || i, i,
               CASE WHEN i < %(done)s THEN 'succeeded'
                    WHEN i < %(done)s + %(live_requested)s THEN 'requested'
                    WHEN i %% 100 = 7 THEN 'failed'
                    ELSE 'pending' END,
               CASE WHEN i %% 100 = 7 AND i >= %(done)s + %(live_requested)s THEN 1 ELSE 0 END,
               CASE WHEN i %% 100 = 7 THEN now() + interval '1 hour' END,
               i >= %(done)s - %(live_succeeded)s AND i < %(done)s + %(live_requested)s,
               CASE WHEN i < %(done)s + %(live_requested)s THEN i / 500 END,
               CASE WHEN i < %(done)s + %(live_requested)s THEN %(id)s || '.b' || i END,
               now() - interval '1 minute'
          FROM generate_series(0, %(rows)s - 1) AS i
        """,
        params,
    )
    # Succeeded and the first requested recorded under the target (the latter since their
    # claim), the rest under the version before.
    conn.execute(
        """
        INSERT INTO episode_outputs
            (org_id, episode_id, code_versions, code_version, figures, run_id, processed_at)
        SELECT %(id)s || '-org-' || (i %% 50), 'bench-ep-' || i, '{}',
               CASE WHEN i < %(done)s + %(recorded)s THEN %(target)s ELSE %(old)s END,
               '{"frame_rows": 30}', 'run-' || i,
               CASE WHEN i < %(done)s + %(recorded)s THEN now() ELSE now() - interval '1 day' END
          FROM generate_series(0, %(rows)s - 1) AS i
        """,
        params,
    )
    conn.execute("ANALYZE campaign_episodes")
    conn.execute("ANALYZE episode_outputs")
    conn.execute("ANALYZE campaign_counts")


def remove_campaign(conn: Any, campaign_id: str) -> None:
    conn.execute("DELETE FROM campaigns WHERE id = %s", (campaign_id,))
    conn.execute("DELETE FROM episode_outputs WHERE org_id = ANY(%s)", (orgs(campaign_id),))


class Recorder:
    """A connection that remembers each statement it is given (an executemany's first row of
    parameters standing for the rest), so its plans can be shown."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.statements: list[tuple[Any, Any]] = []

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        self.statements.append((query, params))
        return self.conn.execute(query, params, **kwargs)

    def cursor(self) -> Any:
        recorder, cursor = self, self.conn.cursor()

        class Cursor:
            def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> None:
                params = list(params_seq)
                if params:
                    recorder.statements.append((query, params[0]))
                cursor.executemany(query, params, **kwargs)

            def __getattr__(self, name: str) -> Any:
                return getattr(cursor, name)

        return Cursor()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


class Plans:
    """Each statement's plans (`EXPLAIN (ANALYZE, BUFFERS)`, the triggers' time included), when
    asked: the statements a call makes are recorded in one rolled-back transaction, then
    explained in that order in another, each on the state the ones before it left."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self.text: list[str] = []

    def explain(
        self, database: Any, call: Callable[[Any], object], title: str, *, before: bool
    ) -> None:
        from psycopg import sql

        with database.connect() as conn, conn.transaction(force_rollback=True):
            recorder = Recorder(conn)
            call(recorder)
        self.text.append(f"## {title}: {len(recorder.statements)} statement(s)\n")
        with database.connect() as conn, conn.transaction(force_rollback=True):
            if before:
                disable_counters(conn)
            texts = [
                query.as_string(conn) if isinstance(query, sql.Composable) else query
                for query, _ in recorder.statements
            ]
            seen: set[str] = set()
            for text, (_, params) in zip(texts, recorder.statements, strict=True):
                if text in seen:  # the same statement for the next row: one plan shows it
                    continue
                seen.add(text)
                prefix = "EXPLAIN (ANALYZE, BUFFERS) "
                lines = [row[0] for row in conn.execute(prefix + text, params).fetchall()]
                times = f" (x {texts.count(text)})" if texts.count(text) > 1 else ""
                self.text.append(" ".join(text.split()) + times + "\n" + "\n".join(lines) + "\n")

    def write(self) -> None:
        if self.path:
            self.path.write_text("\n".join(self.text))


def disable_counters(conn: Any) -> None:
    """The ledger as before migration 008: its counters' triggers off (transactional DDL: the
    rollback turns them on again)."""
    for trigger in COUNTER_TRIGGERS:
        conn.execute(f"ALTER TABLE campaign_episodes DISABLE TRIGGER {trigger}")


def timed(database: Any, statement: Callable[[Any], object], *, before: bool) -> float:
    """One statement's seconds in a transaction rolled back (008's counters' triggers disabled
    first for the side before it)."""
    with database.connect() as conn, conn.transaction(force_rollback=True):
        if before:
            disable_counters(conn)
        started = time.perf_counter()
        statement(conn)
        return time.perf_counter() - started


def statements(campaign_id: str, rows: int) -> dict[str, tuple[Callable, Callable]]:
    """figure → (ours, before migration 008)."""
    from episode_pipeline.campaign import ledger
    from episode_pipeline.db import campaigns as db
    from episode_pipeline.episodes.keys import EpisodeRef

    now = datetime.now(UTC)
    done = rows // 3
    org = orgs(campaign_id)

    def ref(i: int) -> EpisodeRef:
        return EpisodeRef(org[i % 50], f"bench-ep-{i}")

    pruned = [ref(i) for i in range(done - LIVE_SUCCEEDED, done - LIVE_SUCCEEDED + FORGET)]
    requested = [ref(i) for i in range(done, done + LIVE_REQUESTED)]
    pending = [ref(i) for i in range(done + LIVE_REQUESTED, done + LIVE_REQUESTED + WAVE)]
    succeeded = ledger.Transition(ledger.SUCCEEDED, 0, None, None, None)
    released = ledger.Transition(ledger.PENDING, 0, None, None, None)

    def claim(conn: Any) -> None:
        assert len(db.claim_wave(conn, campaign_id, 10_000, WAVE, 1, now)) == WAVE

    def settle(conn: Any) -> None:
        for episode in requested:
            db.apply_outcome(conn, campaign_id, episode, succeeded, "run")

    def same(call: Callable[[Any], object]) -> tuple[Callable, Callable]:
        return call, call

    return {
        "requested_rows": same(lambda conn: db.requested_rows(conn, campaign_id)),
        "recorded_since_claim": same(
            lambda conn: db.recorded_since_claim(conn, campaign_id, TARGET)
        ),
        "has_requested": same(lambda conn: db.has_requested(conn, campaign_id)),
        "canary_episodes": same(lambda conn: db.canary_episodes(conn, campaign_id, [0])),
        "claimable": same(lambda conn: db.claimable_count(conn, campaign_id, now, WAVE)),
        "live_added": same(lambda conn: db.live_added_partitions(conn, campaign_id)),
        "settled_added": same(lambda conn: db.settled_added_partitions(conn, campaign_id, PRUNE)),
        "state_counts": (
            lambda conn: db.fold_counts(conn, campaign_id),
            lambda conn: conn.execute(OLD_STATE_COUNTS, (campaign_id,)).fetchall(),
        ),
        "status_counts": (
            lambda conn: db.state_counts(conn, campaign_id),
            lambda conn: conn.execute(OLD_STATE_COUNTS, (campaign_id,)).fetchall(),
        ),
        "claim": same(claim),
        "settle": same(settle),
        "release": same(
            lambda conn: db.release(conn, campaign_id, [(r, released) for r in requested])
        ),
        "mark_added": same(lambda conn: db.mark_partitions_added(conn, campaign_id, pending)),
        "forget": same(lambda conn: db.forget_partitions(conn, campaign_id, pruned)),
    }


def run(ctx: BenchContext) -> list[Result]:
    database = ctx.database()
    sizes = [int(size) for size in ctx.config.ledger_sizes.split(",") if size.strip()]
    plans = Plans(os.environ.get("CAMPAIGN_LEDGER_PLANS"))
    campaigns = {rows: f"bench-ledger-{uuid.uuid4().hex[:6]}" for rows in sizes}
    at: dict[int, dict[str, tuple[list[float], list[float]]]] = {rows: {} for rows in sizes}
    try:
        for rows, campaign_id in campaigns.items():
            with ctx.phase(f"set-up: {rows:,} ledger rows"), database.transaction() as conn:
                write_campaign(conn, campaign_id, rows)
        # Every size and side of a statement interleaved (A B C D A B C D …): a load that
        # changes during the run (the machine is shared) hits all of them alike.
        each = {rows: statements(campaign_id, rows) for rows, campaign_id in campaigns.items()}
        for figure in each[sizes[0]]:
            calls = [
                lambda call=call, side=side: timed(database, call, before=side == 1)
                for rows in sizes
                for side, call in enumerate(each[rows][figure])
            ]
            with ctx.phase(figure):
                samples = median_of(ctx.config.repeats, *calls)
            for index, rows in enumerate(sizes):
                at[rows][figure] = samples[2 * index], samples[2 * index + 1]
            for rows in sizes if plans.path else ():
                for side, call in enumerate(each[rows][figure]):
                    title = f"{figure} @{rows:,} ({'before 008' if side else 'ours'})"
                    plans.explain(database, call, title, before=side == 1)
    finally:
        with database.transaction() as conn:
            for campaign_id in campaigns.values():
                remove_campaign(conn, campaign_id)
    plans.write()
    results: list[Result] = []
    for smaller, larger in itertools.pairwise(sizes):
        for figure, (ours, before) in at[larger].items():
            ours_small, before_small = at[smaller][figure]
            result = Result(
                stage=NAME,
                metric=f"tick_{figure}@{larger:,}",
                ours=_ms(ours),
                baseline=_ms(ours_small),
                unit="ms",  # milliseconds: the index probes take well under one
                better="lower",
                repeats=min(len(ours), len(ours_small)),
                baseline_name=f"the same at {smaller:,} rows (its growth)",
                ours_samples=[round(s * 1000, 3) for s in ours],
                baseline_samples=[round(s * 1000, 3) for s in ours_small],
                details={
                    "rows": larger,
                    "baseline_rows": smaller,
                    "before_008_ms": _ms(before),
                    "before_008_ms_at_baseline_rows": _ms(before_small),
                    "before_008_growth": round(median(before) / median(before_small), 2),
                },
            )
            results.append(result.expect_factor(1 / GROWTH_LIMIT, f"≤ {GROWTH_LIMIT}x: flat"))
    return results


def _ms(samples: list[float]) -> float:
    return round(median(samples) * 1000, 3)
