"""A real campaign on the local stack: 20 real episodes, the real daemon, a SIGKILL mid-campaign.

Twenty 1-second episodes of four orgs are uploaded and processed in-process (`episode-pipeline
process`) with the transcode preset `ultrafast`: the fleet as the old code left it, its version
in `episode_outputs`. A campaign then brings them to the code version of `superfast` (the preset
is part of `hls_renditions`' code version). The daemon that runs the campaign is armed at
`campaign.after_claim` of wave 1 (the first after the canary): the ledger has committed the wave,
its backfill is not recorded. It is SIGKILLed there and a clean daemon finishes the campaign.
Every episode must end processed once by the new version: one successful campaign run each, its
record's code version the campaign's, its frames written once. A second campaign then takes the
same episodes to `veryfast` at K = 5: batch runs of the batch job, each episode still its own
run. The uploads' queue messages, left by the in-process runs, are deleted by the daemon's sensor
as done, not run again.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

from episode_pipeline.cli import build_parser
from episode_pipeline.commands import campaign as commands
from episode_pipeline.config.settings import Settings
from episode_pipeline.db import campaigns as db
from episode_pipeline.db.connection import connect
from episode_pipeline.db.episodes import episode_row, frame_rows
from episode_pipeline.db.outputs import output_record
from episode_pipeline.defs.campaigns import AFTER_CLAIM, CAMPAIGN_TAG, wave_backfill_id
from episode_pipeline.defs.runs import PARTITION_TAG
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.local.dagster_home import instance_config
from episode_pipeline.local.upload import upload_episode
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline_tests.support.daemon import (
    REPO,
    CrashStage,
    Daemon,
    kill_leftovers,
    wait_until,
)
from episode_pipeline_tests.support.queues import depth

pytestmark = pytest.mark.integration

FPS = 30
EPISODES = 20
ORGS = 4  # the local instance runs one run per org at a time
PROCESS_SECONDS = 1500  # 20 episodes through 2 run slots; slow on a loaded machine
# Campaign runs in flight (the governor's limit) above the run queue's 2 slots, so the next
# wave is claimed while runs of the last one still queue: the slots never wait for the backfill
# daemon (an iteration every 30 s). The queue's campaign limit still runs 2 at a time.
CONCURRENCY = "8"


def preset_settings(settings: Settings, preset: str) -> Settings:
    video = dataclasses.replace(settings.transcode.video, preset=preset, ladder_preset=preset)
    return dataclasses.replace(
        settings, transcode=dataclasses.replace(settings.transcode, video=video)
    )


def new_settings_of(planned: dict) -> Settings:
    return planned["settings"]


def preset_env(preset: str) -> dict[str, str]:
    return {
        "TRANSCODE_PRESET": preset,
        "TRANSCODE_LADDER_PRESET": preset,
        "CAMPAIGN_TICK_SECONDS": "2",
    }


def daemon(stage: CrashStage, label: str, preset: str, **kwargs: object) -> Daemon:
    return Daemon(
        dataclasses.replace(stage, env={**stage.env, **preset_env(preset)}), label, **kwargs
    )  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def stage(
    crash_stage: CrashStage, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CrashStage]:
    """The crash stage's instance with the local instance's run queue (dequeued every second),
    not the crash tests' pausing one (Dagster's 5 s): no injection point here needs it; and its
    run monitoring (production's 10-minute start timeout): a run slow to start on a loaded
    machine is not failed and retried, which would make a second run of its episode."""
    home = tmp_path_factory.mktemp("campaign-dagster")
    config = yaml.safe_load((crash_stage.dagster_home / "dagster.yaml").read_text())
    local = instance_config("", 0)
    config["run_coordinator"] = local["run_coordinator"]
    config["run_monitoring"] = local["run_monitoring"]
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    env = {**crash_stage.env, "DAGSTER_HOME": str(home)}
    yield dataclasses.replace(crash_stage, dagster_home=home, env=env)
    kill_leftovers({str(home)})  # what the SIGKILL spared: crash_stage's looks for its own homes


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("campaign-sample") / "take.tar.zst"
    write_sample(out, SampleSpec(seconds=1.0, cameras=1, fps=FPS))
    return out


def start_campaign(
    stage: CrashStage, settings: Settings, refs: list[EpisodeRef], name: str, *options: str
) -> tuple[str, dict]:
    argv = ["campaign", "start", "--stale", "--name", name, "--concurrency", CONCURRENCY, *options]
    for ref in refs:
        argv += ["--episode", ref.partition_key]
    args = build_parser().parse_args(argv)
    with connect(stage.settings.database) as conn:
        planned = commands.plan(conn, settings, args)
        query, params, selection = planned.pop("_query")
        assert planned["episodes"] == len(refs)  # all stale under the new version
        with DagsterInstance.from_config(str(stage.dagster_home)) as instance:
            campaign_id, count = commands.start(
                conn, instance, planned, query, params, selection, args
            )
        conn.commit()
    assert count == len(refs)
    planned["args"] = args
    return campaign_id, planned


def wait_for_the_end(stage: CrashStage, campaign_id: str, running: Daemon) -> None:
    def ended() -> bool:
        with connect(stage.settings.database) as conn:
            campaign = db.get_campaign(conn, campaign_id)
            return campaign is not None and campaign.state in ("done", "stopped")

    def describe() -> str:
        with connect(stage.settings.database) as conn:
            text = commands.format_status(commands.status(conn, campaign_id))
        return f"{text}\n{running.tail()}"

    wait_until(ended, PROCESS_SECONDS, describe)


def assert_processed_once_by(
    stage: CrashStage, campaign_id: str, refs: list[EpisodeRef], planned: dict
) -> dict[str, list[DagsterRun]]:
    """Done; every episode succeeded at its first attempt, its record the campaign's version
    and its run the ledger's, its frames written once; one successful campaign run each."""
    with connect(stage.settings.database) as conn:
        result = commands.status(conn, campaign_id)
        assert result["state"] == "done", commands.format_status(result)
        assert result["counts"]["succeeded"] == len(refs)
        assert result["report"]["canary"] == "passed"
        rows = {
            row.ref: row
            for wave in range(result["waves_started"])
            for row in db.wave_rows(conn, campaign_id, wave)
        }
        assert set(rows) == set(refs)
        assert {row.attempts for row in rows.values()} == {1}
        for ref in refs:
            record = output_record(conn, ref)
            assert record["code_version"] == planned["target_code_version"]
            assert record["run_id"] == rows[ref].run_id
            assert frame_rows(conn, ref) == FPS  # written once
        assert commands.plan(conn, new_settings_of(planned), planned["args"])["episodes"] == 0
    with DagsterInstance.from_config(str(stage.dagster_home)) as instance:
        runs = instance.get_runs(RunsFilter(tags={CAMPAIGN_TAG: campaign_id}))
        by_episode: dict[str, list[DagsterRun]] = {}
        for run in runs:
            by_episode.setdefault(run.tags[PARTITION_TAG], []).append(run)
        episodes = {key: found for key, found in by_episode.items() if "/" in key}
        assert sorted(episodes) == sorted(ref.partition_key for ref in refs)
        statuses_ = {key: [run.status for run in found] for key, found in episodes.items()}
        assert all(s == [DagsterRunStatus.SUCCESS] for s in statuses_.values()), statuses_
        return by_episode


# A child of the test: `episode-pipeline process` over several episodes in one process.
PROCESS_EPISODES = """
import sys
from episode_pipeline.episodes.keys import parse_partition_key
from episode_pipeline.runner import process_episode
for key in sys.argv[1:]:
    outcome = process_episode(parse_partition_key(key), quiet=True)
    if not outcome:
        sys.exit(f"{key}: {outcome.errors}")
"""


def process_as_the_old_code(stage: CrashStage, refs: list[EpisodeRef]) -> None:
    """Every episode processed in-process (no daemon, no run queue) in the environment of the
    `ultrafast` deployment; in two processes, one a core, as the queue's two slots would. Not a
    multiprocessing pool: its resource tracker ignores SIGTERM and holds the stack's stop 10 s."""
    env = {**stage.env, **preset_env("ultrafast")}
    keys = [ref.partition_key for ref in refs]
    logs = [stage.logs / f"old-code-{i}.log" for i in range(2)]
    children = []
    try:
        for i, log in enumerate(logs):
            with log.open("wb") as out:
                command = [sys.executable, "-c", PROCESS_EPISODES, *keys[i::2]]
                children.append(
                    subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=out)
                )
        codes = [child.wait(PROCESS_SECONDS) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(30)  # SIGKILLed: it goes at once
    assert codes == [0, 0], "\n".join(log.read_text(errors="replace")[-3000:] for log in logs)


def runs_outside_campaigns(stage: CrashStage, refs: list[EpisodeRef]) -> set[str]:
    keys = [ref.partition_key for ref in refs]
    with DagsterInstance.from_config(str(stage.dagster_home)) as instance:
        runs = instance.get_runs(RunsFilter(tags={PARTITION_TAG: keys}))
    return {run.run_id for run in runs if CAMPAIGN_TAG not in run.tags}


def statuses(stage: CrashStage, refs: list[EpisodeRef]) -> list[str]:
    with connect(stage.settings.database) as conn:
        return [episode_row(conn, ref)["status"] for ref in refs]


@pytest.mark.slow(seconds=500)  # 441-583 s alone on 2 cores (docs/testing.md)
@pytest.mark.timeout(4 * PROCESS_SECONDS)
def test_a_campaign_killed_mid_wave_brings_every_episode_to_the_new_code_version_once(
    stage: CrashStage, archive: Path
) -> None:
    tag = uuid.uuid4().hex[:6]
    refs = [EpisodeRef(f"camp-{tag}-{i % ORGS}", f"camp-{tag}-ep-{i}") for i in range(EPISODES)]

    # The fleet as the old code left it: uploaded (each upload queues its message), processed.
    for ref in refs:
        upload_episode(archive, ref, stage.settings)
    process_as_the_old_code(stage, refs)
    assert set(statuses(stage, refs)) == {"processed"}
    old_runs = runs_outside_campaigns(stage, refs)
    assert len(old_runs) == EPISODES  # one run each
    with connect(stage.settings.database) as conn:
        old_versions = {output_record(conn, ref)["code_version"] for ref in refs}
    assert len(old_versions) == 1

    new_settings = preset_settings(stage.settings, "superfast")
    campaign_id, planned = start_campaign(
        stage, new_settings, refs, f"test {tag}", "--wave-size", "8", "--canary-episodes", "2"
    )
    assert planned["target_code_version"] not in old_versions
    planned["settings"] = new_settings

    # K = 1, and a SIGKILL of the daemon once wave 1 is claimed, before its backfill exists.
    armed = daemon(
        stage, "campaign-armed", "superfast", armed=AFTER_CLAIM, about=f"{campaign_id}.w1"
    )
    try:
        wait_until(armed.marker.exists, PROCESS_SECONDS, lambda: armed.tail())
        armed.crash()
    finally:
        if armed.process.poll() is None:
            armed.stop()
    with DagsterInstance.from_config(str(stage.dagster_home)) as instance:
        assert instance.get_backfill(wave_backfill_id(campaign_id, 1)) is None  # killed before it
    clean = daemon(stage, "campaign-restarted", "superfast")
    try:
        wait_for_the_end(stage, campaign_id, clean)
    finally:
        clean.stop()
    assert_processed_once_by(stage, campaign_id, refs, planned)
    with DagsterInstance.from_config(str(stage.dagster_home)) as instance:
        titles = {backfill.title for backfill in instance.get_backfills()}
    assert {f"test {tag} · wave 0 (canary)", f"test {tag} · wave 1"} <= titles

    # K = 5: the same episodes to the next version, five to a batch run (one task each).
    k5_settings = preset_settings(stage.settings, "veryfast")
    campaign_id, planned = start_campaign(
        stage, k5_settings, refs, f"test {tag} k5", "--episodes-per-run", "5", "--wave-size", "10"
    )
    planned["settings"] = k5_settings
    batched = daemon(stage, "campaign-k5", "veryfast")
    try:
        wait_for_the_end(stage, campaign_id, batched)
    finally:
        batched.stop()
    by_partition = assert_processed_once_by(stage, campaign_id, refs, planned)
    batch_runs = {key: runs for key, runs in by_partition.items() if "/" not in key}
    assert all(key.startswith(f"{campaign_id}.w") for key in batch_runs)
    # Batch runs of up to five episodes (the canary's of one): far fewer tasks than episodes.
    assert len(batch_runs) < EPISODES / 2, sorted(batch_runs)
    # The uploads' messages were the old runs': deleted by the sensor, never a run of their own.
    assert runs_outside_campaigns(stage, refs) == old_runs
    assert depth(stage.queue) == (0, 0) and depth(stage.dlq) == (0, 0)
