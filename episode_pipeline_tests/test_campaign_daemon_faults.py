"""Issue 32, findings 2 and 7, through the real daemon: three one-episode campaigns on one
`dagster-daemon run` whose instance is production's dagster.yaml but for the local instance's
named differences (`run_retries` and run monitoring production's) and its run launcher,
production's `EcsRunLauncher` with a STUB ECS client (support/ecs.py, `RefusingEcsRunLauncher`:
ECS never throttles or runs out of capacity on demand).

- Finding 2: ECS refuses each of two campaigns' first run, RunTask throttled for one and no
  capacity for the other, as boto3 and dagster-aws raise; the run queue fails the run with the
  launcher's exception in an engine event. The governor halves and pauses the campaign, the row
  uses up no attempt, and run_retries' retry, launched by the local launcher, finishes it.
- Finding 7: a wave whose backfill ends without runs (the campaign's selection names an asset a
  deploy removed, so the backfill daemon cannot load the job for it and fails the backfill) is
  released as an attempt with backoff, claimed again, and rejected with the cause once out of
  attempts; `campaign status` says so.

The three run at once (one daemon, about two minutes): a wave waits for Dagster's backfill daemon
(an iteration every 30 s) and a failed backfill takes two (failing, then failed).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from datetime import datetime

import pytest
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

from episode_pipeline.campaign.ledger import NO_RUN
from episode_pipeline.campaign.progress import ALL_REJECTED
from episode_pipeline.commands import campaign as commands
from episode_pipeline.db import campaigns as db
from episode_pipeline.db.connection import connect
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_tags import CAMPAIGN_TAG
from episode_pipeline.local import aws_setup
from episode_pipeline.local.dagster_home import Difference
from episode_pipeline.local.upload import upload_episode
from episode_pipeline.orchestration.campaigns import wave_backfill_id
from episode_pipeline.orchestration.run_errors import run_error
from episode_pipeline.runtime.failure_causes import NO_CAPACITY, THROTTLED, classify_error
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline_tests.support.campaigns import start_campaign
from episode_pipeline_tests.support.daemon import (
    CrashStage,
    Daemon,
    kill_leftovers,
    local_instance_stage,
    wait_until,
)
from episode_pipeline_tests.support.dagster_internals import PARENT_RUN_ID_TAG, BulkActionStatus
from episode_pipeline_tests.support.ecs import ecs_refusing_launcher

# One unit for xdist: both tests read the module's one daemon and its campaigns (each `slow`
# test is otherwise a unit of its own, suite.py); equal `slow` seconds keep them adjacent.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("campaign-daemon-faults")]

TAG = uuid.uuid4().hex[:6]
REFUSED = {f"ecs-throttled-{TAG}": THROTTLED, f"ecs-no-capacity-{TAG}": NO_CAPACITY}
GONE = f"gone-asset-{TAG}"  # finding 7's campaign's org
# An asset the campaign was started with and a deploy removed since.
REMOVED_ASSET = "hls_renditions_v0"
PAUSE_SECONDS = 10  # the governor's pause (no Retry-After from ECS)
RETRY_BASE_SECONDS = 5  # a released claim's backoff, at its first attempt (plus 1 s of jitter)
WAIT_SECONDS = 600  # a loaded machine is slow (docs/testing.md)
SLOW_SECONDS = 180  # the module: about 3 min at a load of 7 on 2 cores


@dataclasses.dataclass
class Faults:
    stage: CrashStage
    daemon: Daemon
    instance: DagsterInstance
    refused: dict[str, str]  # campaign id → the refusal its first run met
    gone: str  # finding 7's campaign id
    runs: dict[str, DagsterRun] = dataclasses.field(default_factory=dict)
    errors: dict[str, str] = dataclasses.field(default_factory=dict)

    def watch(self) -> None:
        """Every run of the campaigns as last seen, and a failed one's error (the prune deletes
        a settled episode's runs and their events)."""
        for campaign_id in [*self.refused, self.gone]:
            for run in self.instance.get_runs(RunsFilter(tags={CAMPAIGN_TAG: campaign_id})):
                self.runs[run.run_id] = run
                if run.status == DagsterRunStatus.FAILURE and run.run_id not in self.errors:
                    self.errors[run.run_id] = run_error(self.instance, run)

    def ended(self, *campaign_ids: str) -> bool:
        self.watch()
        with connect(self.stage.settings.database) as conn:
            states = [db.get_campaign(conn, campaign_id) for campaign_id in campaign_ids]
        return all(c is not None and c.state == "done" for c in states)

    def describe(self) -> str:
        with connect(self.stage.settings.database) as conn:
            texts = [
                commands.format_status(commands.status(conn, campaign_id))
                for campaign_id in [*self.refused, self.gone]
            ]
        return "\n".join([*texts, self.daemon.tail()])


@pytest.fixture(scope="module")
def stage(
    crash_stage: CrashStage, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CrashStage]:
    differences = {
        "run_launcher": Difference(
            ecs_refusing_launcher({org: kind for org, kind in REFUSED.items()}),
            "production's EcsRunLauncher, its ECS client a stub refusing a listed org's runs "
            "but run_retries' retries; the other runs in a worker process, as locally",
        )
    }
    home = tmp_path_factory.mktemp("daemon-faults-dagster")
    yield local_instance_stage(crash_stage, home, differences)
    kill_leftovers({str(home)})


@pytest.fixture(scope="module")
def faults(stage: CrashStage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Faults]:
    archive = tmp_path_factory.mktemp("daemon-faults-sample") / "take.tar.zst"
    write_sample(archive, SampleSpec(seconds=1.0, cameras=1))
    orgs = [*REFUSED, GONE]
    for org in orgs:  # never processed: `--stale` selects it, with no baseline to compare
        upload_episode(archive, EpisodeRef(org, f"{org}-ep"), stage.settings)
    # The uploads' events were handled long ago: only the campaigns run them.
    aws_setup.client("sqs", stage.settings.aws.endpoint_url).purge_queue(
        QueueUrl=stage.queue.queue_url
    )
    pacing = dataclasses.replace(
        stage.settings.campaign,
        pause_seconds=float(PAUSE_SECONDS),
        max_attempts=2,
        retry_base_seconds=float(RETRY_BASE_SECONDS),
    )
    settings = dataclasses.replace(stage.settings, campaign=pacing)
    ids = {}
    with (
        connect(stage.settings.database) as conn,
        DagsterInstance.from_config(str(stage.dagster_home)) as instance,
    ):
        for org in orgs:
            argv = ["--org", org, "--stale", "--name", org, "--canary-episodes", "1"]
            # K = 1: a run is an episode's, tagged with its org (the stub refuses by org).
            argv += ["--episodes-per-run", "1", "--whole-graph", "--accept-no-baseline"]
            ids[org], _ = start_campaign(conn, instance, settings, argv, jitter_seconds=1.0)
        # Finding 7: the campaign's selection names an asset the code location no longer has.
        conn.execute(
            "UPDATE campaigns SET selection = selection || jsonb_build_object('assets',"
            " jsonb_build_array(%s::text)) WHERE id = %s",
            (REMOVED_ASSET, ids[GONE]),
        )
        conn.commit()
    env = {**stage.env, "CAMPAIGN_TICK_SECONDS": "2", "AWS_DEFAULT_REGION": aws_setup.REGION}
    daemon = Daemon(dataclasses.replace(stage, env=env), "daemon-faults")
    try:
        with DagsterInstance.from_config(str(stage.dagster_home)) as instance:
            yield Faults(
                stage,
                daemon,
                instance,
                refused={ids[org]: kind for org, kind in REFUSED.items()},
                gone=ids[GONE],
            )
    finally:
        daemon.stop()


def backoffs(decisions: list[dict]) -> list[dict]:
    """The governor's halvings with a pause."""
    return [
        d
        for d in decisions
        if d["kind"] == "governor"
        and d["details"]["limit_after"] < d["details"]["limit_before"]
        and d["details"]["paused_until"]
    ]


@pytest.mark.slow(seconds=SLOW_SECONDS)
@pytest.mark.timeout(1200)
def test_an_ecs_launch_refused_pauses_its_campaign_and_uses_up_no_attempt(faults: Faults) -> None:
    """Finding 2: the refused run's error is read from the run queue's engine event (the run's
    own failure message is generic), classified as backpressure: the governor halves and
    pauses; the ledger row waits for run_retries' retry, which succeeds, and ends `succeeded`
    at its first attempt."""
    wait_until(lambda: faults.ended(*faults.refused), WAIT_SECONDS, faults.describe)
    with connect(faults.stage.settings.database) as conn:
        for campaign_id, kind in faults.refused.items():
            text = commands.format_status(commands.status(conn, campaign_id))
            runs = [r for r in faults.runs.values() if r.tags[CAMPAIGN_TAG] == campaign_id]
            (refused,) = [r for r in runs if PARENT_RUN_ID_TAG not in r.tags]
            assert refused.status == DagsterRunStatus.FAILURE, text
            assert classify_error(faults.errors[refused.run_id]) == kind, faults.errors
            (retry,) = [r for r in runs if r.tags.get(PARENT_RUN_ID_TAG) == refused.run_id]
            # Last seen STARTED when the prune deleted it between two looks: the ledger, which
            # read it ended, names it as the run that decided the episode (below).
            assert retry.status == DagsterRunStatus.SUCCESS or (
                retry.status == DagsterRunStatus.STARTED
                and faults.instance.get_run_by_id(retry.run_id) is None
            ), text
            decisions = db.decisions(conn, campaign_id, limit=100)
            halved = backoffs(decisions)
            assert halved and halved[0]["message"].startswith(f"{kind}:"), text
            assert f"paused {PAUSE_SECONDS} s" in halved[0]["message"], text
            ((state, attempts, error_class, run_id),) = conn.execute(
                "SELECT state, attempts, error_class, run_id FROM campaign_episodes"
                " WHERE campaign_id = %s",
                (campaign_id,),
            ).fetchall()
            # Backpressure is no attempt: the one counted is the retry's success.
            assert (state, attempts, error_class, run_id) == ("succeeded", 1, None, retry.run_id)


@pytest.mark.slow(seconds=SLOW_SECONDS)
@pytest.mark.timeout(1200)
def test_a_wave_whose_backfill_ends_without_runs_is_released_as_attempts_then_rejected(
    faults: Faults,
) -> None:
    """Finding 7: each release of the wave whose backfill failed is an attempt with backoff;
    out of attempts the row is `rejected` with the cause, and `campaign status` names it (the
    campaign done with every episode rejected: no silent stop)."""
    campaign_id = faults.gone
    wait_until(lambda: faults.ended(campaign_id), WAIT_SECONDS, faults.describe)
    with connect(faults.stage.settings.database) as conn:
        result = commands.status(conn, campaign_id)
        text = commands.format_status(result)
        decisions = db.decisions(conn, campaign_id, limit=100)
        ((state, attempts, error_class, last_error),) = conn.execute(
            "SELECT state, attempts, error_class, last_error FROM campaign_episodes"
            " WHERE campaign_id = %s",
            (campaign_id,),
        ).fetchall()
    assert not [r for r in faults.runs.values() if r.tags[CAMPAIGN_TAG] == campaign_id]
    for wave in (0, 1):  # the daemon failed each wave's backfill: it could not load the job
        backfill = faults.instance.get_backfill(wave_backfill_id(campaign_id, wave))
        assert backfill is not None and backfill.status == BulkActionStatus.FAILED, text
    assert (state, attempts, error_class) == ("rejected", 2, NO_RUN), text
    assert "wave 1's backfill" in last_error and "ended FAILED (2 attempts)" in last_error
    releases = [d for d in decisions if d["message"].startswith("released")]
    assert [("of wave 0" in d["message"], "1 rejected" in d["message"]) for d in releases] == [
        (True, False),
        (False, True),
    ], text
    # The first release's backoff: wave 1 was claimed no sooner.
    (claimed,) = [d for d in decisions if d["kind"] == "wave" and d["details"]["wave"] == 1]
    waited = datetime.fromisoformat(claimed["at"]) - datetime.fromisoformat(releases[0]["at"])
    assert waited.total_seconds() >= RETRY_BASE_SECONDS, text
    assert result["state"] == "done" and result["stalled"]["cause"] == ALL_REJECTED, text
    assert f"STALLED ({ALL_REJECTED})" in text and f"errors {NO_RUN}: 1" in text, text
