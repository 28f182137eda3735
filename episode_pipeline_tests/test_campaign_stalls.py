"""No silent stop, on the driver's tick against a Dagster instance of its own in the session's
PostgreSQL (issue 32, finding 5 and deliverable 3): a canary whose claims were all released runs
again instead of passing; a first campaign without figures from before stops before its first
full wave until `resume --accept-no-baseline`; a campaign that cannot go on says why in `status`
and in the `campaign_driver` tick's `CampaignsStalled`. The runs are those a daemon would leave
(test_campaign_driver.py's way)."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from dagster import DagsterInstance, DagsterRunStatus, build_sensor_context

from episode_pipeline.cli import build_parser
from episode_pipeline.commands import campaign as commands
from episode_pipeline.config.settings import Settings
from episode_pipeline.db import campaigns as db
from episode_pipeline.db.outputs import record_output
from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.sensors.campaign import campaign_driver
from episode_pipeline.defs.sensors.metered import metered
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_tags import EPISODE_JOB_NAME, PARTITION_TAG
from episode_pipeline.local.stack import StackInfo
from episode_pipeline.orchestration.campaigns import drive, wave_backfill_id
from episode_pipeline.runtime import metrics
from episode_pipeline_tests.support.campaigns import OLD, finished_run, stale_episodes
from episode_pipeline_tests.support.dagster_internals import BulkActionStatus, create_run_for_test
from episode_pipeline_tests.support.instances import private_instance

pytestmark = pytest.mark.integration


@pytest.fixture
def instance(stack: StackInfo) -> Iterator[DagsterInstance]:
    with private_instance(stack, "stalls") as private:
        yield private


def start_campaign(
    instance: DagsterInstance,
    settings: Settings,
    db_conn: psycopg.Connection,
    episodes: int,
    recorded: bool,
    *flags: str,
    max_live_partitions: int | None = None,
) -> tuple[list[EpisodeRef], str, dict]:
    """A campaign over `episodes` processed episodes (recorded before by an older code version,
    or never: the first campaign after migration 004), its canary of one."""
    refs = stale_episodes(db_conn, episodes, prefix="stl", recorded=recorded)
    org = refs[0].org_id
    argv = ["campaign", "start", "--org", org, "--stale", "--name", org, "--canary-episodes", "1"]
    args = build_parser().parse_args([*argv, *flags])
    if max_live_partitions is not None:
        pacing = dataclasses.replace(settings.campaign, max_live_partitions=max_live_partitions)
        settings = dataclasses.replace(settings, campaign=pacing)
    planned = commands.plan(db_conn, settings, args)
    query, params, selection = planned.pop("_query")
    campaign_id, _ = commands.start(db_conn, instance, planned, query, params, selection, args)
    return refs, campaign_id, planned


def end_backfill_without_runs(instance: DagsterInstance, campaign_id: str, wave: int) -> None:
    """The wave's backfill canceled before it made a run (an operator, a failed launch)."""
    backfill = instance.get_backfill(wave_backfill_id(campaign_id, wave))
    assert backfill is not None
    instance.update_backfill(backfill.with_status(BulkActionStatus.CANCELED))


def succeed(
    instance: DagsterInstance,
    db_conn: psycopg.Connection,
    campaign_id: str,
    wave: int,
    planned: dict,
) -> None:
    """Every claimed episode of the wave: its run succeeded and recorded the new figures."""
    for row in db.wave_rows(db_conn, campaign_id, wave):
        run_id = finished_run(instance, row.ref, ok=True, campaign=(campaign_id, wave))
        record_output(
            db_conn, row.ref, planned["code_versions"], OLD, run_id=run_id, wall_seconds=1,
            archive_bytes=1,
        )  # fmt: skip


def test_a_canary_whose_claims_were_all_released_runs_again_instead_of_passing(
    instance: DagsterInstance, settings: Settings, db_conn: psycopg.Connection
) -> None:
    """Finding 5: released claims leave wave 0 (wave = NULL); the old driver judged the empty
    wave `passed` and claimed every episode in wave 1."""
    postgres = PostgresResource.from_settings(settings.database)
    _, campaign_id, planned = start_campaign(instance, settings, db_conn, 3, recorded=True)
    now = datetime.now(UTC)
    drive(instance, postgres, now, random.Random(1))  # wave 0: the canary, one episode
    assert len(db.wave_rows(db_conn, campaign_id, 0)) == 1
    end_backfill_without_runs(instance, campaign_id, 0)

    drive(instance, postgres, now + timedelta(seconds=30), random.Random(1))
    result = commands.status(db_conn, campaign_id)
    assert result["report"].get("canary") != "passed"
    assert result["report"]["canary_waves"] == [0, 1]
    assert [len(db.wave_rows(db_conn, campaign_id, w)) for w in (0, 1)] == [0, 1]  # the canary's
    assert any(d["message"].startswith("rerun:") for d in result["decisions"])

    succeed(instance, db_conn, campaign_id, 1, planned)
    drive(instance, postgres, now + timedelta(seconds=60), random.Random(1))
    result = commands.status(db_conn, campaign_id)
    assert (result["report"]["canary"], result["report"]["compared"]) == ("passed", 1)
    # After the pass, the one never claimed: the released canary episode waits out its
    # release's backoff (a release is an attempt, docs/campaign-ledger.md).
    assert len(db.wave_rows(db_conn, campaign_id, 2)) == 1


def test_a_first_campaign_without_a_baseline_stops_before_its_first_full_wave(
    instance: DagsterInstance, settings: Settings, db_conn: psycopg.Connection
) -> None:
    """Finding 5 and deliverable 3: nothing recorded figures before (the first campaign after
    migration 004): the canary compares nothing, so the campaign stops, says why in `status`
    and in the driver's metric, and goes on only with `resume --accept-no-baseline`."""
    postgres = PostgresResource.from_settings(settings.database)
    _, campaign_id, planned = start_campaign(instance, settings, db_conn, 3, recorded=False)
    now = datetime.now(UTC)
    drive(instance, postgres, now, random.Random(1))
    succeed(instance, db_conn, campaign_id, 0, planned)
    drive(instance, postgres, now + timedelta(seconds=30), random.Random(1))

    result = commands.status(db_conn, campaign_id)
    assert (result["state"], result["report"]["canary"]) == ("stopped", "no_baseline")
    assert result["stalled"]["cause"] == "canary_no_baseline"
    assert "STALLED (canary_no_baseline)" in commands.format_status(result)
    assert "--accept-no-baseline" in json.dumps(result["stalled"])
    assert instance.get_backfill(wave_backfill_id(campaign_id, 1)) is None
    assert campaign_id in db.stalled_campaigns(db_conn)

    # The driver's tick counts it for the alarm, whichever campaigns it drove.
    written: list[str] = []
    sensor = metered(campaign_driver(), lambda: metrics.Emitter("t", write=written.append))
    sensor.evaluate_tick(build_sensor_context(instance=instance, resources={"postgres": postgres}))
    (line,) = [json.loads(text) for text in written]
    assert (line["Sensor"], line["CampaignsStalled"]) == ("campaign_driver", 1)

    with pytest.raises(ValueError, match="--accept-no-baseline"):
        commands.act(db_conn, campaign_id, "resume")
    args = build_parser().parse_args(["campaign", "resume", campaign_id, "--accept-no-baseline"])
    assert args.accept_no_baseline
    assert commands.act(db_conn, campaign_id, "resume", accept_no_baseline=True) == "running"
    drive(instance, postgres, now + timedelta(seconds=60), random.Random(1))
    result = commands.status(db_conn, campaign_id)
    assert result["stalled"] is None and result["report"]["accepted_no_baseline"] is True
    assert len(db.wave_rows(db_conn, campaign_id, 1)) == 2


def test_a_campaign_started_accepting_no_baseline_passes_its_canary_on_success(
    instance: DagsterInstance, settings: Settings, db_conn: psycopg.Connection
) -> None:
    """The operator knows up front (`campaign start --accept-no-baseline`): the canary still
    needs its episodes to succeed, not figures from before."""
    postgres = PostgresResource.from_settings(settings.database)
    flag = "--accept-no-baseline"
    _, campaign_id, planned = start_campaign(instance, settings, db_conn, 2, False, flag)
    now = datetime.now(UTC)
    drive(instance, postgres, now, random.Random(1))
    succeed(instance, db_conn, campaign_id, 0, planned)
    drive(instance, postgres, now + timedelta(seconds=30), random.Random(1))
    result = commands.status(db_conn, campaign_id)
    assert (result["state"], result["report"]["canary"]) == ("running", "passed")
    assert (result["report"]["compared"], result["stalled"]) == (0, None)
    assert len(db.wave_rows(db_conn, campaign_id, 1)) == 1


def test_claims_released_tick_after_tick_are_a_stall_with_its_cause(
    instance: DagsterInstance, settings: Settings, db_conn: psycopg.Connection
) -> None:
    """Deliverable 3: every claim released (its backfill ends without runs) and claimed again,
    with no episode settling for two stale-claim windows: `status` names it, until an episode
    settles."""
    postgres = PostgresResource.from_settings(settings.database)
    _, campaign_id, planned = start_campaign(instance, settings, db_conn, 2, recorded=True)
    now = datetime.now(UTC)
    window = 2 * settings.campaign.stale_claim_seconds
    drive(instance, postgres, now, random.Random(1))
    for wave, seconds in ((0, 30.0), (1, window + 60)):
        end_backfill_without_runs(instance, campaign_id, wave)
        drive(instance, postgres, now + timedelta(seconds=seconds), random.Random(1))
    result = commands.status(db_conn, campaign_id)
    assert result["state"] == "running"
    assert result["stalled"]["cause"] == "claims_released", result["stalled"]
    assert any(d["kind"] == "stall" for d in result["decisions"])

    succeed(instance, db_conn, campaign_id, 2, planned)  # the third canary wave's run comes
    drive(instance, postgres, now + timedelta(seconds=window + 90), random.Random(1))
    assert commands.status(db_conn, campaign_id)["stalled"] is None


def test_a_live_partition_budget_full_with_nothing_in_flight_is_a_stall_at_once(
    instance: DagsterInstance, settings: Settings, db_conn: psycopg.Connection
) -> None:
    """Deliverable 3: the wave size is 0 because the partitions the campaign added and has not
    pruned fill its budget (here one: an episode waiting for its retry, whose partition the prune
    keeps because an upload's run of it is in progress), and no run of the campaign is in flight
    to free one: `status` says so at once."""
    postgres = PostgresResource.from_settings(settings.database)
    refs, campaign_id, _ = start_campaign(
        instance, settings, db_conn, 2, True, "--wave-size", "1", max_live_partitions=1
    )
    db_conn.execute(
        "UPDATE campaign_episodes SET state = 'failed', attempts = 1, partition_added = true,"
        " retry_after = now() + interval '1 day' WHERE campaign_id = %s AND episode_id = %s",
        (campaign_id, refs[0].episode_id),
    )
    instance.add_dynamic_partitions(EPISODES_PARTITION_NAME, [refs[0].partition_key])
    create_run_for_test(  # an upload's run, outside the campaign: retention keeps the partition
        instance,
        job_name=EPISODE_JOB_NAME,
        status=DagsterRunStatus.STARTED,
        tags={PARTITION_TAG: refs[0].partition_key},
    )
    (report,) = drive(instance, postgres, datetime.now(UTC), random.Random(1))
    assert (report.claimed, report.stalled) == (0, "budget_full")
    result = commands.status(db_conn, campaign_id)
    assert result["stalled"]["cause"] == "budget_full"
    assert "CAMPAIGN_MAX_LIVE_PARTITIONS" in commands.format_status(result)
