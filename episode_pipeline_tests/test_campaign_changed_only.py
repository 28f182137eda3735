"""A campaign runs only the assets whose code version changed and those downstream of them, on
the real local stack (PostgreSQL, moto server, FFmpeg), against a Dagster instance of its own.

Two processed episodes whose record says an older ladder made their HLS (what a ladder or
preset change leaves); the second lacks its stored `extracted_files` output (as an episode
processed before `processed/_dagster/` existed). The plan runs `hls_renditions` and what depends
on it, and the whole graph for that one. The driver's waves go through the backfill daemon's own
iteration, whose runs a synchronous launcher executes in this process: K = 1 (the episode job,
subset by the backfill) and K = 2 (the batch job, its op running each episode of that selection).
The first episode's `frames` rows and extracted files are not rewritten; its HLS is.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from dagster import DagsterEventType, DagsterInstance, RunsFilter

from episode_pipeline.campaign.ledger import Transition
from episode_pipeline.cli import build_parser
from episode_pipeline.commands import campaign as commands
from episode_pipeline.config.settings import Settings
from episode_pipeline.db import campaigns as db
from episode_pipeline.db.outputs import output_record, record_output
from episode_pipeline.defs.asset_keys import EXTRACTED_FILES_KEY
from episode_pipeline.defs.io_managers.s3_outputs import object_key
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.episodes.timeline import TIMELINE_NAME
from episode_pipeline.instance.run_tags import CAMPAIGN_TAG, EPISODE_JOB_NAME, PARTITION_TAG
from episode_pipeline.local.stack import StackInfo
from episode_pipeline.local.upload import upload_episode
from episode_pipeline.orchestration.campaigns import drive
from episode_pipeline.runner import process_episode
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline_tests.support.instances import private_instance_config
from episode_pipeline_tests.support.runs import backfill_daemon

pytestmark = pytest.mark.integration

LADDER_ONLY = ["hls_renditions", "episode_metadata", "episode"]
WHOLE_GRAPH = {"extracted_files", "hls_renditions", "frames", "episode_metadata", "episode"}
OLD_LADDER = "0-an-older-ladder"


@dataclass
class Fleet:
    instance: DagsterInstance
    org: str
    refs: list[EpisodeRef]  # the last one lacks its stored extracted_files output


@pytest.fixture(scope="module")
def fleet(
    stack: StackInfo, settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """Two episodes processed in a private instance whose runs launch synchronously in this
    process (what the daemon's launcher does in a task of their own)."""
    home = tmp_path_factory.mktemp("changed-only-dagster")
    config = {
        **private_instance_config(stack, "changed"),
        "run_coordinator": {
            "module": "dagster._core.run_coordinator",
            "class": "DefaultRunCoordinator",
        },
        "run_launcher": {
            "module": "dagster._core.launcher.sync_in_memory_run_launcher",
            "class": "SyncInMemoryRunLauncher",
        },
    }
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    archive = Path(home) / "take.tar.zst"
    write_sample(archive, SampleSpec(seconds=1.0, cameras=1))
    org = f"chg-{uuid.uuid4().hex[:6]}"
    refs = [EpisodeRef(org, f"ep-{i}-{uuid.uuid4().hex[:6]}") for i in range(2)]
    with DagsterInstance.from_config(str(home)) as instance:
        for ref in refs:
            upload_episode(archive, ref, settings)
            assert process_episode(ref, instance, settings, quiet=True).success
        yield Fleet(instance, org, refs)


def as_if_an_older_ladder_made_them(
    conn: psycopg.Connection, fleet: Fleet, s3: Any, bucket: str
) -> None:
    """The record an older ladder leaves (its other versions the current ones), and the last
    episode's stored extracted_files output gone."""
    for ref in fleet.refs:
        record = output_record(conn, ref)
        assert record is not None
        versions = {**record["code_versions"], "hls_renditions": OLD_LADDER}
        record_output(
            conn, ref, versions, record["figures"], run_id=None, wall_seconds=20.0, archive_bytes=1
        )
    conn.commit()
    gone = fleet.refs[-1]
    s3.delete_object(Bucket=bucket, Key=object_key(EXTRACTED_FILES_KEY, gone.partition_key))


def written(conn: psycopg.Connection, s3: Any, bucket: str, ref: EpisodeRef) -> dict[str, Any]:
    """What a rewrite would change: the frames rows' transaction ids (a replace deletes and
    inserts), and each processed object's LastModified: the extracted files apart from what a
    ladder change rewrites (`hls/`, and the `episode` asset's timeline)."""
    frames = conn.execute(
        "SELECT array_agg(xmin::text ORDER BY frame_order) FROM frames WHERE episode_id = %s",
        (ref.episode_id,),
    ).fetchone()
    objects, hls = {}, {}
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=ref.processed_prefix)
    for page in pages:
        for item in page.get("Contents", []):
            relative = item["Key"][len(ref.processed_prefix) :]
            rewritten = relative.startswith("hls/") or relative == TIMELINE_NAME
            (hls if rewritten else objects)[relative] = item["LastModified"]
    return {"frames": frames[0] if frames else None, "extracted": objects, "hls": hls}


def run_waves(fleet: Fleet, postgres: PostgresResource, campaign_id: str) -> None:
    """Driver ticks, each followed by the backfill daemon's iteration (its runs execute as they
    are launched), until the campaign is done."""
    with backfill_daemon(fleet.instance) as iteration:
        for _ in range(8):
            (report,) = [
                r
                for r in drive(fleet.instance, postgres, datetime.now(UTC))
                if r.campaign == campaign_id
            ]
            if report.state == "done":
                return
            iteration()
    raise AssertionError(f"campaign {campaign_id} not done: {report.describe()}")


def materialized_by_episode(instance: DagsterInstance, campaign_id: str) -> dict[str, set[str]]:
    """Each episode's assets materialized by the campaign's runs of the episode job."""
    found: dict[str, set[str]] = {}
    for run in instance.get_runs(RunsFilter(tags={CAMPAIGN_TAG: campaign_id})):
        if run.job_name != EPISODE_JOB_NAME:
            continue
        records = instance.get_records_for_run(
            run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION
        ).records
        keys = {r.event_log_entry.dagster_event.asset_key.to_user_string() for r in records}  # type: ignore[union-attr]
        found.setdefault(run.tags[PARTITION_TAG], set()).update(keys)
    return found


@pytest.mark.slow(seconds=90)
@pytest.mark.parametrize("per_run", [1, 2])
def test_a_ladder_only_campaign_runs_hls_and_what_depends_on_it(
    fleet: Fleet, settings: Settings, db_conn: psycopg.Connection, s3_client, per_run: int
) -> None:
    as_if_an_older_ladder_made_them(db_conn, fleet, s3_client, settings.bucket)
    partial, whole = fleet.refs[:-1], fleet.refs[-1]
    before = {ref: written(db_conn, s3_client, settings.bucket, ref) for ref in partial}
    time.sleep(1.1)  # S3's LastModified is in whole seconds: a rewrite shows

    args = build_parser().parse_args(
        [
            *("campaign", "start", "--org", fleet.org, "--stale", "--name", f"ladder-k{per_run}"),
            *("--episodes-per-run", str(per_run), "--concurrency", "4"),
        ]
    )
    planned = commands.plan(db_conn, settings, args)
    query, params, selection = planned.pop("_query")
    assert planned["episodes"] == 2
    assert planned["assets"]["assets"] == LADDER_ONLY
    assert planned["assets"]["changed"] == ["hls_renditions"]
    assert planned["assets"]["loaded_as_stored"] == ["extracted_files", "frames"]
    assert planned["assets"]["episodes_whole_graph"] == 1
    assert planned["assets"]["whole_graph_reasons"] == {"stored outputs missing": 1}
    text = commands.format_plan(planned)
    assert "assets to run: hls_renditions, episode_metadata, episode" in text
    assert "the whole graph for 1 episode(s) (1 stored outputs missing)" in text

    campaign_id, _ = commands.start(
        db_conn, fleet.instance, planned, query, params, selection, args
    )
    # The canary is not what this test is about: passed, the waves follow at once.
    db.update_campaign(db_conn, campaign_id, report={"canary": "passed"})
    db_conn.commit()
    campaign = db.get_campaign(db_conn, campaign_id)
    assert (
        campaign is not None and campaign.selection["assets"] == LADDER_ONLY
    )  # a restart reads it

    run_waves(fleet, PostgresResource.from_settings(settings.database), campaign_id)

    assert db.state_counts(db_conn, campaign_id) == {"succeeded": 2}
    assert materialized_by_episode(fleet.instance, campaign_id) == {
        **{ref.partition_key: set(LADDER_ONLY) for ref in partial},
        whole.partition_key: WHOLE_GRAPH,
    }
    for ref in partial:
        after = written(db_conn, s3_client, settings.bucket, ref)
        assert after["frames"] == before[ref]["frames"]  # frame rows not rewritten
        assert after["extracted"] == before[ref]["extracted"]  # nor the extracted files
        assert after["hls"] and all(
            after["hls"][key] > before[ref]["hls"].get(key, datetime.min.replace(tzinfo=UTC))
            for key in after["hls"]
        )  # the HLS is
    target = planned["target_code_version"]
    for ref in fleet.refs:
        record = output_record(db_conn, ref)
        assert record is not None and record["code_version"] == target


def test_a_claim_takes_one_kind_and_a_missing_output_failure_reruns_the_whole_graph(
    db_conn: psycopg.Connection,
) -> None:
    """The ledger's side, no run: whole-graph rows first, a wave of one kind; a run that failed
    for a stored output it could not load flags its episode for the whole graph."""
    campaign_id = f"kinds-{uuid.uuid4().hex[:6]}"
    refs = [EpisodeRef(campaign_id, f"ep-{i}") for i in range(4)]
    values = ", ".join(["(%s, %s)"] * len(refs))
    params = tuple(v for ref in refs for v in (ref.org_id, ref.episode_id))
    query = f"SELECT * FROM (VALUES {values}) AS named (org_id, episode_id)"
    db.create_campaign(db_conn, campaign_id, "kinds", {}, "t", {}, {}, query, params)
    served = record_output(
        db_conn, refs[0], {"frames": "1"}, {}, run_id=None, wall_seconds=1.0, archive_bytes=1
    )
    record_output(
        db_conn, refs[2], {"frames": "1"}, {}, run_id=None, wall_seconds=1.0, archive_bytes=1
    )
    # ep-1 and ep-3 have no record, ep-2 lacks a stored output: three run the whole graph.
    assert db.mark_whole_graph(db_conn, campaign_id, [served], [refs[2]]) == 3
    now = datetime.now(UTC)
    whole = db.claim_wave(db_conn, campaign_id, 0, 10, 1, now)
    assert [row.ref.episode_id for row in whole] == ["ep-1", "ep-2", "ep-3"]
    assert all(row.whole_graph for row in whole)
    (selected,) = db.claim_wave(db_conn, campaign_id, 1, 10, 1, now)
    assert selected.ref == refs[0] and not selected.whole_graph

    error = "hls_renditions: MissingStoredOutput: no stored output for asset 'extracted_files'"
    failed = Transition("failed", 1, None, error, "error")
    db.apply_outcome(db_conn, campaign_id, refs[0], failed, "run")
    (row,) = db.wave_rows(db_conn, campaign_id, 1)
    assert row.whole_graph and row.state == "failed"  # its retry is of the whole graph
    db_conn.execute("DELETE FROM campaigns WHERE id = %s", (campaign_id,))
