"""The campaign driver's tick against a Dagster instance of its own in the session's PostgreSQL,
with the runs a daemon would leave (no FFmpeg: test_campaign_daemon.py runs real episodes).

One campaign over four recorded episodes: the canary wave's backfill (title, tags, priority),
the canary stopping on a duration drift and resuming deliberately, the partitions it added
pruned once their episode succeeded, a throttled failure halving and pausing the governor, a
wave whose backfill a crash left unrecorded repaired under the same id, and `status`."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
import yaml
from dagster import DagsterInstance, DagsterRunStatus
from dagster._core.events import RunFailureReason
from dagster._core.storage.tags import RUN_FAILURE_REASON_TAG
from dagster._core.test_utils import create_run_for_test

from episode_pipeline.cli import build_parser
from episode_pipeline.commands import campaign as commands
from episode_pipeline.config.settings import Settings
from episode_pipeline.db import campaigns as db
from episode_pipeline.db.outputs import record_output
from episode_pipeline.defs.campaigns import (
    CAMPAIGN_PRIORITY,
    CAMPAIGN_TAG,
    CAMPAIGN_WAVE_TAG,
    drive,
    wave_backfill_id,
)
from episode_pipeline.defs.jobs import EPISODE_JOB_NAME
from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.runs import PARTITION_TAG
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.local.stack import StackInfo
from episode_pipeline_tests.support.instances import private_instance_config

pytestmark = pytest.mark.integration

OLD = {"frame_rows": 30, "seconds_by_camera": {"front": 1.0}, "renditions": ["front"]}


@pytest.fixture
def instance(
    stack: StackInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DagsterInstance]:
    home = tmp_path_factory.mktemp("campaign-dagster")
    (home / "dagster.yaml").write_text(yaml.safe_dump(private_instance_config(stack, "campaign")))
    with DagsterInstance.from_config(str(home)) as private:
        yield private


def finish(
    instance: DagsterInstance,
    campaign_id: str,
    wave: int,
    ref: EpisodeRef,
    ok: bool,
    error: str = "",
) -> str:
    """The run a daemon would have made for the wave's backfill, ended."""
    tags = {
        CAMPAIGN_TAG: campaign_id,
        CAMPAIGN_WAVE_TAG: str(wave),
        PARTITION_TAG: ref.partition_key,
    }
    if not ok:  # a step failed (as S3's throttling does): `run_retries` does not re-run it
        tags[RUN_FAILURE_REASON_TAG] = RunFailureReason.STEP_FAILURE.value
    status = DagsterRunStatus.SUCCESS if ok else DagsterRunStatus.STARTED
    run = create_run_for_test(instance, job_name=EPISODE_JOB_NAME, status=status, tags=tags)
    if not ok:
        instance.report_run_failed(run, error)
    return run.run_id


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
    org = f"drv-{uuid.uuid4().hex[:6]}"
    refs = [EpisodeRef(org, f"{org}-ep-{i}") for i in range(4)]
    for ref in refs:
        db_conn.execute(
            "INSERT INTO episodes (id, org_id, status) VALUES (%s, %s, 'processed')",
            (ref.episode_id, org),
        )
        record_output(
            db_conn, ref, {"episode": "0"}, OLD, run_id=None, wall_seconds=30.0, archive_bytes=1
        )
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
    run_id = finish(instance, campaign_id, 0, refs[0], ok=True)
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

    # One succeeds (its partition is pruned), one is throttled by S3: halved, paused, retried later.
    ok, throttled = wave1[0].ref, wave1[1].ref
    run_id = finish(instance, campaign_id, 1, ok, ok=True)
    record_output(db_conn, ok, versions, OLD, run_id=run_id, wall_seconds=30.0, archive_bytes=1)
    finish(
        instance,
        campaign_id,
        1,
        throttled,
        ok=False,
        error="An error occurred (SlowDown) when calling PutObject; Retry-After: 40",
    )
    drive(instance, postgres, now, rng)
    assert not instance.has_dynamic_partition(EPISODES_PARTITION_NAME, ok.partition_key)
    assert instance.has_dynamic_partition(
        EPISODES_PARTITION_NAME, refs[0].partition_key
    )  # not ours
    result = commands.status(db_conn, campaign_id)
    assert result["counts"]["succeeded"] == 2 and result["counts"]["failed"] == 1
    assert result["concurrency"] == 1 and result["paused_until"] is not None
    assert result["errors_by_class"][0]["class"] == "throttled"
    assert any(
        "throttled: concurrency 2 → 1, paused 40 s" in d["message"] for d in result["decisions"]
    )
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
    org = f"drv-{uuid.uuid4().hex[:6]}"
    ref = EpisodeRef(org, f"{org}-ep-0")
    db_conn.execute(
        "INSERT INTO episodes (id, org_id, status) VALUES (%s, %s, 'processed')",
        (ref.episode_id, org),
    )
    record_output(db_conn, ref, {"episode": "0"}, OLD, run_id=None, wall_seconds=1, archive_bytes=1)
    argv = ["campaign", "start", "--org", org, "--stale", "--name", name]
    args = build_parser().parse_args(argv)
    planned = commands.plan(db_conn, settings, args)
    query, params, selection = planned.pop("_query")
    campaign_id, _ = commands.start(db_conn, instance, planned, query, params, selection, args)
    return ref, campaign_id, planned


def test_a_run_pruned_before_the_tick_is_reconciled_from_the_durable_record(
    instance: DagsterInstance, settings: Settings, db_conn: psycopg.Connection
) -> None:
    """Retention may delete a settled episode's run before the driver's next tick: the
    episode's record (the campaign's code version, written after the claim) says it succeeded,
    so it is never released and run a second time."""
    from dagster._core.execution.backfill import BulkActionStatus

    postgres = PostgresResource.from_settings(settings.database)
    ref, campaign_id, planned = one_episode_campaign(instance, settings, db_conn, "pruned")
    now = datetime.now(UTC)
    drive(instance, postgres, now, random.Random(1))  # the canary wave: the one episode
    backfill = instance.get_backfill(wave_backfill_id(campaign_id, 0))
    assert backfill is not None and backfill.partition_names == [ref.partition_key]

    run_id = finish(instance, campaign_id, 0, ref, ok=True)
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
    from dagster._core.execution.backfill import BulkActionStatus

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
