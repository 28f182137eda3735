"""The ledger's SQL on the stack's PostgreSQL: the stale selection, a claim that cannot pick a
row twice, outcomes, stale claims released, the canary's pairs."""

from __future__ import annotations

import random
import threading
import uuid
from datetime import UTC, datetime

import psycopg
import pytest

from episode_pipeline.campaign import ledger
from episode_pipeline.config.settings import Settings
from episode_pipeline.db import campaigns as db
from episode_pipeline.db.batches import create_batch
from episode_pipeline.db.connection import connect
from episode_pipeline.db.outputs import output_record, record_output
from episode_pipeline.episodes.batches import batch_key
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.reprocess import Selection, selection_sql

pytestmark = pytest.mark.integration

FIGURES = {"frame_rows": 30, "seconds_by_camera": {"front": 1.0}, "renditions": ["front"]}


def make_campaign(conn: psycopg.Connection, org: str, target: str) -> str:
    campaign_id = f"test-{uuid.uuid4().hex[:6]}"
    query, params = selection_sql(Selection(org=org, stale_for=target), has_updated_at=True)
    db.create_campaign(conn, campaign_id, "test", {}, target, {}, {"limit": 2}, query, params)
    return campaign_id


def processed_campaign(conn: psycopg.Connection, episodes: int) -> tuple[str, list[EpisodeRef]]:
    """A campaign over `episodes` processed episodes of a new org, and their refs."""
    org = f"org-{uuid.uuid4().hex[:6]}"
    refs = [EpisodeRef(org, f"{org}-ep-{i}") for i in range(episodes)]
    for ref in refs:
        conn.execute(
            "INSERT INTO episodes (id, org_id, status) VALUES (%s, %s, 'processed')",
            (ref.episode_id, ref.org_id),
        )
    return make_campaign(conn, org, "target"), refs


def test_the_stale_selection_and_a_claim_that_cannot_pick_twice(
    db_conn: psycopg.Connection, settings: Settings
) -> None:
    org = f"org-{uuid.uuid4().hex[:6]}"
    refs = [EpisodeRef(org, f"{org}-ep-{i}") for i in range(6)]
    for ref in refs:
        db_conn.execute(
            "INSERT INTO episodes (id, org_id, status) VALUES (%s, %s, 'processed')",
            (ref.episode_id, ref.org_id),
        )
    # ep-0 is recorded under the target already; ep-1 under an older one; the rest never.
    record_output(
        db_conn, refs[0], {"a": "2"}, FIGURES, run_id="r0", wall_seconds=9.0, archive_bytes=1
    )
    record_output(
        db_conn, refs[1], {"a": "1"}, FIGURES, run_id="r1", wall_seconds=9.0, archive_bytes=1
    )
    target = output_record(db_conn, refs[0])["code_version"]
    campaign_id = make_campaign(db_conn, org, target)
    assert db.state_counts(db_conn, campaign_id) == {ledger.PENDING: 5}

    # Two claims at once, each holding its transaction open: no row is claimed twice.
    now = datetime.now(UTC)
    claimed: list[list[EpisodeRef]] = []
    barrier = threading.Barrier(2)

    def claim(wave: int) -> None:
        with connect(settings.database) as conn:
            rows = db.claim_wave(conn, campaign_id, wave, 3, 2, now)
            barrier.wait(timeout=30)  # both claimed before either commits
            claimed.append([row.ref for row in rows])
            conn.commit()

    threads = [threading.Thread(target=claim, args=(w,)) for w in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    picked = [ref for rows in claimed for ref in rows]
    assert sorted(len(rows) for rows in claimed) == [2, 3]
    assert len(set(picked)) == 5 and refs[0] not in picked

    # The previous figures are kept on the row (ep-1 had a record), batch keys K = 2.
    rows = {row.ref: row for w in (0, 1) for row in db.wave_rows(db_conn, campaign_id, w)}
    assert {row.batch_key.rsplit(".", 1)[-1] for row in rows.values()} <= {"b0", "b1"}

    # Outcomes: one succeeds, one fails with its backoff; a stale claim goes back to pending.
    rng = random.Random(3)
    policy = ledger.RetryPolicy()
    done, failed, stale = refs[1], refs[2], refs[3]
    db.apply_outcome(
        db_conn,
        campaign_id,
        done,
        ledger.after_outcome(0, ledger.Outcome(True), now, policy, rng),
        "run-ok",
    )
    db.apply_outcome(
        db_conn,
        campaign_id,
        failed,
        ledger.after_outcome(0, ledger.Outcome(False, "SlowDown", "throttled"), now, policy, rng),
        "run-bad",
    )
    unlaunched = ledger.after_release(0, None, now, policy, rng)  # never handed to the queue
    assert db.release(db_conn, campaign_id, [(stale, unlaunched)]) == 1
    counts = db.state_counts(db_conn, campaign_id)
    assert counts == {ledger.SUCCEEDED: 1, ledger.FAILED: 1, ledger.PENDING: 1, ledger.REQUESTED: 2}
    assert db.claimable_count(db_conn, campaign_id, now) == 1  # the failed one waits its backoff
    assert db.errors_by_class(db_conn, campaign_id) == [
        {"class": "throttled", "episodes": 1, "last_error": "SlowDown"}
    ]
    # A second outcome for a row no longer requested changes nothing.
    db.apply_outcome(
        db_conn,
        campaign_id,
        done,
        ledger.after_outcome(5, ledger.Outcome(False), now, policy, rng),
        "x",
    )
    assert db.state_counts(db_conn, campaign_id)[ledger.SUCCEEDED] == 1

    wave_of_done = rows[done].wave
    (canary,) = [
        e
        for e in db.canary_episodes(db_conn, campaign_id, [wave_of_done])
        if e.key == done.partition_key
    ]
    assert (canary.state, canary.before, canary.after) == (ledger.SUCCEEDED, FIGURES, FIGURES)


def test_a_claim_reads_its_rows_in_claim_order_from_the_index(
    db_conn: psycopg.Connection,
) -> None:
    """The claim's plan walks migration 006's partial index: no sort of the campaign's rows,
    so a wave costs its own size however large the campaign (sequential scans are off: the
    test's table is too small for the planner to prefer an index on its own)."""
    # SET LOCAL holds only inside a transaction; the fixture's connection autocommits.
    with db_conn.transaction():
        db_conn.execute("SET LOCAL enable_seqscan = off")
        # And no sort: on the session's table another index plus a sort of its one row can cost
        # the same (it flipped under -n 3); the claim must read its order from the index alone.
        db_conn.execute("SET LOCAL enable_sort = off")
        plan = "\n".join(
            row[0]
            for row in db_conn.execute(
                "EXPLAIN SELECT org_id, episode_id FROM campaign_episodes"
                f" WHERE {db.CLAIMABLE_WHERE} ORDER BY attempts, position LIMIT 10",
                ("any-campaign", datetime.now(UTC)),
            ).fetchall()
        )
    assert "campaign_episodes_claim_order_idx" in plan, plan
    assert "Sort" not in plan, plan


def test_a_release_is_an_attempt_with_backoff_and_rejects_out_of_attempts(
    db_conn: psycopg.Connection,
) -> None:
    """Finding 7's SQL: a counted release waits its backoff (the claim skips it until then),
    the last one rejects the row naming why; a row no longer requested is left alone (a crash
    between the release's read and its write, or a second tick, changes nothing)."""
    campaign_id, refs = processed_campaign(db_conn, 2)
    now = datetime.now(UTC)
    policy, rng = ledger.RetryPolicy(max_attempts=2), random.Random(4)
    cause = "wave 0's backfill c0 ended COMPLETED_SUCCESS"
    assert len(db.claim_wave(db_conn, campaign_id, 0, 2, 1, now)) == 2
    released = ledger.after_release(0, cause, now, policy, rng)
    assert db.release(db_conn, campaign_id, [(refs[0], released)]) == 1
    assert db.release(db_conn, campaign_id, [(refs[0], released)]) == 0  # not requested now
    assert db.claimable_count(db_conn, campaign_id, now) == 0  # waits its backoff
    assert db.claim_wave(db_conn, campaign_id, 1, 2, 1, now) == []
    later = released.retry_after
    (again,) = db.claim_wave(db_conn, campaign_id, 1, 2, 1, later)
    assert again.ref == refs[0]
    (row,) = db.wave_rows(db_conn, campaign_id, 1)
    assert row.attempts == 1
    last = ledger.after_release(row.attempts, cause, later, policy, rng)
    assert db.release(db_conn, campaign_id, [(refs[0], last)]) == 1
    counts = db.state_counts(db_conn, campaign_id)
    assert counts == {ledger.REJECTED: 1, ledger.REQUESTED: 1}
    assert db.errors_by_class(db_conn, campaign_id) == [
        {"class": ledger.NO_RUN, "episodes": 1, "last_error": last.last_error}
    ]
    assert db.has_requested(db_conn, campaign_id)
    # An uncounted release (paused before the backfill) keeps the row's attempts and error.
    uncounted = ledger.after_release(0, None, later, policy, rng)
    assert db.release(db_conn, campaign_id, [(refs[1], uncounted)]) == 1
    assert not db.has_requested(db_conn, campaign_id)
    assert db.claimable_count(db_conn, campaign_id, now) == 1


def test_a_batch_s_episodes_the_ledger_no_longer_waits_on_from_it(
    db_conn: psycopg.Connection,
) -> None:
    """What a later attempt of a batch run leaves alone (orchestration/batches.py): the episodes
    whose row the ledger settled, or claimed into another batch since; not the ones it still
    waits on from this batch, nor any of a batch no campaign made."""
    campaign_id, refs = processed_campaign(db_conn, 4)
    now, policy, rng = datetime.now(UTC), ledger.RetryPolicy(max_attempts=3), random.Random(5)
    rows = db.claim_wave(db_conn, campaign_id, 0, 4, 4, now)
    (key,) = {row.batch_key for row in rows}
    assert key is not None
    create_batch(db_conn, key, [row.ref for row in rows])
    assert db.moved_on_from_batch(db_conn, key) == set()
    succeeded = ledger.after_outcome(0, ledger.Outcome(succeeded=True), now, policy, rng)
    db.apply_outcome(db_conn, campaign_id, refs[0], succeeded, "r0")
    failed = ledger.after_outcome(
        0, ledger.Outcome(False, "SlowDown", "throttled"), now, policy, rng
    )
    db.apply_outcome(db_conn, campaign_id, refs[1], failed, "r1")
    assert db.moved_on_from_batch(db_conn, key) == {refs[0], refs[1]}
    assert failed.retry_after is not None
    (again,) = db.claim_wave(db_conn, campaign_id, 1, 4, 4, failed.retry_after)
    assert again.ref == refs[1] and again.batch_key != key  # requested, in another batch
    assert db.moved_on_from_batch(db_conn, key) == {refs[0], refs[1]}
    no_campaign = batch_key(f"t{uuid.uuid4().hex[:6]}", 0, 0)
    create_batch(db_conn, no_campaign, refs[:1])
    assert db.moved_on_from_batch(db_conn, no_campaign) == set()


def counted(conn: psycopg.Connection, campaign_id: str) -> dict[str, int]:
    """The ledger's own count: what the counters must always say."""
    rows = conn.execute(
        "SELECT state, count(*) FROM campaign_episodes WHERE campaign_id = %s GROUP BY state",
        (campaign_id,),
    ).fetchall()
    return {state: int(n) for state, n in rows}


def test_the_counters_follow_every_writer_of_the_ledger_and_a_fold_keeps_them(
    db_conn: psycopg.Connection, settings: Settings
) -> None:
    """Migration 008: the per-state counts the tick reads are kept by the statements that
    change the ledger (the start, a claim, outcomes, a release, a rejection, a direct write, a
    delete), a rolled-back claim leaves them as they were, and a fold (the driver's, under the
    campaign's lock) leaves one row a state with the same counts."""
    campaign_id, _ = processed_campaign(db_conn, 8)
    now, policy, rng = datetime.now(UTC), ledger.RetryPolicy(max_attempts=1), random.Random(5)

    def agree() -> dict[str, int]:
        counts = db.state_counts(db_conn, campaign_id)
        assert counts == counted(db_conn, campaign_id)
        return counts

    assert agree() == {ledger.PENDING: 8}
    with connect(settings.database) as conn:  # a claim rolled back changes nothing
        assert len(db.claim_wave(conn, campaign_id, 0, 3, 1, now)) == 3
        conn.rollback()
    assert agree() == {ledger.PENDING: 8}
    claimed = [row.ref for row in db.claim_wave(db_conn, campaign_id, 0, 5, 1, now)]
    ok = ledger.after_outcome(0, ledger.Outcome(True), now, policy, rng)
    bad = ledger.after_outcome(0, ledger.Outcome(False, "boom", "other"), now, policy, rng)
    db.apply_outcome(db_conn, campaign_id, claimed[0], ok, "r0")
    db.apply_outcome(db_conn, campaign_id, claimed[0], bad, "again")  # not requested: no change
    db.apply_outcome(db_conn, campaign_id, claimed[1], bad, "r1")
    db.release(db_conn, campaign_id, [(claimed[2], ledger.after_release(0, "x", now, policy, rng))])
    db.forget_partitions(db_conn, campaign_id, claimed)  # moves no row between states
    db_conn.execute(
        "UPDATE campaign_episodes SET state = 'rejected' WHERE campaign_id = %s AND state = %s",
        (campaign_id, ledger.PENDING),
    )
    db_conn.execute(
        "DELETE FROM campaign_episodes WHERE campaign_id = %s AND episode_id = %s",
        (campaign_id, claimed[3].episode_id),
    )
    expected = {ledger.SUCCEEDED: 1, ledger.REQUESTED: 1, ledger.REJECTED: 5}
    assert agree() == expected
    with db_conn.transaction():
        db.lock_campaign(db_conn, campaign_id)
        assert db.fold_counts(db_conn, campaign_id) == expected
    rows = db_conn.execute(
        "SELECT state, episodes FROM campaign_counts WHERE campaign_id = %s", (campaign_id,)
    ).fetchall()
    assert sorted(rows) == sorted(expected.items())  # one row a state, none for an empty one
    assert agree() == expected
    db_conn.execute("DELETE FROM campaigns WHERE id = %s", (campaign_id,))
    assert db.state_counts(db_conn, campaign_id) == {}
    gone = "SELECT count(*) FROM campaign_counts WHERE campaign_id = %s"
    assert db_conn.execute(gone, (campaign_id,)).fetchone() == (0,)
