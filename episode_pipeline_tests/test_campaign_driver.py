"""The campaign driver's tick against a Dagster instance of its own in the session's PostgreSQL,
with the runs a daemon would leave (no FFmpeg: test_campaign_soak.py runs real episodes).

One campaign over four recorded episodes: the canary wave's backfill (title, tags, priority),
the canary stopping on a duration drift and resuming deliberately, the partitions it added
pruned once their episode succeeded, a RunTask throttled at launch (the run queue's real path,
ECS client stubbed) halving and pausing the governor, a
wave whose backfill a crash left unrecorded repaired under the same id, and `status`."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

from episode_pipeline.cli import build_parser
from episode_pipeline.commands import campaign as commands
from episode_pipeline.config.settings import Settings
from episode_pipeline.db import campaigns as db
from episode_pipeline.db.outputs import record_output
from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_tags import (
    BATCH_JOB_NAME,
    CAMPAIGN_TAG,
    CAMPAIGN_WAVE_TAG,
    EPISODE_JOB_NAME,
    PARTITION_TAG,
)
from episode_pipeline.local.stack import StackInfo
from episode_pipeline.orchestration.campaigns import (
    AFTER_STALE_CANCEL,
    CAMPAIGN_PRIORITY,
    RETRY_DECISION_SECONDS,
    drive,
    wave_backfill_id,
)
from episode_pipeline.orchestration.failures import fail_episode_of_run
from episode_pipeline_tests.support.campaigns import OLD, finished_run, stale_episodes
from episode_pipeline_tests.support.dagster_internals import (
    PARENT_RUN_ID_TAG,
    ROOT_RUN_ID_TAG,
    WILL_RETRY_TAG,
    BulkActionStatus,
    ModuleTarget,
    consume_new_runs_for_automatic_reexecution,
    create_run_for_test,
    create_test_daemon_workspace_context,
    execute_backfill_iteration,
    retry_run,
)
from episode_pipeline_tests.support.ecs import (
    ECS_RUN_LAUNCHER,
    THROTTLED,
    StubEcs,
    dequeue_with_ecs,
    queued_run,
)
from episode_pipeline_tests.support.instances import private_instance
from episode_pipeline_tests.support.runs import JOB_ORIGIN

pytestmark = pytest.mark.integration


@pytest.fixture
def instance(stack: StackInfo, monkeypatch: pytest.MonkeyPatch) -> Iterator[DagsterInstance]:
    """The local instance's config with production's run launcher (ECS, its client a stub when
    a test launches: support/ecs.py), so a launch failure takes the real path."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    with private_instance(stack, "campaign", run_launcher=ECS_RUN_LAUNCHER) as private:
        yield private


def launch_limit(instance: DagsterInstance, campaign_id: str) -> int | None:
    """What the run queue's next dequeue holds the campaign to (the coordinator's config)."""
    limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
    found = [
        entry["limit"]
        for entry in limits
        if entry["key"] == CAMPAIGN_TAG and entry.get("value") == campaign_id
    ]
    return found[0] if found else None


def test_one_campaign_through_the_drivers_ticks(
    instance: DagsterInstance, settings: Settings, db_conn: psycopg.Connection
) -> None:
    postgres = PostgresResource.from_settings(settings.database)
    refs = stale_episodes(db_conn, 4, prefix="drv", wall_seconds=30.0)
    org = refs[0].org_id
    instance.add_dynamic_partitions(
        EPISODES_PARTITION_NAME, [refs[0].partition_key]
    )  # live already

    args = build_parser().parse_args(
        [
            "campaign",
            "start",
            "--org",
            org,
            "--stale",
            "--episodes-per-run",  # one episode a run: the trial reads them in the backfills
            "1",
            "--name",
            "drv",
            "--concurrency",
            "2",
            "--canary-episodes",
            "1",
        ]
    )
    planned = commands.plan(db_conn, settings, args)
    query, params, selection = planned.pop("_query")
    assert planned["episodes"] == 4 and planned["estimate"]["measured_from"] >= 4
    campaign_id, _ = commands.start(db_conn, instance, planned, query, params, selection, args)
    target = planned["target_code_version"]
    versions = planned["code_versions"]
    now = datetime.now(UTC)
    rng = random.Random(5)

    # Tick 1: the canary wave, one episode, as one backfill titled and tagged for the campaign.
    # Campaigns of other Dagster instances on this database (other tests') are not driven here.
    assert [report.campaign for report in drive(instance, postgres, now, rng)] == [campaign_id]
    backfill = instance.get_backfill(wave_backfill_id(campaign_id, 0))
    assert backfill is not None and backfill.title == "drv · wave 0 (canary)"
    assert backfill.partition_names == [refs[0].partition_key]
    assert (
        backfill.tags[CAMPAIGN_TAG] == campaign_id
        and backfill.tags["dagster/priority"] == CAMPAIGN_PRIORITY
    )

    # Its run succeeds, but the camera's duration drifted by 0.8 s: the canary stops it.
    run_id = finished_run(instance, refs[0], ok=True, campaign=(campaign_id, 0))
    drifted = {**OLD, "seconds_by_camera": {"front": 1.8}}
    record_output(
        db_conn, refs[0], versions, drifted, run_id=run_id, wall_seconds=30.0, archive_bytes=1
    )
    drive(instance, postgres, now, rng)
    result = commands.status(db_conn, campaign_id)
    assert result["state"] == "stopped"
    assert "drift +0.800 s" in result["report"]["findings"][refs[0].partition_key][0]
    assert instance.get_backfill(wave_backfill_id(campaign_id, 1)) is None
    assert commands.act(db_conn, campaign_id, "resume") == "running"

    # Tick 3: wave 1, all three left: the governor's limit (2) to launch and as many more
    # queued behind them. The run queue launches two at a time; the partitions are the campaign's.
    drive(instance, postgres, now, rng)
    wave1 = db.wave_rows(db_conn, campaign_id, 1)
    assert len(wave1) == 3 and all(row.partition_added for row in wave1)
    assert instance.get_backfill(wave_backfill_id(campaign_id, 1)).title == "drv · wave 1"
    assert launch_limit(instance, campaign_id) == 2

    # One succeeds (its partition is pruned); ECS throttles the other's RunTask when the run
    # queue launches it (the real path: Dagster's dequeue, EcsRunLauncher, a stub ECS client
    # raising as boto3 does): halved, paused, retried later, no attempt used up.
    ok, throttled = wave1[0].ref, wave1[1].ref
    run_id = finished_run(instance, ok, ok=True, campaign=(campaign_id, 1))
    record_output(db_conn, ok, versions, OLD, run_id=run_id, wall_seconds=30.0, archive_bytes=1)
    tags = {
        CAMPAIGN_TAG: campaign_id,
        CAMPAIGN_WAVE_TAG: "1",
        PARTITION_TAG: throttled.partition_key,
    }
    launched = queued_run(instance, tags)
    dequeue_with_ecs(instance, StubEcs(error=THROTTLED))
    failed = instance.get_run_by_id(launched.run_id)
    assert failed.status == DagsterRunStatus.FAILURE
    # Production's run_retries (this instance's too) will retry a launch failure: the episode
    # is not settled, but the throttle reaches the governor at once.
    assert failed.tags[WILL_RETRY_TAG] == "true"
    drive(instance, postgres, now, rng)
    result = commands.status(db_conn, campaign_id)
    assert result["counts"]["requested"] == 2  # the throttled one awaits Dagster's retry
    assert result["concurrency"] == 1 and result["paused_until"] is not None
    # Dagster's retries ran out (its auto-reexecution daemon needs a code location, so the test
    # plays its last decision): the failure settles the episode, no attempt used up.
    instance.add_run_tags(launched.run_id, {WILL_RETRY_TAG: "false"})
    drive(instance, postgres, now, rng)
    assert not instance.has_dynamic_partition(EPISODES_PARTITION_NAME, ok.partition_key)
    assert instance.has_dynamic_partition(
        EPISODES_PARTITION_NAME, refs[0].partition_key
    )  # not ours
    result = commands.status(db_conn, campaign_id)
    assert result["counts"]["succeeded"] == 2 and result["counts"]["failed"] == 1
    assert result["concurrency"] == 1 and result["paused_until"] is not None
    assert result["errors_by_class"][0]["class"] == "throttled"
    assert "ThrottlingException" in result["errors_by_class"][0]["last_error"]
    pause = settings.campaign.pause_seconds
    assert any(
        f"throttled: concurrency 2 → 1, paused {pause:g} s" in d["message"]
        for d in result["decisions"]
    )
    assert [
        row.attempts for row in db.wave_rows(db_conn, campaign_id, 1) if row.ref == throttled
    ] == [0]
    assert instance.get_backfill(wave_backfill_id(campaign_id, 2)) is None  # paused
    assert launch_limit(instance, campaign_id) == 0  # its queued run waits out the pause

    # After the pause: wave 2, the throttled episode's retry, is claimed; a crash before its
    # backfill is repaired by the next tick. The budget (1 to launch, 1 queued) is then full.
    later = now + timedelta(minutes=5)
    with postgres.transaction() as conn:
        claimed = db.claim_wave(conn, campaign_id, 2, 1, 1, later)
        db.update_campaign(conn, campaign_id, next_wave=3)
    assert [row.ref for row in claimed] == [throttled]
    drive(instance, postgres, later, rng)
    repaired = instance.get_backfill(wave_backfill_id(campaign_id, 2))
    assert repaired is not None and repaired.partition_names == [throttled.partition_key]
    result = commands.status(db_conn, campaign_id)
    assert (result["state"], result["counts"]["requested"]) == ("running", 2)
    assert launch_limit(instance, campaign_id) == 1
    assert result["target_code_version"] == target
    assert "2 done, 0 failed (to retry), 0 rejected, 2 in flight" in commands.format_status(result)


def one_episode_campaign(
    instance: DagsterInstance, settings: Settings, db_conn: psycopg.Connection, name: str
) -> tuple[EpisodeRef, str, dict]:
    """A campaign started over one episode an older code version processed."""
    (ref,) = stale_episodes(db_conn, 1, prefix="drv")
    org = ref.org_id
    # K = 1 (the default is a batch of 25): the trials read the episode in its wave's backfill.
    argv = ["campaign", "start", "--org", org, "--stale", "--name", name, "--episodes-per-run", "1"]
    args = build_parser().parse_args(argv)
    planned = commands.plan(db_conn, settings, args)
    query, params, selection = planned.pop("_query")
    campaign_id, _ = commands.start(db_conn, instance, planned, query, params, selection, args)
    return ref, campaign_id, planned


def test_a_batch_waves_episode_partitions_are_added_by_its_batch_not_by_the_claim(
    instance: DagsterInstance, settings: Settings, db_conn: psycopg.Connection
) -> None:
    """At K > 1 a claimed episode's partition is the campaign's (counted, pruned) but Dagster
    gets it only when its batch run starts (`run_batch`): the UI's pages grow with the live
    count, and a million-a-day campaign keeps ~17,000 episodes claimed but runs ~8,500."""
    postgres = PostgresResource.from_settings(settings.database)
    refs = stale_episodes(db_conn, 2, prefix="drv")
    org = refs[0].org_id
    argv = ["campaign", "start", "--org", org, "--stale", "--name", "k2", "--episodes-per-run", "2"]
    args = build_parser().parse_args(argv)
    planned = commands.plan(db_conn, settings, args)
    query, params, selection = planned.pop("_query")
    campaign_id, _ = commands.start(db_conn, instance, planned, query, params, selection, args)
    canary_passed(db_conn, campaign_id)

    drive(instance, postgres, datetime.now(UTC), random.Random(1))

    backfill = instance.get_backfill(wave_backfill_id(campaign_id, 0))
    assert backfill is not None and backfill.job_name == BATCH_JOB_NAME
    assert db.live_added_partitions(db_conn, campaign_id) == 2  # the campaign's, to prune
    for ref in refs:
        assert not instance.has_dynamic_partition(EPISODES_PARTITION_NAME, ref.partition_key)


def test_a_crash_between_marking_a_waves_partitions_and_adding_them_is_repaired_and_pruned(
    instance: DagsterInstance,
    settings: Settings,
    db_conn: psycopg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`launch_wave` marks the wave's missing partitions as the campaign's, then adds them: a
    tick that dies in between leaves them marked, not added, and no backfill. The next tick
    adds them and records the backfill under the same id; once the episode succeeded the
    prune deletes the partition, so nothing is left in Dagster or unaccounted in the ledger."""
    postgres = PostgresResource.from_settings(settings.database)
    ref, campaign_id, planned = one_episode_campaign(instance, settings, db_conn, "halfadd")
    now = datetime.now(UTC)
    with monkeypatch.context() as crash:
        crash.setattr(
            instance,
            "add_dynamic_partitions",
            lambda *args, **kwargs: (_ for _ in ()).throw(ConnectionError("the daemon died")),
        )
        (report,) = drive(instance, postgres, now, random.Random(1))
    assert report.error is not None and "the daemon died" in report.error
    (row,) = db.wave_rows(db_conn, campaign_id, 0)
    assert row.partition_added  # the campaign's, to prune, though Dagster never got it
    assert not instance.has_dynamic_partition(EPISODES_PARTITION_NAME, ref.partition_key)
    assert instance.get_backfill(wave_backfill_id(campaign_id, 0)) is None

    drive(instance, postgres, now + timedelta(seconds=30), random.Random(1))
    backfill = instance.get_backfill(wave_backfill_id(campaign_id, 0))
    assert backfill is not None and backfill.partition_names == [ref.partition_key]
    assert instance.has_dynamic_partition(EPISODES_PARTITION_NAME, ref.partition_key)

    run_id = finished_run(instance, ref, ok=True, campaign=(campaign_id, 0))
    versions = planned["code_versions"]
    record_output(db_conn, ref, versions, OLD, run_id=run_id, wall_seconds=1, archive_bytes=1)
    instance.update_backfill(backfill.with_status(BulkActionStatus.COMPLETED_SUCCESS))
    drive(instance, postgres, now + timedelta(seconds=60), random.Random(1))
    assert not instance.has_dynamic_partition(EPISODES_PARTITION_NAME, ref.partition_key)
    assert db.live_added_partitions(db_conn, campaign_id) == 0


def test_a_run_pruned_before_the_tick_is_reconciled_from_the_durable_record(
    instance: DagsterInstance, settings: Settings, db_conn: psycopg.Connection
) -> None:
    """Retention may delete a settled episode's run before the driver's next tick: the
    episode's record (the campaign's code version, written after the claim) says it succeeded,
    so it is never released and run a second time."""
    postgres = PostgresResource.from_settings(settings.database)
    ref, campaign_id, planned = one_episode_campaign(instance, settings, db_conn, "pruned")
    now = datetime.now(UTC)
    drive(instance, postgres, now, random.Random(1))  # the canary wave: the one episode
    backfill = instance.get_backfill(wave_backfill_id(campaign_id, 0))
    assert backfill is not None and backfill.partition_names == [ref.partition_key]

    run_id = finished_run(instance, ref, ok=True, campaign=(campaign_id, 0))
    versions = planned["code_versions"]
    record_output(db_conn, ref, versions, OLD, run_id=run_id, wall_seconds=1, archive_bytes=1)
    instance.delete_run(run_id)  # what retention's statements do to a settled episode
    instance.update_backfill(backfill.with_status(BulkActionStatus.COMPLETED_SUCCESS))

    drive(instance, postgres, now + timedelta(seconds=30), random.Random(1))
    (row,) = db.wave_rows(db_conn, campaign_id, 0)
    assert (row.state, row.run_id) == ("succeeded", run_id)
    assert commands.status(db_conn, campaign_id)["counts"]["pending"] == 0


def test_a_wave_whose_backfill_made_its_runs_during_the_tick_is_not_released(
    instance: DagsterInstance,
    settings: Settings,
    db_conn: psycopg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The backfill daemon submits a wave's runs and ends its backfill between the driver's read
    of the runs (none yet) and its read of the backfill (ended): the claims are kept, not
    released to run a second time (the 100,000-row benchmark's doubled episodes)."""
    postgres = PostgresResource.from_settings(settings.database)
    ref, campaign_id, _ = one_episode_campaign(instance, settings, db_conn, "race")
    now = datetime.now(UTC)
    drive(instance, postgres, now, random.Random(1))  # wave 0 claimed, its backfill recorded

    read_backfill = instance.get_backfill

    def the_daemon_acts_first(backfill_id: str):  # type: ignore[no-untyped-def]
        backfill = read_backfill(backfill_id)
        if backfill is not None and backfill.status == BulkActionStatus.REQUESTED:
            tags = {
                CAMPAIGN_TAG: campaign_id,
                CAMPAIGN_WAVE_TAG: "0",
                PARTITION_TAG: ref.partition_key,
            }
            create_run_for_test(  # the run the daemon made (launched already)
                instance, job_name=EPISODE_JOB_NAME, status=DagsterRunStatus.STARTING, tags=tags
            )
            backfill = backfill.with_status(BulkActionStatus.COMPLETED_SUCCESS)
            instance.update_backfill(backfill)
        return backfill

    monkeypatch.setattr(instance, "get_backfill", the_daemon_acts_first)
    drive(instance, postgres, now + timedelta(seconds=30), random.Random(1))
    (row,) = db.wave_rows(db_conn, campaign_id, 0)
    assert row.state == "requested"
    assert commands.status(db_conn, campaign_id)["counts"]["pending"] == 0


def canary_passed(db_conn: psycopg.Connection, campaign_id: str) -> None:
    """Past the canary (as an operator's resume leaves it): the tests below are about waves."""
    db.update_campaign(db_conn, campaign_id, report={"canary": "passed"})


def crashed_run(
    instance: DagsterInstance, campaign_id: str, wave: int, ref: EpisodeRef, **tags: str
) -> DagsterRun:
    """A run that failed as a crash does under run_retries: `dagster/will_retry=true` (set by
    the event log when run_retries decides to retry; set here whatever the instance's config)."""
    run = create_run_for_test(
        instance,
        job_name=EPISODE_JOB_NAME,
        status=DagsterRunStatus.STARTED,
        tags={
            CAMPAIGN_TAG: campaign_id,
            CAMPAIGN_WAVE_TAG: str(wave),
            PARTITION_TAG: ref.partition_key,
            **tags,
        },
    )
    instance.report_run_failed(run, "the run worker was killed")
    instance.add_run_tags(run.run_id, {WILL_RETRY_TAG: "true"})
    return run


def test_a_crashed_runs_retry_decides_and_an_unretried_crash_fails_after_the_decision(
    instance: DagsterInstance, settings: Settings, db_conn: psycopg.Connection
) -> None:
    """Finding 1, two campaigns on one instance. The crashed run keeps `will_retry=true` after
    its retry succeeded: the retry (tagged with its parent, as run_retries makes it) decides the
    episode. When run_retries does not retry (its backfill had ended, say) the tag stays
    `true`: in flight for the retry decision's window, then a failure like any other."""
    postgres = PostgresResource.from_settings(settings.database)
    retried, retried_id, _ = one_episode_campaign(instance, settings, db_conn, "retried")
    unretried, unretried_id, _ = one_episode_campaign(instance, settings, db_conn, "unretried")
    drive(instance, postgres, datetime.now(UTC), random.Random(1))
    crashed = crashed_run(instance, retried_id, 0, retried)
    crashed_run(instance, unretried_id, 0, unretried)
    retry_tags = {
        **crashed.tags,
        PARENT_RUN_ID_TAG: crashed.run_id,
        ROOT_RUN_ID_TAG: crashed.run_id,
        "dagster/retry_number": "1",
    }
    retry_tags.pop(WILL_RETRY_TAG, None)
    create_run_for_test(
        instance, job_name=EPISODE_JOB_NAME, status=DagsterRunStatus.SUCCESS, tags=retry_tags
    )
    drive(instance, postgres, datetime.now(UTC) + timedelta(seconds=30), random.Random(1))
    (row,) = db.wave_rows(db_conn, retried_id, 0)
    assert (row.state, row.attempts) == ("succeeded", 1)
    assert db.wave_rows(db_conn, unretried_id, 0)[0].state == "requested"  # a retry may come

    after = datetime.now(UTC) + timedelta(seconds=RETRY_DECISION_SECONDS + 30)
    drive(instance, postgres, after, random.Random(1))
    (row,) = db.wave_rows(db_conn, unretried_id, 0)
    assert (row.state, row.attempts) == ("failed", 1)
    assert "killed" in (row_error(db_conn, unretried_id, unretried) or "")


def row_error(db_conn: psycopg.Connection, campaign_id: str, ref: EpisodeRef) -> str | None:
    found = db_conn.execute(
        "SELECT last_error FROM campaign_episodes WHERE campaign_id = %s AND episode_id = %s",
        (campaign_id, ref.episode_id),
    ).fetchone()
    return found[0] if found else None


class Crash(BaseException):
    """The driver's process killed at an injection point: nothing after it runs (not even the
    per-campaign error handling or the limits' publication)."""


def crash_at(point: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Arm `point` of the driver (orchestration/campaigns.py's `reach`) to kill the tick there."""
    from episode_pipeline.orchestration import campaigns as driver

    def reach(name: str, about: str = "") -> None:
        if name == point:
            raise Crash(f"{name} reached about {about}")

    monkeypatch.setattr(driver, "reach", reach)


def test_a_stale_claim_whose_backfill_is_still_requested_is_not_run_twice(
    instance: DagsterInstance,
    settings: Settings,
    db_conn: psycopg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Finding 6: the daemon is down longer than the stale bound; the wave's backfill is still
    REQUESTED. It is canceled, and its claim released only once the cancel has ended it: the
    episode is never in two waves' backfills at once. The tick that canceled it is killed right
    after the cancel (`AFTER_STALE_CANCEL`): the restarted driver converges, the claim released
    once, one wave after it."""
    postgres = PostgresResource.from_settings(settings.database)
    ref, campaign_id, _ = one_episode_campaign(instance, settings, db_conn, "stale")
    canary_passed(db_conn, campaign_id)
    now = datetime.now(UTC)
    drive(instance, postgres, now, random.Random(1))
    first = wave_backfill_id(campaign_id, 0)
    assert instance.get_backfill(first).status == BulkActionStatus.REQUESTED

    stale = now + timedelta(seconds=settings.campaign.stale_claim_seconds + 60)
    crash_at(AFTER_STALE_CANCEL, monkeypatch)
    with pytest.raises(Crash):
        drive(instance, postgres, stale, random.Random(1))
    monkeypatch.undo()
    assert instance.get_backfill(first).status == BulkActionStatus.CANCELING
    drive(instance, postgres, stale + timedelta(seconds=10), random.Random(1))  # restarted
    assert instance.get_backfill(wave_backfill_id(campaign_id, 1)) is None  # not in two waves
    assert instance.get_backfill(first).status == BulkActionStatus.CANCELING
    assert db.wave_rows(db_conn, campaign_id, 0)[0].state == "requested"

    # The backfill daemon (back) ends the cancel: the claim is released, an attempt, once.
    canceled = instance.get_backfill(first).with_status(BulkActionStatus.CANCELED)
    instance.update_backfill(canceled)
    for seconds in (30, 60):
        drive(instance, postgres, stale + timedelta(seconds=seconds), random.Random(1))
    (row,) = db.wave_rows(db_conn, campaign_id, 0) or [None]
    assert row is None  # released: no longer of wave 0
    assert commands.status(db_conn, campaign_id)["counts"]["pending"] == 1
    released = [
        d for d in db.decisions(db_conn, campaign_id, 50) if d["message"].startswith("released")
    ]
    assert len(released) == 1
    assert db_conn.execute(
        "SELECT attempts FROM campaign_episodes WHERE campaign_id = %s", (campaign_id,)
    ).fetchone() == (1,)
    assert instance.get_backfill(wave_backfill_id(campaign_id, 1)) is None  # its backoff
    drive(instance, postgres, stale + timedelta(minutes=10), random.Random(1))
    assert instance.get_backfill(wave_backfill_id(campaign_id, 1)).partition_names == [
        ref.partition_key
    ]
    assert instance.get_backfill(wave_backfill_id(campaign_id, 2)) is None


def test_a_wave_whose_backfill_keeps_ending_without_runs_is_rejected(
    instance: DagsterInstance, settings: Settings, db_conn: psycopg.Connection
) -> None:
    """Finding 7: each release of a claim whose backfill ended without its run is an attempt;
    out of attempts the episode is `rejected`, naming why, and the campaign ends. A wave never
    handed to the run queue (a crash after the claim, then a pause) is released without one."""
    postgres = PostgresResource.from_settings(settings.database)
    now = datetime.now(UTC)
    _, paused_id, _ = one_episode_campaign(instance, settings, db_conn, "paused")
    with postgres.transaction() as conn:  # the claim committed, the tick killed before its backfill
        db.claim_wave(conn, paused_id, 0, 1, 1, now)
        db.update_campaign(conn, paused_id, next_wave=1)
    commands.act(db_conn, paused_id, "pause")
    drive(instance, postgres, now, random.Random(1))
    assert instance.get_backfill(wave_backfill_id(paused_id, 0)) is None
    assert db.state_counts(db_conn, paused_id) == {"pending": 1}
    assert db_conn.execute(
        "SELECT attempts, retry_after FROM campaign_episodes WHERE campaign_id = %s", (paused_id,)
    ).fetchone() == (0, None)

    ref, campaign_id, _ = one_episode_campaign(instance, settings, db_conn, "no-runs")
    canary_passed(db_conn, campaign_id)
    attempts = settings.campaign.max_attempts
    for wave in range(attempts):
        drive(instance, postgres, now, random.Random(1))
        backfill = instance.get_backfill(wave_backfill_id(campaign_id, wave))
        assert backfill is not None, f"wave {wave} not claimed"
        instance.update_backfill(backfill.with_status(BulkActionStatus.COMPLETED_SUCCESS))
        now += timedelta(seconds=30)
        drive(instance, postgres, now, random.Random(1))  # released: an attempt
        now += timedelta(hours=2)  # past the backoff
    result = commands.status(db_conn, campaign_id)
    assert result["state"] == "done"
    assert {state: n for state, n in result["counts"].items() if n} == {"rejected": 1}
    assert f"{attempts} attempts" in (row_error(db_conn, campaign_id, ref) or "")
    assert instance.get_backfill(wave_backfill_id(campaign_id, attempts)) is None


def test_a_wave_recorded_after_the_cancel_is_canceled_and_a_settled_cancel_skipped(
    instance: DagsterInstance,
    settings: Settings,
    db_conn: psycopg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Finding 10: `campaign cancel` runs while a tick has claimed a wave and not yet recorded
    its backfill; the tick records it after the command canceled the others. The next tick
    cancels it, so its queued run is canceled (by Dagster's backfill cancel) and reconciled,
    never left waiting at limit 0. A canceled campaign with nothing in flight is then skipped
    without counting its ledger; the run queue holds it at 0 until it has been quiet for the
    retry decision's window, then it leaves the published limits."""
    from episode_pipeline.orchestration import campaigns as driver

    postgres = PostgresResource.from_settings(settings.database)
    _, idle_id, _ = one_episode_campaign(instance, settings, db_conn, "idle")
    commands.act(db_conn, idle_id, "cancel")
    reports = drive(instance, postgres, datetime.now(UTC), random.Random(1))
    assert idle_id not in [report.campaign for report in reports]
    assert launch_limit(instance, idle_id) == 0

    ref, campaign_id, _ = one_episode_campaign(instance, settings, db_conn, "race-cancel")

    def cancel_between_claim_and_record(name: str, about: str = "") -> None:
        commands.act(db_conn, campaign_id, "cancel")
        next_wave = db.get_campaign(db_conn, campaign_id).next_wave
        assert commands.cancel_backfills(instance, campaign_id, next_wave) == 0  # not recorded
        assert launch_limit(instance, campaign_id) == 0  # held at once

    monkeypatch.setattr(driver, "reach", cancel_between_claim_and_record)
    now = datetime.now(UTC)
    drive(instance, postgres, now, random.Random(1))
    monkeypatch.undo()
    backfill_id = wave_backfill_id(campaign_id, 0)
    assert instance.get_backfill(backfill_id).status == BulkActionStatus.REQUESTED
    tags = {CAMPAIGN_TAG: campaign_id, CAMPAIGN_WAVE_TAG: "0", PARTITION_TAG: ref.partition_key}
    queued = create_run_for_test(  # the run the backfill daemon submitted, held at limit 0
        instance,
        job_name=EPISODE_JOB_NAME,
        status=DagsterRunStatus.QUEUED,
        tags=tags,
        remote_job_origin=JOB_ORIGIN,
    )
    assert launch_limit(instance, campaign_id) == 0

    drive(instance, postgres, now + timedelta(seconds=30), random.Random(1))
    assert instance.get_backfill(backfill_id).status == BulkActionStatus.CANCELING
    # Dagster's backfill daemon: the queued run canceled, then the backfill.
    instance.report_run_canceled(instance.get_run_by_id(queued.run_id))
    instance.update_backfill(
        instance.get_backfill(backfill_id).with_status(BulkActionStatus.CANCELED)
    )
    drive(instance, postgres, now + timedelta(seconds=60), random.Random(1))
    (row,) = db.wave_rows(db_conn, campaign_id, 0)
    assert row.state == "failed" and row.run_id == queued.run_id
    # Settled: skipped from now on, like the idle one, held at 0 while run_retries may still
    # make a retry; once quiet that long, neither is in the published limits any more.
    reports = drive(instance, postgres, now + timedelta(seconds=90), random.Random(1))
    assert {idle_id, campaign_id}.isdisjoint(report.campaign for report in reports)
    assert launch_limit(instance, campaign_id) == launch_limit(instance, idle_id) == 0
    quiet = now + timedelta(seconds=RETRY_DECISION_SECONDS + 120)
    drive(instance, postgres, quiet, random.Random(1))
    assert launch_limit(instance, campaign_id) is launch_limit(instance, idle_id) is None


def test_a_run_whose_wave_tag_is_not_a_wave_is_no_run_of_the_campaigns_waves(
    instance: DagsterInstance, settings: Settings, db_conn: psycopg.Connection
) -> None:
    """A run of the campaign tagged by hand with a wave tag no wave wrote (`x`, ` 0`) is no run
    of its waves: the tick neither fails on it nor settles the episode by it (issue 27's rule);
    the episode's own run decides."""
    postgres = PostgresResource.from_settings(settings.database)
    ref, campaign_id, planned = one_episode_campaign(instance, settings, db_conn, "bad-wave")
    now = datetime.now(UTC)
    drive(instance, postgres, now, random.Random(1))
    for tag in ("x", " 0", "0.0"):
        tags = {CAMPAIGN_TAG: campaign_id, CAMPAIGN_WAVE_TAG: tag, PARTITION_TAG: ref.partition_key}
        create_run_for_test(
            instance, job_name=EPISODE_JOB_NAME, status=DagsterRunStatus.FAILURE, tags=tags
        )
    (report,) = drive(instance, postgres, now + timedelta(seconds=30), random.Random(1))
    assert not report.error and db.wave_rows(db_conn, campaign_id, 0)[0].state == "requested"

    run_id = finished_run(instance, ref, ok=True, campaign=(campaign_id, 0))
    versions = planned["code_versions"]
    record_output(db_conn, ref, versions, OLD, run_id=run_id, wall_seconds=1, archive_bytes=1)
    (report,) = drive(instance, postgres, now + timedelta(seconds=60), random.Random(1))
    assert not report.error
    (row,) = db.wave_rows(db_conn, campaign_id, 0)
    assert (row.state, row.run_id) == ("succeeded", run_id)


@pytest.mark.slow(seconds=45)  # the code location's server starts (~12 s under load)
def test_a_canceled_campaigns_failures_awaiting_run_retries_run_no_more(
    instance: DagsterInstance,
    settings: Settings,
    db_conn: psycopg.Connection,
    stack: StackInfo,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`campaign cancel` while crashed runs await run_retries (production's, in process: Dagster's
    backfill and run_retries code against the code location). One crash's retry is made after
    its wave's backfill cancel had ended (run_retries decided while the backfill was CANCELING,
    the backfill daemon then found no run to cancel): nothing of Dagster's cancels it, so the
    tick does, and the ledger counts the episode failed once. The other's retry is not made yet
    at the tick: run_retries is told not to make it, and the episode settles at once."""
    for name, value in stack.env.items():  # the code location's settings
        monkeypatch.setenv(name, value)
    postgres = PostgresResource.from_settings(settings.database)
    _, made_id, _ = one_episode_campaign(instance, settings, db_conn, "retry-made")
    _, told_id, _ = one_episode_campaign(instance, settings, db_conn, "retry-told")
    now = datetime.now(UTC)
    drive(instance, postgres, now, random.Random(1))  # both canary waves' backfills recorded
    daemon_log = logging.getLogger(__name__)
    target = ModuleTarget(
        module_name="episode_pipeline.definitions",
        attribute=None,
        working_directory=None,
        location_name="episode_pipeline",
    )
    with create_test_daemon_workspace_context(target, instance) as workspace:
        list(execute_backfill_iteration(workspace, daemon_log))  # each wave's run queued
        crashed = {}
        for campaign_id in (made_id, told_id):
            (run,) = instance.get_runs(RunsFilter(tags={CAMPAIGN_TAG: campaign_id}))
            instance.report_run_failed(run, "the run worker was killed")
            crashed[campaign_id] = instance.get_run_by_id(run.run_id)
            assert crashed[campaign_id].tags[WILL_RETRY_TAG] == "true"
            commands.act(db_conn, campaign_id, "cancel")
            assert commands.cancel_backfills(instance, campaign_id, 1) == 1
        list(execute_backfill_iteration(workspace, daemon_log))  # no run left to cancel: ended
        for campaign_id in (made_id, told_id):
            backfill = instance.get_backfill(wave_backfill_id(campaign_id, 0))
            assert backfill.status == BulkActionStatus.CANCELED
        retry_run(crashed[made_id], workspace)  # run_retries' retry, decided before that
        (retry,) = instance.get_runs(
            RunsFilter(tags={CAMPAIGN_TAG: made_id, PARENT_RUN_ID_TAG: crashed[made_id].run_id})
        )
        assert retry.status == DagsterRunStatus.QUEUED

        drive(instance, postgres, now + timedelta(seconds=30), random.Random(1))
        assert instance.get_run_by_id(retry.run_id).status == DagsterRunStatus.CANCELED
        told = instance.get_run_records(RunsFilter(run_ids=[crashed[told_id].run_id]))
        list(consume_new_runs_for_automatic_reexecution(workspace, told, daemon_log))
        # No retry (the crashed run itself may be pruned already: once its wave's backfill had
        # ended RETRY_AFTER_BACKFILL_SECONDS, the tick settled it).
        parent = {CAMPAIGN_TAG: told_id, PARENT_RUN_ID_TAG: crashed[told_id].run_id}
        assert not instance.get_runs(RunsFilter(tags=parent))

    drive(instance, postgres, now + timedelta(seconds=60), random.Random(1))
    (made,) = db.wave_rows(db_conn, made_id, 0)
    assert (made.state, made.attempts, made.run_id) == ("failed", 1, retry.run_id)
    (told,) = db.wave_rows(db_conn, told_id, 0)
    assert (told.state, told.attempts) == ("failed", 1)  # not after the decision's window
    assert "killed" in (row_error(db_conn, told_id, told.ref) or "")
    reports = drive(instance, postgres, now + timedelta(seconds=90), random.Random(1))
    assert {made_id, told_id}.isdisjoint(report.campaign for report in reports)  # settled


def test_a_cancel_while_the_limits_are_published_leaves_the_campaign_held(
    instance: DagsterInstance,
    settings: Settings,
    db_conn: psycopg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`campaign cancel` (the CLI's steps, on a connection of its own) lands between the tick's
    read of the campaigns' states and its publication of the limits: the cancel waits for the
    publication (the tick holds the rows it read as running), then holds the campaign at 0. The
    old tick published the limit it had read over the cancel's 0: the campaign's queued runs
    launchable after its cancel until the next tick."""
    from episode_pipeline.db.connection import connect
    from episode_pipeline.orchestration import campaigns as driver

    postgres = PostgresResource.from_settings(settings.database)
    _, campaign_id, _ = one_episode_campaign(instance, settings, db_conn, "publish-race")
    now = datetime.now(UTC)
    drive(instance, postgres, now, random.Random(1))
    assert launch_limit(instance, campaign_id)

    def cancel() -> None:  # `episode-pipeline campaign cancel`
        with connect(settings.database) as conn:
            backend.append(conn.info.backend_pid)
            commands.act(conn, campaign_id, "cancel")
            conn.commit()
            commands.cancel_backfills(instance, campaign_id, 1)

    backend: list[int] = []
    operator = threading.Thread(target=cancel)
    publish = driver.publish_limits

    def publish_after_the_cancel(target: DagsterInstance, limits: dict[str, int]) -> None:
        operator.start()
        while operator.is_alive() and not waiting_on_a_lock(db_conn, backend):
            time.sleep(0.05)
        publish(target, limits)

    monkeypatch.setattr(driver, "publish_limits", publish_after_the_cancel)
    drive(instance, postgres, now + timedelta(seconds=30), random.Random(1))
    operator.join(timeout=30)
    assert db.get_campaign(db_conn, campaign_id).state == "canceled"
    assert launch_limit(instance, campaign_id) == 0


def waiting_on_a_lock(db_conn: psycopg.Connection, pids: list[int]) -> bool:
    """Whether the backend `pids[0]` waits for a row lock."""
    if not pids:
        return False
    found = db_conn.execute(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pids[0],)
    ).fetchone()
    return bool(found and found[0] == "Lock")


def test_a_failed_runs_episode_is_marked_failed_before_the_prune_deletes_the_run(
    instance: DagsterInstance, settings: Settings, db_conn: psycopg.Connection
) -> None:
    """Found by the soak: the tick that reconciles a failed run prunes the episode's partition,
    its runs with it, often before the run-failure sensor has read the run, and the episode
    stayed `processing` (a rejected broken archive never said `failed`). The tick marks it
    first, by the same failure policy; an episode the sensor already marked is left alone."""
    postgres = PostgresResource.from_settings(settings.database)
    ref, campaign_id, _ = one_episode_campaign(instance, settings, db_conn, "unmarked")
    now = datetime.now(UTC)
    drive(instance, postgres, now, random.Random(1))  # the canary wave; its partition added
    db_conn.execute("UPDATE episodes SET status = 'processing' WHERE id = %s", (ref.episode_id,))
    run_id = finished_run(
        instance, ref, ok=False, campaign=(campaign_id, 0), error="extracted_files: corrupt"
    )
    backfill = instance.get_backfill(wave_backfill_id(campaign_id, 0))
    assert backfill is not None
    instance.update_backfill(backfill.with_status(BulkActionStatus.COMPLETED_FAILED))

    report = drive(instance, postgres, now + timedelta(seconds=30), random.Random(1))
    assert report[0].pruned == 1  # the run is gone with its partition: no sensor will see it
    assert instance.get_run_by_id(run_id) is None
    row = db_conn.execute("SELECT status FROM episodes WHERE id = %s", (ref.episode_id,))
    assert row.fetchone() == ("failed",)
    # Marked once: the sensor's later pass over another failed run changes nothing more.
    again = instance.get_run_by_id(finished_run(instance, ref, ok=False, campaign=(campaign_id, 0)))
    assert again is not None
    assert fail_episode_of_run(instance, again, postgres, still_processing=True) is None


@pytest.mark.parametrize(
    ("step_error", "state", "attempts"),
    [
        (("extracted_files", "CorruptArchive"), "rejected", 1),
        # A subclass of a declared bad-archive type (ArchiveLimitExceeded's): was `other`.
        (("extracted_files", "TooManyMembers"), "rejected", 1),
        (("hls_renditions", "TranscodeFailed"), "failed", 1),
    ],
    ids=["bad-archive", "archive-limit", "transcode"],
)
def test_a_run_that_failed_on_its_archive_is_rejected_at_its_first_attempt(
    instance: DagsterInstance,
    settings: Settings,
    db_conn: psycopg.Connection,
    step_error: tuple[str, str],
    state: str,
    attempts: int,
) -> None:
    """Every run of a broken archive fails the same way: the ledger rejects it at once, its
    cause named (the soak's corrupt archives; a fleet's pay one run each, not `max_attempts`).
    Any other failure waits its backoff and is retried."""
    postgres = PostgresResource.from_settings(settings.database)
    ref, campaign_id, _ = one_episode_campaign(instance, settings, db_conn, step_error[1])
    assert settings.campaign.max_attempts > 1
    canary_passed(db_conn, campaign_id)
    now = datetime.now(UTC)
    drive(instance, postgres, now, random.Random(1))
    message = f"s3://b/{ref.prefix}take.tar.zst: not a zstd frame"
    finished_run(
        instance, ref, ok=False, campaign=(campaign_id, 0), error=message, step_error=step_error
    )
    drive(instance, postgres, now + timedelta(seconds=5), random.Random(1))
    assert db_conn.execute(
        "SELECT state, attempts FROM campaign_episodes WHERE campaign_id = %s", (campaign_id,)
    ).fetchone() == (state, attempts)
    assert f"{step_error[0]}: {step_error[1]}: {message}" in (
        row_error(db_conn, campaign_id, ref) or ""
    )
