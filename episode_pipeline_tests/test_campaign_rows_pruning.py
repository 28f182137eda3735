"""Issue 32's findings 3, 4 and 9 on the real stack: the driver's tick against a Dagster instance
of its own in the session's PostgreSQL, with the runs a daemon would leave (as
test_campaign_driver.py does; no FFmpeg).

3. A rejected episode's partition is pruned: the fleet's broken archives do not fill the
   campaign's live budget and stop it.
4. A row the pipeline cannot key is skipped, counted and named at `campaign start`; one already
   in a ledger is rejected at its claim; one campaign's failing tick stops neither the others
   nor the launch limits' publication.
9. The campaign's prune keeps what retention keeps: another run's history within its window,
   an upload waiting for its run, an archive observation of either.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
import sqlalchemy as sa
from dagster import (
    AssetObservation,
    DagsterEvent,
    DagsterEventType,
    DagsterInstance,
    build_sensor_context,
)

from episode_pipeline.cli import build_parser
from episode_pipeline.commands import campaign as commands
from episode_pipeline.config.settings import RetentionSettings, Settings
from episode_pipeline.db import campaigns as db
from episode_pipeline.db.connection import connect
from episode_pipeline.db.migrate import apply_migrations
from episode_pipeline.db.outputs import record_output
from episode_pipeline.defs.assets.archive import RAW_ARCHIVE_KEY
from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.sensors.campaign import campaign_driver
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.app_state import published_limits
from episode_pipeline.instance.run_tags import EPISODE_JOB_NAME
from episode_pipeline.local.stack import StackInfo
from episode_pipeline.orchestration.archive_versions import report_archive_version
from episode_pipeline.orchestration.campaigns import (
    drive,
    wave_backfill_id,
)
from episode_pipeline.orchestration.retention import (
    DAY_SECONDS,
    IN_FLIGHT,
    WAITING_UPLOAD,
    WITHIN_WINDOW,
    EpisodeRuns,
    kept_because,
    prune,
)
from episode_pipeline_tests.support.campaigns import OLD, finished_run, stale_episodes
from episode_pipeline_tests.support.dagster_internals import AssetObservationData, BulkActionStatus
from episode_pipeline_tests.support.instances import private_instance

POLICY = RetentionSettings(episode_days=3, failed_episode_days=19)  # the rules, not the default


# -- the rule (pure) ----------------------------------------------------------------------------


def test_retention_names_why_it_keeps_an_episode() -> None:
    """The campaign's prune reads the reason: a wait keeps the partition the campaign's, the
    window hands it to retention."""
    now = time.time()
    ended = EpisodeRuns("o/e", False, "SUCCESS", now - 5 * DAY_SECONDS, now - 5 * DAY_SECONDS)
    assert kept_because(ended, POLICY, now) is None
    assert kept_because(dataclasses.replace(ended, in_flight=True), POLICY, now) == IN_FLIGHT
    waiting = dataclasses.replace(ended, newest_observation=now - DAY_SECONDS)
    assert kept_because(waiting, POLICY, now) == WAITING_UPLOAD
    failed = dataclasses.replace(ended, latest_status="FAILURE")  # 5 of its 19 days
    assert kept_because(failed, POLICY, now) == WITHIN_WINDOW
    # A campaign's own runs count as ended long ago: only the others' window holds it.
    only_ours = EpisodeRuns("o/e", False, "SUCCESS", float("-inf"), now - 60)
    assert kept_because(only_ours, POLICY, now) is None


# -- on the real stack --------------------------------------------------------------------------


@pytest.fixture
def instance(stack: StackInfo) -> Iterator[DagsterInstance]:
    with private_instance(stack, "crows") as private:
        yield private


def start(
    conn: psycopg.Connection, instance: DagsterInstance, settings: Settings, *argv: str
) -> tuple[str, dict]:
    # K = 1 (the default is a batch of 25): these trials read each episode in its wave's backfill.
    args = build_parser().parse_args(["campaign", "start", "--episodes-per-run", "1", *argv])
    planned = commands.plan(conn, settings, args)
    query, params, selection = planned.pop("_query")
    campaign_id, _ = commands.start(conn, instance, planned, query, params, selection, args)
    return campaign_id, planned


@pytest.mark.integration
def test_a_rejected_episodes_partition_is_pruned_and_the_campaign_goes_on(
    instance: DagsterInstance,
    settings: Settings,
    db_conn: psycopg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Finding 3: a live budget of one partition, one attempt per episode. The canary's
    episode is rejected (a broken archive): its partition goes, so the next wave fits; before,
    it stayed counted and the campaign claimed nothing more, silently. The prune follows the
    retention settings the driver was given (the sensor's), never the environment of the
    moment (here one retention would refuse)."""
    monkeypatch.setenv("RETENTION_EPISODE_DAYS", "30")  # > the failed window: invalid
    postgres = PostgresResource.from_settings(settings.database)
    refs = stale_episodes(db_conn, prefix="crows", count=2)
    campaign = dataclasses.replace(settings.campaign, max_live_partitions=1, max_attempts=1)
    campaign_id, _ = start(
        db_conn,
        instance,
        dataclasses.replace(settings, campaign=campaign),
        *("--org", refs[0].org_id, "--stale", "--name", "rejected"),
        *("--wave-size", "1", "--concurrency", "1", "--canary-episodes", "1"),
    )
    now = datetime.now(UTC)
    drive(instance, postgres, now, random.Random(3))  # the canary wave: the first episode
    (row,) = db.wave_rows(db_conn, campaign_id, 0)
    assert row.partition_added and instance.has_dynamic_partition(
        EPISODES_PARTITION_NAME, refs[0].partition_key
    )

    finished_run(instance, refs[0], ok=False, campaign=(campaign_id, 0))
    drive(instance, postgres, now + timedelta(seconds=30), random.Random(3), retention=POLICY)
    (row,) = db.wave_rows(db_conn, campaign_id, 0)
    assert row.state == "rejected" and not row.partition_added
    assert not instance.has_dynamic_partition(EPISODES_PARTITION_NAME, refs[0].partition_key)
    assert db.live_added_partitions(db_conn, campaign_id) == 0
    assert commands.status(db_conn, campaign_id)["state"] == "stopped"  # the canary's verdict
    commands.act(db_conn, campaign_id, "resume")

    drive(instance, postgres, now + timedelta(hours=2), random.Random(3))  # past any pause
    backfill = instance.get_backfill(wave_backfill_id(campaign_id, 1))
    assert backfill is not None and backfill.partition_names == [refs[1].partition_key]


@pytest.fixture
def application(
    settings: Settings, db_conn: psycopg.Connection
) -> Iterator[tuple[Settings, psycopg.Connection]]:
    """Settings whose application database is new, migrated, and lets `episodes.org_id` be
    NULL (an application's own schema may): `--stale` selects only this test's rows."""
    name = f"crows_{uuid.uuid4().hex[:8]}"
    db_conn.execute(f"CREATE DATABASE {name}")
    app = dataclasses.replace(settings, database=dataclasses.replace(settings.database, name=name))
    try:
        with connect(app.database, autocommit=True) as conn:
            apply_migrations(conn)
            conn.execute("ALTER TABLE episodes ALTER COLUMN org_id DROP NOT NULL")
            yield app, conn
    finally:
        db_conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.mark.integration
def test_unkeyable_rows_are_skipped_at_start_and_the_driver_launches_the_rest(
    instance: DagsterInstance, application: tuple[Settings, psycopg.Connection]
) -> None:
    """Finding 4's trial: rows `good1` and `a b` of one org, and one with a NULL org_id. The
    start succeeds, skips and names the two it cannot key (in its output and a decision row),
    and the driver launches `good1`. Before, the NULL org_id failed the start (and without it
    `a b` was claimed, raised, and wedged the driver)."""
    app, conn = application
    org = f"crows-{uuid.uuid4().hex[:6]}"
    for org_id, episode_id in ((org, "good1"), (org, "a b"), (None, "orphan-1")):
        conn.execute(
            "INSERT INTO episodes (id, org_id, status) VALUES (%s, %s, 'uploaded')",
            (episode_id, org_id),
        )
    argv = ("--stale", "--name", "trial", "--canary-episodes", "1")
    plan_args = build_parser().parse_args(["campaign", "plan", *argv, "--within", "24"])
    planned_only = commands.plan(conn, app, plan_args)
    text = commands.format_plan(planned_only)
    assert planned_only["episodes"] == 1 and planned_only["skipped"] == 2
    assert "skipped: 2 row(s) the pipeline cannot key" in text
    # The plan names what binds and what it costs; one episode fits a day at any K.
    assert planned_only["within"]["fits"] and planned_only["capacity"]["episodes"] == 1
    assert "binding: " in text and "cost: $" in text and "within 24 h: K=" in text
    assert "'a b'" in text and "org_id is NULL" in text

    campaign_id, planned = start(conn, instance, app, *argv)
    assert (planned["episodes"], planned["skipped"]) == (1, 2)
    skipped = [d for d in db.decisions(conn, campaign_id) if d["kind"] == "selection"]
    assert len(skipped) == 1 and skipped[0]["details"]["skipped"] == 2
    assert commands.status(conn, campaign_id)["episodes"] == 1

    postgres = PostgresResource.from_settings(app.database)
    (report,) = drive(instance, postgres, datetime.now(UTC), random.Random(1))
    assert not report.error and report.claimed == 1
    backfill = instance.get_backfill(wave_backfill_id(campaign_id, 0))
    assert backfill is not None and backfill.partition_names == [f"{org}/good1"]


def broken_campaign(conn: psycopg.Connection, campaign_id: str) -> None:
    """A campaign whose tick raises: its row's settings no longer load (a wave size of 0)."""
    conn.execute(
        "UPDATE campaigns SET settings = jsonb_set(settings, '{waves,wave_size}', '0')"
        " WHERE id = %s",
        (campaign_id,),
    )


@pytest.mark.integration
def test_one_campaigns_failing_tick_stops_neither_the_others_nor_the_limits(
    instance: DagsterInstance,
    settings: Settings,
    db_conn: psycopg.Connection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Finding 4: two campaigns, the older one's tick raises. The other still claims its wave,
    the limits are published (the failed one's at 0: its governor saw nothing this tick), and
    the failure is logged and reported; an unkeyable row already in a ledger (a campaign
    started before the selection skipped them) is rejected with its reason at the claim."""
    postgres = PostgresResource.from_settings(settings.database)
    (broken_ref,) = stale_episodes(db_conn, prefix="crows", count=1)
    broken_id, _ = start(db_conn, instance, settings, "--org", broken_ref.org_id, "--stale")
    broken_campaign(db_conn, broken_id)
    (good,) = stale_episodes(db_conn, prefix="crows", count=1)
    good_id, _ = start(db_conn, instance, settings, "--org", good.org_id, "--stale")
    db_conn.execute(  # what the old start inserted: first in the claim's order
        "INSERT INTO campaign_episodes (campaign_id, org_id, episode_id, position)"
        " VALUES (%s, %s, 'a b', 0)",
        (good_id, good.org_id),
    )

    with caplog.at_level(logging.ERROR, logger="episode_pipeline.orchestration.campaigns"):
        reports = {r.campaign: r for r in drive(instance, postgres, datetime.now(UTC))}

    assert "ValueError" in reports[broken_id].error and reports[broken_id].launch_limit == 0
    assert f"campaign {broken_id}: tick failed" in caplog.text
    assert not reports[good_id].error and reports[good_id].claimed == 1
    backfill = instance.get_backfill(wave_backfill_id(good_id, 0))
    assert backfill is not None and backfill.partition_names == [good.partition_key]
    limits = published_limits(instance)
    assert limits[broken_id] == 0 and limits[good_id] == reports[good_id].launch_limit > 0
    rejected = db_conn.execute(
        "SELECT state, error_class, last_error FROM campaign_episodes"
        " WHERE campaign_id = %s AND episode_id = 'a b'",
        (good_id,),
    ).fetchone()
    assert rejected[:2] == ("rejected", "unkeyable") and "invalid episode id 'a b'" in rejected[2]

    # The sensor's tick fails after that (counted in SensorTickFailures), naming the campaign.
    context = build_sensor_context(instance=instance, resources={"postgres": postgres})
    with pytest.raises(RuntimeError, match=f"campaign {broken_id} .*tick failed"):
        campaign_driver()(context)
    assert published_limits(instance)[good_id] > 0


def observe_in_run(instance: DagsterInstance, run_id: str, ref: EpisodeRef) -> None:
    """The observation a run logs of the bytes it reads when none was reported (a pruned
    episode's): no upload waiting."""
    observation = AssetObservation(asset_key=RAW_ARCHIVE_KEY, partition=ref.partition_key)
    instance.report_dagster_event(
        DagsterEvent(
            event_type_value=DagsterEventType.ASSET_OBSERVATION.value,
            job_name=EPISODE_JOB_NAME,
            event_specific_data=AssetObservationData(observation),
        ),
        run_id,
    )


def observations(instance: DagsterInstance, ref: EpisodeRef) -> int:
    with instance.run_storage.connect() as conn:  # type: ignore[attr-defined]
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM event_logs WHERE partition = :key"
                    " AND dagster_event_type = 'ASSET_OBSERVATION' AND run_id = ''"
                ),
                {"key": ref.partition_key},
            ).scalar()
        )


@pytest.mark.integration
def test_the_campaigns_prune_keeps_what_retention_keeps(
    instance: DagsterInstance, settings: Settings, db_conn: psycopg.Connection
) -> None:
    """Finding 9: three episodes of the canary wave, each processed by the campaign's run (a
    fourth keeps the campaign running). One was
    uploaded again and that run failed (inside its 19-day window), one was uploaded again and
    waits for its run, one has nothing else. Only the third is deleted; the first is handed to
    retention (forgotten by the campaign), the second stays the campaign's until its run ends.
    Before, the prune deleted all three: a failed run's history, and two uploads' observations."""
    postgres = PostgresResource.from_settings(settings.database)
    refs = stale_episodes(db_conn, prefix="crows", count=4)
    one_wave = dataclasses.replace(settings.campaign, canary_fraction=1.0)  # 3 in the canary
    campaign_id, planned = start(
        db_conn,
        instance,
        dataclasses.replace(settings, campaign=one_wave),
        *("--org", refs[0].org_id, "--stale", "--canary-episodes", "3", "--concurrency", "3"),
    )
    now = datetime.now(UTC)
    drive(instance, postgres, now, random.Random(2))
    wave = db.wave_rows(db_conn, campaign_id, 0)
    assert len(wave) == 3 and all(row.partition_added for row in wave)
    reuploaded_failed, waiting, plain, _ = refs
    for ref in refs[:3]:
        run_id = finished_run(instance, ref, ok=True, campaign=(campaign_id, 0))
        observe_in_run(instance, run_id, ref)
        record_output(
            db_conn,
            ref,
            planned["code_versions"],
            OLD,
            run_id=run_id,
            wall_seconds=1,
            archive_bytes=1,
        )
    report_archive_version(instance, reuploaded_failed.partition_key, "v2")
    upload_run = finished_run(instance, reuploaded_failed, ok=False)  # the upload's own run
    report_archive_version(instance, waiting.partition_key, "v2")  # its run is still to come

    drive(instance, postgres, now + timedelta(seconds=30), random.Random(2))

    rows = {row.ref: row for row in db.wave_rows(db_conn, campaign_id, 0)}
    assert {row.state for row in rows.values()} == {"succeeded"}
    assert not instance.has_dynamic_partition(EPISODES_PARTITION_NAME, plain.partition_key)
    assert not rows[plain].partition_added
    for kept in (reuploaded_failed, waiting):
        assert instance.has_dynamic_partition(EPISODES_PARTITION_NAME, kept.partition_key)
        assert observations(instance, kept) == 1
    assert instance.get_run_by_id(upload_run) is not None
    assert not rows[reuploaded_failed].partition_added  # retention's now: pruned in 19 days
    assert rows[waiting].partition_added  # still the campaign's, counted live

    # The waiting upload's run comes and succeeds: within its window, retention owns it too.
    finished_run(instance, waiting, ok=True)
    drive(instance, postgres, now + timedelta(seconds=60), random.Random(2))
    assert instance.has_dynamic_partition(EPISODES_PARTITION_NAME, waiting.partition_key)
    (row,) = [row for row in db.wave_rows(db_conn, campaign_id, 0) if row.ref == waiting]
    assert not row.partition_added

    # Past the failed window retention prunes it, the campaign's run and its observation too: a
    # run's own observation of the bytes it read is no upload waiting. (The wave's backfill has
    # ended, as the daemon leaves it once its runs have.)
    backfill = instance.get_backfill(wave_backfill_id(campaign_id, 0))
    instance.update_backfill(backfill.with_status(BulkActionStatus.COMPLETED_SUCCESS))
    prune(instance, POLICY, now=time.time() + 20 * DAY_SECONDS)
    for ref in (reuploaded_failed, waiting):
        assert not instance.has_dynamic_partition(EPISODES_PARTITION_NAME, ref.partition_key)
