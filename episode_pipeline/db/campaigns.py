"""The campaigns' SQL (migration 004): the ledger, its claim, the decisions log. The caller owns
the transaction unless a function says otherwise; the rules are `campaign/`'s."""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from episode_pipeline.campaign.assets import is_missing_stored_output
from episode_pipeline.campaign.canary import CanaryEpisode
from episode_pipeline.campaign.ledger import (
    FAILED,
    PENDING,
    REJECTED,
    REQUESTED,
    RUNNING,
    SETTLED,
    STOPPED,
    SUCCEEDED,
    Transition,
)
from episode_pipeline.db.episodes import unkeyable_sql
from episode_pipeline.episodes.batches import batch_key, parse_batch_key
from episode_pipeline.episodes.keys import EpisodeRef, UnkeyableRow, ref_of_row


@dataclass(frozen=True)
class Campaign:
    id: str
    name: str
    selection: dict[str, Any]
    target_code_version: str
    state: str
    settings: dict[str, Any]
    governor: dict[str, Any]
    next_wave: int
    report: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime


_CAMPAIGN_COLUMNS = (
    "id, name, selection, target_code_version, state, settings, governor, next_wave, report,"
    " created_at, updated_at"
)


@dataclass(frozen=True)
class LedgerRow:
    ref: EpisodeRef
    state: str
    attempts: int
    wave: int | None
    batch_key: str | None
    run_id: str | None
    partition_added: bool
    updated_at: datetime
    whole_graph: bool = False  # runs every asset, not the campaign's selection (migration 007)


_ROW_COLUMNS = (
    "org_id, episode_id, state, attempts, wave, batch_key, run_id, partition_added, updated_at,"
    " whole_graph"
)


def _ledger_row(row: Sequence[Any]) -> LedgerRow:
    return LedgerRow(EpisodeRef(row[0], row[1]), *row[2:])


# -- the selection: a query of (org_id, episode_id) rows, keyed by issue 27's rule -------------

SKIPPED_NAMED = 20  # unkeyable rows named in the plan and in the campaign's decision row
UNKEYABLE = "unkeyable"  # the error class of a ledger row the pipeline cannot key


def _selected(episodes_query: str) -> sql.Composable:
    return sql.SQL("({}) AS s (org_id, episode_id)").format(sql.SQL(episodes_query))  # type: ignore[arg-type]


# A selected row `keys.ref_of_row` rejects, in PostgreSQL (the same pattern, db/episodes.py):
# skipped, counted and named, never inserted into the ledger.
_UNKEYABLE = unkeyable_sql(sql.SQL("s.org_id"), sql.SQL("s.episode_id"))


@dataclass(frozen=True)
class SelectionCount:
    """What a selection holds: the episodes the ledger takes (a few named), and the rows the
    pipeline cannot key (skipped; the first `SKIPPED_NAMED` named, with the reason)."""

    episodes: int
    examples: list[EpisodeRef]
    skipped: int
    skipped_rows: list[UnkeyableRow]


def count_selection(
    conn: psycopg.Connection, episodes_query: str, params: Sequence[Any], examples: int = 5
) -> SelectionCount:
    """One pass counts both; the unkeyable rows are read only when there are some."""
    selected = _selected(episodes_query)
    row = conn.execute(
        sql.SQL(
            "SELECT count(*) FILTER (WHERE NOT {unkeyable}), count(*) FILTER (WHERE {unkeyable})"
            " FROM {selected}"
        ).format(unkeyable=_UNKEYABLE, selected=selected),
        params,
    ).fetchone()
    episodes, skipped = (int(row[0]), int(row[1])) if row else (0, 0)
    read = sql.SQL("SELECT s.org_id, s.episode_id FROM {selected} WHERE {where} LIMIT %s")
    sample = conn.execute(
        read.format(selected=selected, where=sql.SQL("NOT {}").format(_UNKEYABLE)),
        (*params, examples),
    ).fetchall()
    rows: list[UnkeyableRow] = []
    if skipped:
        found = conn.execute(
            read.format(selected=selected, where=_UNKEYABLE), (*params, SKIPPED_NAMED)
        ).fetchall()
        # The rule decides (the SQL only narrows the scan): what it names is what it skipped.
        rows = [r for r in (ref_of_row(*pair) for pair in found) if isinstance(r, UnkeyableRow)]
    return SelectionCount(
        episodes, [EpisodeRef(org, episode) for org, episode in sample], skipped, rows
    )


def create_campaign(
    conn: psycopg.Connection,
    campaign_id: str,
    name: str,
    selection: Mapping[str, Any],
    target_code_version: str,
    settings: Mapping[str, Any],
    governor: Mapping[str, Any],
    episodes_query: str,
    params: Sequence[Any],
) -> int:
    """The campaign and one `pending` row per selected episode the pipeline can key
    (INSERT … SELECT: a million episodes never pass through this process; an unkeyable row is
    left out, `count_selection` names it); returns how many."""
    conn.execute(
        "INSERT INTO campaigns (id, name, selection, target_code_version, state, settings,"
        " governor) VALUES (%s, %s, %s, %s, %s, %s, %s)",
        (
            campaign_id,
            name,
            Jsonb(dict(selection)),
            target_code_version,
            RUNNING,
            Jsonb(dict(settings)),
            Jsonb(dict(governor)),
        ),
    )
    cursor = conn.execute(
        sql.SQL(
            """
            INSERT INTO campaign_episodes (campaign_id, org_id, episode_id, position)
            SELECT %s, s.org_id, s.episode_id, row_number() OVER (ORDER BY s.org_id, s.episode_id)
              FROM {selected} WHERE NOT {unkeyable}
            """
        ).format(selected=_selected(episodes_query), unkeyable=_UNKEYABLE),
        (campaign_id, *params),
    )
    return cursor.rowcount


def get_campaign(conn: psycopg.Connection, campaign_id: str) -> Campaign | None:
    row = conn.execute(
        f"SELECT {_CAMPAIGN_COLUMNS} FROM campaigns WHERE id = %s", (campaign_id,)
    ).fetchone()
    return Campaign(*row) if row else None


def campaigns_in(conn: psycopg.Connection, states: Iterable[str]) -> list[Campaign]:
    rows = conn.execute(
        f"SELECT {_CAMPAIGN_COLUMNS} FROM campaigns WHERE state = ANY(%s) ORDER BY created_at",
        (list(states),),
    ).fetchall()
    return [Campaign(*row) for row in rows]


def lock_running(conn: psycopg.Connection, campaign_ids: Iterable[str]) -> set[str]:
    """Of `campaign_ids`, those running, their rows share-locked until the transaction ends: an
    operator's cancel or pause (it locks the row to change it) committed before this read is
    seen, and one after it waits until the transaction ends."""
    rows = conn.execute(
        "SELECT id FROM campaigns WHERE id = ANY(%s) AND state = %s ORDER BY id FOR SHARE",
        (sorted(campaign_ids), RUNNING),
    ).fetchall()
    return {row[0] for row in rows}


def all_campaigns(conn: psycopg.Connection, limit: int = 20) -> list[Campaign]:
    rows = conn.execute(
        f"SELECT {_CAMPAIGN_COLUMNS} FROM campaigns ORDER BY created_at DESC LIMIT %s", (limit,)
    ).fetchall()
    return [Campaign(*row) for row in rows]


def update_campaign(conn: psycopg.Connection, campaign_id: str, **values: Any) -> None:
    """Set `state`, `governor`, `report` (jsonb values wrapped here) and touch updated_at."""
    allowed = {"state", "governor", "report", "next_wave"}
    unknown = set(values) - allowed
    if unknown:
        raise ValueError(f"update_campaign: unknown column(s) {sorted(unknown)}")
    names = sorted(values)
    assignments = ", ".join(f"{name} = %s" for name in names)
    params = [Jsonb(values[n]) if isinstance(values[n], dict) else values[n] for n in names]
    conn.execute(
        f"UPDATE campaigns SET {assignments}, updated_at = now() WHERE id = %s",
        (*params, campaign_id),
    )


def lock_campaign(conn: psycopg.Connection, campaign_id: str) -> Campaign | None:
    """The campaign, locked until the transaction ends: one tick works a campaign at a time."""
    row = conn.execute(
        f"SELECT {_CAMPAIGN_COLUMNS} FROM campaigns WHERE id = %s FOR UPDATE", (campaign_id,)
    ).fetchone()
    return Campaign(*row) if row else None


def state_counts(conn: psycopg.Connection, campaign_id: str) -> dict[str, int]:
    """The campaign's episodes in each state that holds any, from the counters migration 008's
    triggers keep with every change of the ledger (its rows are never counted)."""
    rows = conn.execute(
        "SELECT state, sum(episodes) FROM campaign_counts WHERE campaign_id = %s"
        " GROUP BY state HAVING sum(episodes) > 0",
        (campaign_id,),
    ).fetchall()
    return {state: int(n) for state, n in rows}


def fold_counts(conn: psycopg.Connection, campaign_id: str) -> dict[str, int]:
    """`state_counts`, the campaign's counters folded into one row a state first (each
    statement that moves episodes appends its change: unfolded, the sum would read a row per
    change of the campaign's life). Under `lock_campaign` only: two folds at once would each
    return counts missing the other's (the rows they leave are right either way)."""
    # One statement, one round trip: its work is a few rows at any size (plans.txt of the
    # campaign_ledger stage), so what a tick waits for is the round trips (they were 1 + one a
    # state, the figure's 1.92x on a loaded machine).
    rows = conn.execute(
        "WITH folded AS (DELETE FROM campaign_counts WHERE campaign_id = %(id)s"
        " RETURNING state, episodes),"
        " summed AS (SELECT state, sum(episodes)::bigint AS episodes FROM folded GROUP BY state),"
        " kept AS (INSERT INTO campaign_counts (campaign_id, state, episodes)"
        " SELECT %(id)s, state, episodes FROM summed WHERE episodes <> 0)"
        " SELECT state, episodes FROM summed WHERE episodes > 0",
        {"id": campaign_id},
    ).fetchall()
    return {state: int(n) for state, n in rows}


# Parameters: campaign id, now. The states are literals so that every plan, generic ones too,
# can prove the partial index of migration 006 (`state IN ('pending', 'failed')`) covers it.
# A pending row's retry_after is a counted release's backoff (ledger.after_release).
CLAIMABLE_WHERE = (
    f"campaign_id = %s AND (state = '{PENDING}' OR state = '{FAILED}')"
    " AND (retry_after IS NULL OR retry_after <= %s)"
)


def claimable_count(
    conn: psycopg.Connection, campaign_id: str, now: datetime, at_most: int = 1_000_000_000
) -> int:
    """Rows a claim may take now, counted up to `at_most` (a tick needs no more than a wave).
    In the claim's order, so the plan walks migration 006's index: unordered, the planner may
    take a sequential scan that stops after `at_most` rows, which reads every row stored before
    the campaign's claimable ones (the whole ledger, late in a campaign)."""
    row = conn.execute(
        "SELECT count(*) FROM (SELECT 1 FROM campaign_episodes"
        f" WHERE {CLAIMABLE_WHERE} ORDER BY attempts, position LIMIT %s) claimable",
        (campaign_id, now, at_most),
    ).fetchone()
    return int(row[0]) if row else 0


def claim_wave(
    conn: psycopg.Connection,
    campaign_id: str,
    wave: int,
    size: int,
    episodes_per_run: int,
    now: datetime,
) -> list[LedgerRow]:
    """Flip up to `size` claimable rows to `requested` in wave `wave`, in selection order, each
    with its batch key (`<campaign>.w<wave>.b<n>`, K episodes each). `FOR UPDATE SKIP LOCKED`:
    two ticks at once never claim the same row. Read in the order of the index of migration 006,
    so a claim reads about `size` rows, however many the campaign holds."""
    # A wave is of one kind, the whole graph or the campaign's asset selection (its backfill has
    # one): the kind of the first row in claim order (the start puts whole-graph rows first).
    first = conn.execute(
        f"SELECT whole_graph FROM campaign_episodes WHERE {CLAIMABLE_WHERE}"
        " ORDER BY attempts, position LIMIT 1",
        (campaign_id, now),
    ).fetchone()
    whole_graph = bool(first and first[0])
    while True:  # again while it rejects a row the pipeline cannot key: it claims the next
        rows = conn.execute(
            f"""
            SELECT org_id, episode_id FROM campaign_episodes
             WHERE {CLAIMABLE_WHERE} AND whole_graph = %s
             ORDER BY attempts, position
             LIMIT %s
               FOR UPDATE SKIP LOCKED
            """,
            (campaign_id, now, whole_graph, size),
        ).fetchall()
        refs = reject_unkeyable(conn, campaign_id, rows)
        if len(refs) == len(rows):
            break
    claimed = []
    for index, ref in enumerate(refs):
        claimed.append(
            (ref.org_id, ref.episode_id, batch_key(campaign_id, wave, index // episodes_per_run))
        )
    if claimed:
        conn.cursor().executemany(
            "UPDATE campaign_episodes c SET state = %s, wave = %s, batch_key = %s, run_id = NULL,"
            " previous_figures = (SELECT o.figures FROM episode_outputs o"
            " WHERE o.org_id = c.org_id AND o.episode_id = c.episode_id),"
            " updated_at = now() WHERE campaign_id = %s AND org_id = %s AND episode_id = %s",
            [(REQUESTED, wave, key, campaign_id, org, ep) for org, ep, key in claimed],
        )
    return [
        LedgerRow(EpisodeRef(org, ep), REQUESTED, 0, wave, key, None, False, now, whole_graph)
        for org, ep, key in claimed
    ]


def reject_unkeyable(
    conn: psycopg.Connection, campaign_id: str, rows: Iterable[Sequence[Any]]
) -> list[EpisodeRef]:
    """The claim's rows as refs; a row the pipeline cannot key (one a campaign started before
    the selection skipped them) becomes `rejected` with the reason, never an exception that
    rolls the tick back and is claimed first again next tick."""
    refs, unkeyable = [], []
    for org_id, episode_id in rows:
        ref = ref_of_row(org_id, episode_id)
        (unkeyable if isinstance(ref, UnkeyableRow) else refs).append(ref)
    if unkeyable:
        conn.cursor().executemany(
            "UPDATE campaign_episodes SET state = %s, last_error = %s, error_class = %s,"
            " retry_after = NULL, updated_at = now()"
            " WHERE campaign_id = %s AND org_id = %s AND episode_id = %s",
            [
                (REJECTED, row.describe()[:500], UNKEYABLE, campaign_id, row.org_id, row.episode_id)
                for row in unkeyable
            ],
        )
        log_decision(
            conn,
            campaign_id,
            "ledger",
            f"rejected {len(unkeyable)} row(s) the pipeline cannot key: "
            + "; ".join(row.describe() for row in unkeyable[:3]),
            {"unkeyable": [row.describe() for row in unkeyable[:SKIPPED_NAMED]]},
        )
    return refs


def requested_rows(conn: psycopg.Connection, campaign_id: str) -> list[LedgerRow]:
    rows = conn.execute(
        f"SELECT {_ROW_COLUMNS} FROM campaign_episodes WHERE campaign_id = %s AND state = %s"
        " ORDER BY wave, position",
        (campaign_id, REQUESTED),
    ).fetchall()
    return [_ledger_row(row) for row in rows]


def recorded_since_claim(
    conn: psycopg.Connection, campaign_id: str, target_code_version: str
) -> dict[EpisodeRef, str | None]:
    """Requested episodes whose durable record (`episode_outputs`) says the campaign's code
    version processed them after their claim, with the run it names: their run succeeded even
    when Dagster no longer holds it (retention pruned it once the episode settled)."""
    rows = conn.execute(
        "SELECT c.org_id, c.episode_id, o.run_id FROM campaign_episodes c"
        " JOIN episode_outputs o ON o.org_id = c.org_id AND o.episode_id = c.episode_id"
        " WHERE c.campaign_id = %s AND c.state = %s AND o.code_version = %s"
        " AND o.processed_at >= c.updated_at",
        (campaign_id, REQUESTED, target_code_version),
    ).fetchall()
    return {EpisodeRef(org, episode): run_id for org, episode, run_id in rows}


def wave_rows(
    conn: psycopg.Connection, campaign_id: str, wave: int | Sequence[int]
) -> list[LedgerRow]:
    """The rows claimed into the wave(s) and not released (a release sets `wave` NULL)."""
    waves = [wave] if isinstance(wave, int) else list(wave)
    rows = conn.execute(
        f"SELECT {_ROW_COLUMNS} FROM campaign_episodes WHERE campaign_id = %s"
        " AND wave = ANY(%s) ORDER BY position",
        (campaign_id, waves),
    ).fetchall()
    return [_ledger_row(row) for row in rows]


def mark_partitions_added(
    conn: psycopg.Connection, campaign_id: str, refs: Iterable[EpisodeRef]
) -> None:
    """Remember which partitions are the campaign's (added by its claim at K = 1, by the batch
    run at K > 1): it prunes those once they settle."""
    conn.cursor().executemany(
        "UPDATE campaign_episodes SET partition_added = true"
        " WHERE campaign_id = %s AND org_id = %s AND episode_id = %s",
        [(campaign_id, ref.org_id, ref.episode_id) for ref in refs],
    )


def apply_outcome(
    conn: psycopg.Connection,
    campaign_id: str,
    ref: EpisodeRef,
    transition: Transition,
    run_id: str | None,
) -> None:
    """`requested` → the transition's state; a row no longer `requested` is left alone. A run
    that failed for want of a stored output its asset selection reads makes the episode's retry
    run the whole graph (campaign/assets.py)."""
    conn.execute(
        """
        UPDATE campaign_episodes
           SET state = %s, attempts = %s, retry_after = %s, last_error = %s, error_class = %s,
               run_id = %s, updated_at = now(), whole_graph = whole_graph OR %s
         WHERE campaign_id = %s AND org_id = %s AND episode_id = %s AND state = %s
        """,
        (
            transition.state,
            transition.attempts,
            transition.retry_after,
            transition.last_error,
            transition.error_class,
            run_id,
            is_missing_stored_output(transition.last_error),
            campaign_id,
            ref.org_id,
            ref.episode_id,
            REQUESTED,
        ),
    )


def release(
    conn: psycopg.Connection,
    campaign_id: str,
    released: Iterable[tuple[EpisodeRef, Transition]],
) -> int:
    """Claims whose run never came back to `pending` (or `rejected`), each with its
    `ledger.after_release` transition: seed 004's releaseStale, counting attempts. A row no
    longer `requested` is left alone; an uncounted release keeps the row's last error."""
    cursor = conn.cursor()
    cursor.executemany(
        "UPDATE campaign_episodes SET state = %s, attempts = %s, retry_after = %s,"
        " last_error = coalesce(%s, last_error), error_class = coalesce(%s, error_class),"
        " wave = NULL, batch_key = NULL, updated_at = now()"
        " WHERE campaign_id = %s AND org_id = %s AND episode_id = %s AND state = %s",
        [
            (
                t.state,
                t.attempts,
                t.retry_after,
                t.last_error,
                t.error_class,
                campaign_id,
                ref.org_id,
                ref.episode_id,
                REQUESTED,
            )
            for ref, t in released
        ],
    )
    return max(cursor.rowcount, 0)


# The states whose run has ended: `succeeded` and `rejected` for good, `failed` until its retry
# is claimed (the claim adds the partition back). A row `pending` or `requested` may have a run
# to come. Pruning all three keeps the campaign's live partitions to its runs in flight: a
# fleet's broken archives (rejected) or a throttling storm's failures (waiting out their
# backoff) would otherwise fill the live budget and stop the campaign.
PRUNABLE_STATES = (*SETTLED, FAILED)


def has_requested(conn: psycopg.Connection, campaign_id: str) -> bool:
    """Any row of the campaign `requested` (one index probe, not a count of the ledger)."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM campaign_episodes WHERE campaign_id = %s AND state = %s)",
        (campaign_id, REQUESTED),
    ).fetchone()
    return bool(row and row[0])


def moved_on_from_batch(conn: psycopg.Connection, key: str) -> set[EpisodeRef]:
    """The batch's episodes its campaign no longer waits on from this batch: the ledger settled
    the run an earlier attempt of the batch made, released the claim, or claimed the episode
    into another batch since. An episode without a ledger row (a batch of no campaign) is not
    one."""
    rows = conn.execute(
        "SELECT b.org_id, b.episode_id FROM episode_batches b JOIN campaign_episodes c"
        " ON c.campaign_id = %s AND c.org_id = b.org_id AND c.episode_id = b.episode_id"
        " WHERE b.batch_key = %s AND (c.state <> %s OR c.batch_key IS DISTINCT FROM b.batch_key)",
        (parse_batch_key(key).campaign_id, key, REQUESTED),
    ).fetchall()
    return {EpisodeRef(org, episode) for org, episode in rows}


def settled_added_partitions(
    conn: psycopg.Connection, campaign_id: str, limit: int
) -> list[EpisodeRef]:
    """Episodes whose partition the campaign added and whose run has ended (`PRUNABLE_STATES`):
    the driver prunes them, by retention's rules (migration 006's index holds only the added
    rows)."""
    rows = conn.execute(
        "SELECT org_id, episode_id FROM campaign_episodes WHERE campaign_id = %s"
        " AND partition_added AND state = ANY(%s) LIMIT %s",
        (campaign_id, list(PRUNABLE_STATES), limit),
    ).fetchall()
    return [EpisodeRef(org, episode) for org, episode in rows]


def forget_partitions(
    conn: psycopg.Connection, campaign_id: str, refs: Iterable[EpisodeRef]
) -> None:
    conn.cursor().executemany(
        "UPDATE campaign_episodes SET partition_added = false"
        " WHERE campaign_id = %s AND org_id = %s AND episode_id = %s",
        [(campaign_id, ref.org_id, ref.episode_id) for ref in refs],
    )


def live_added_partitions(conn: psycopg.Connection, campaign_id: str) -> int:
    """The partitions the campaign added and has neither pruned nor handed to retention: its
    claims', and those of ended runs a safeguard keeps for now (a run in flight, a newer upload
    waiting, another backfill); the tick prunes the rest before it counts."""
    row = conn.execute(
        "SELECT count(*) FROM campaign_episodes WHERE campaign_id = %s AND partition_added",
        (campaign_id,),
    ).fetchone()
    return int(row[0]) if row else 0


def log_decision(
    conn: psycopg.Connection,
    campaign_id: str,
    kind: str,
    message: str,
    details: Mapping[str, Any] | None = None,
) -> None:
    conn.execute(
        "INSERT INTO campaign_decisions (campaign_id, kind, message, details)"
        " VALUES (%s, %s, %s, %s)",
        (campaign_id, kind, message, Jsonb(dict(details)) if details else None),
    )


def decisions(conn: psycopg.Connection, campaign_id: str, limit: int = 10) -> list[dict[str, Any]]:
    rows = conn.execute(
        "SELECT at, kind, message, details FROM campaign_decisions WHERE campaign_id = %s"
        " ORDER BY id DESC LIMIT %s",
        (campaign_id, limit),
    ).fetchall()
    return [
        {"at": at.isoformat(), "kind": kind, "message": message, "details": details}
        for at, kind, message, details in reversed(rows)
    ]


def errors_by_class(conn: psycopg.Connection, campaign_id: str) -> list[dict[str, Any]]:
    """Failed and rejected episodes by error class, with the newest error of each."""
    rows = conn.execute(
        """
        SELECT coalesce(error_class, 'other'), count(*),
               (array_agg(last_error ORDER BY updated_at DESC))[1]
          FROM campaign_episodes
         WHERE campaign_id = %s AND last_error IS NOT NULL
         GROUP BY 1 ORDER BY 2 DESC
        """,
        (campaign_id,),
    ).fetchall()
    return [{"class": c, "episodes": int(n), "last_error": e} for c, n, e in rows]


def canary_episodes(
    conn: psycopg.Connection, campaign_id: str, waves: Sequence[int]
) -> list[CanaryEpisode]:
    """Each episode of the canary wave(s) not released: its state, its figures before (read
    at its claim), after, and the code version now recorded."""
    rows = conn.execute(
        """
        SELECT c.org_id, c.episode_id, c.state, c.previous_figures, o.figures, o.code_version
          FROM campaign_episodes c
          LEFT JOIN episode_outputs o ON o.org_id = c.org_id AND o.episode_id = c.episode_id
         WHERE c.campaign_id = %s AND c.wave = ANY(%s)
         ORDER BY c.position
        """,
        (campaign_id, list(waves)),
    ).fetchall()
    return [
        CanaryEpisode(EpisodeRef(org, ep).partition_key, state, before, after, version)
        for org, ep, state, before, after, version in rows
    ]


def stalled_campaigns(conn: psycopg.Connection) -> list[str]:
    """Running or stopped campaigns whose report records a stall (`campaign/progress.py`): what
    the `campaign_driver` sensor's `CampaignsStalled` counts, whichever campaigns a tick drove."""
    rows = conn.execute(
        "SELECT id FROM campaigns WHERE state = ANY(%s)"
        " AND jsonb_typeof(report -> 'stall') = 'object' ORDER BY created_at",
        ([RUNNING, STOPPED],),
    ).fetchall()
    return [campaign_id for (campaign_id,) in rows]


def succeeded_since(conn: psycopg.Connection, campaign_id: str, since: datetime) -> int:
    row = conn.execute(
        "SELECT count(*) FROM campaign_episodes WHERE campaign_id = %s AND state = %s"
        " AND updated_at >= %s",
        (campaign_id, SUCCEEDED, since),
    ).fetchone()
    return int(row[0]) if row else 0


# -- the asset selection: which assets the campaign runs, which episodes run them all ----------


def recorded_groups(
    conn: psycopg.Connection, episodes_query: str, params: Sequence[Any]
) -> list[tuple[str | None, dict[str, str] | None, int]]:
    """The selection's keyable episodes grouped by their record (`episode_outputs`):
    `(digest, code versions, episodes)`, `(None, None, n)` for the episodes with none. One pass;
    a fleet has a few digests, not one per episode."""
    rows = conn.execute(
        sql.SQL(
            "SELECT o.code_version, (array_agg(o.code_versions))[1], count(*) FROM {selected}"
            " LEFT JOIN episode_outputs o ON o.org_id = s.org_id AND o.episode_id = s.episode_id"
            " WHERE NOT {unkeyable} GROUP BY o.code_version"
        ).format(selected=_selected(episodes_query), unkeyable=_UNKEYABLE),
        params,
    ).fetchall()
    return [(digest, versions, int(n)) for digest, versions, n in rows]


def episodes_recorded_under(
    conn: psycopg.Connection, episodes_query: str, params: Sequence[Any], digests: Sequence[str]
) -> Iterator[EpisodeRef]:
    """The selection's keyable episodes recorded under these digests, streamed (a server-side
    cursor, which lives in a transaction: a million never sit in this process at once)."""
    with conn.transaction(), conn.cursor(name=f"recorded_{secrets.token_hex(4)}") as cursor:
        cursor.execute(
            sql.SQL(
                "SELECT s.org_id, s.episode_id FROM {selected} JOIN episode_outputs o"
                " ON o.org_id = s.org_id AND o.episode_id = s.episode_id"
                " WHERE NOT {unkeyable} AND o.code_version = ANY(%s)"
            ).format(selected=_selected(episodes_query), unkeyable=_UNKEYABLE),
            (*params, list(digests)),
        )
        for org_id, episode_id in cursor:
            yield EpisodeRef(org_id, episode_id)


def mark_whole_graph(
    conn: psycopg.Connection,
    campaign_id: str,
    partial_digests: Sequence[str],
    missing: Iterable[EpisodeRef],
) -> int:
    """Flag the campaign's episodes that run the whole graph: those not recorded under a digest
    the asset selection serves, and those whose stored outputs are `missing`; then renumber the
    ledger so they come first (a wave claims one kind: interleaved, the waves would shrink).
    Returns how many are flagged."""
    conn.execute(
        "UPDATE campaign_episodes c SET whole_graph = true WHERE c.campaign_id = %s"
        " AND NOT EXISTS (SELECT 1 FROM episode_outputs o WHERE o.org_id = c.org_id"
        " AND o.episode_id = c.episode_id AND o.code_version = ANY(%s))",
        (campaign_id, list(partial_digests)),
    )
    conn.cursor().executemany(
        "UPDATE campaign_episodes SET whole_graph = true"
        " WHERE campaign_id = %s AND org_id = %s AND episode_id = %s",
        [(campaign_id, ref.org_id, ref.episode_id) for ref in missing],
    )
    conn.execute(
        "UPDATE campaign_episodes c SET position = n.position FROM"
        " (SELECT org_id, episode_id, row_number() OVER (ORDER BY whole_graph DESC, position)"
        "  AS position FROM campaign_episodes WHERE campaign_id = %s) n"
        " WHERE c.campaign_id = %s AND c.org_id = n.org_id AND c.episode_id = n.episode_id"
        " AND c.position <> n.position",
        (campaign_id, campaign_id),
    )
    row = conn.execute(
        "SELECT count(*) FROM campaign_episodes WHERE campaign_id = %s AND whole_graph",
        (campaign_id,),
    ).fetchone()
    return int(row[0]) if row else 0
