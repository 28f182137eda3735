"""The campaign soak (issue 32, deliverable 4): one campaign over real episodes on the local stack,
the real daemon, and during it every failure the ledger must survive. At K = 1 (one episode a
run) and at K = 5 (batch runs).

The fleet as the old code left it: four 1-second, 1-camera episodes of three orgs, uploaded and
processed in-process (`episode-pipeline process`'s path, no daemon) with the transcode preset
`ultrafast`, into an ephemeral Dagster instance: their runs and partitions are not in the
campaign's instance, as retention leaves an old fleet. Their figures (renditions, durations,
frame rows) are read before the campaign. Two more episodes are broken archives it never
processed, and a row `a b` is in the selection; the queue's events are gone (handled long ago).
The campaign (`--stale --since`, preset `superfast`) runs on a `dagster-daemon run` whose
instance is production's dagster.yaml but for the local instance's named differences
(`run_retries` and run monitoring on) and `SOAK_DIFFERENCES` (run monitoring polls every 5 s,
not 60), its S3 through the fault proxy. During it:

- the daemon is SIGKILLed at `campaign.after_claim` of wave 1 (its claims committed, no backfill)
  and stays down longer than `CAMPAIGN_STALE_CLAIM_SECONDS`: the restarted daemon records wave 1's
  backfill, finds its claims stale while the backfill is still requested, cancels it and releases
  them once it ended (finding 6: never two runs of an episode);
- a fresh upload arrives during the outage, processed by the uploads sensor at the restart;
- a run worker is SIGKILLed mid-extraction; `run_retries` retries it (finding 1: the ledger
  settles by the run lineage; at K = 5 the batch's retry runs only the episodes no earlier
  attempt ended, never one the ledger already settled);
- S3 answers `503 SlowDown` with `Retry-After` to every playlist PUT of one of the three
  episodes after the canary for a while, on every retry: `hls_renditions` retries then fails the
  run, leaving the old HLS (finding 0), and the governor halves and pauses;
- an episode of the campaign is uploaded again while its campaign run works: the upload's run
  waits for it (finding 8);
- the corrupt archives fail and are `rejected` with their cause, their partitions pruned
  (findings 3, 9); `a b` is skipped and counted at start (finding 4).

It ends with every good episode processed once by the new code version, its outputs whole, the
campaign's live partitions within a wave, and nothing queued.

What the real daemon cannot show in the time: the stale claim's release is timed by Dagster's
backfill daemon (an iteration every 30 s). The restarted daemon records wave 1's backfill on its
first tick and cancels it on its second, both normally before the backfill daemon's second
iteration; on a machine so loaded that the code server takes longer than that to load, the
backfill submits wave 1's runs first and the cancel is not needed (the test then fails on the
missing cancel decision, naming it, rather than passing without finding 6).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunRecord, RunsFilter

from episode_pipeline.campaign import canary
from episode_pipeline.cli import build_parser
from episode_pipeline.commands import campaign as commands
from episode_pipeline.config.settings import Settings
from episode_pipeline.dagster_compat import (
    PARENT_RUN_ID_TAG,
    WILL_RETRY_TAG,
    BulkActionStatus,
)
from episode_pipeline.db import campaigns as db
from episode_pipeline.db.connection import connect
from episode_pipeline.db.episodes import episode_row, frame_rows
from episode_pipeline.db.outputs import output_record
from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_tags import (
    ABANDONED_TAG,
    BATCH_JOB_NAME,
    BATCH_TAG,
    CAMPAIGN_TAG,
    CAMPAIGN_WAVE_TAG,
    IN_FLIGHT_STATUSES,
    PARTITION_TAG,
)
from episode_pipeline.local import aws_setup
from episode_pipeline.local.upload import upload_episode
from episode_pipeline.orchestration.batches import ABANDONED_BY_RETRY
from episode_pipeline.orchestration.campaigns import AFTER_CLAIM, wave_backfill_id
from episode_pipeline.runtime.failure_causes import THROTTLED
from episode_pipeline.runtime.injection_points import MID_EXTRACTION, release
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.video.playlist import parse_master, parse_playlist
from episode_pipeline_tests.fault_proxy import FaultPlan, FaultProxy
from episode_pipeline_tests.support.daemon import (
    REPO,
    CrashStage,
    Daemon,
    kill_leftovers,
    soak_config,
    wait_until,
)
from episode_pipeline_tests.support.dagster_internals import BACKFILL_ID_TAG
from episode_pipeline_tests.support.queues import depth

pytestmark = pytest.mark.integration

FPS = 30
ORGS = 3  # the local run queue runs one run per org at a time
# Episode i of org i % ORGS; the selection's order (org, id) makes ep-0 the canary. Of the three
# good ones after it, one is throttled, one has its worker killed, one is uploaded again.
GOOD = 4
CANARY, THROTTLED_EPISODES, KILLED, REUPLOADED = 0, (1,), 2, 3
CORRUPT = (4, 5)
# Longer than a backfill daemon iteration (30 s, Dagster's, not configurable) and a run's
# queueing, so a live wave is never stale. The outage is as long: the restarted daemon ticks
# only after its start (5-10 s more), so wave 1's claim is stale at its first tick.
STALE_CLAIM_SECONDS = 45
OUTAGE_SECONDS = STALE_CLAIM_SECONDS
RETRY_AFTER = 7  # S3's Retry-After: the step's retry waits it, and so does the governor
# The incident: every refused PUT is refused again until it ends. It covers the step's two tries
# (RETRY_AFTER apart, with the transcode again: 10-15 s) and ends before the episode's next run
# can reach its playlists (the step's wait, the driver's tick, the governor's pause, the claim, a
# backfill iteration, the run's start and steps: at the earliest about 27 s), so one run is
# throttled.
THROTTLE_SECONDS = 21
WAIT_SECONDS = 900  # each wait; a loaded machine is slow (docs/testing.md)
VISIBILITY_SECONDS = 180  # an upload's message hidden while its run works (the heartbeat renews)
# Above the run queue's 2 slots, so a wave is claimed while the last one's runs still queue.
CONCURRENCY = "8"


def preset_settings(settings: Settings, preset: str) -> Settings:
    video = dataclasses.replace(settings.transcode.video, preset=preset, ladder_preset=preset)
    return dataclasses.replace(
        settings, transcode=dataclasses.replace(settings.transcode, video=video)
    )


def campaign_settings(settings: Settings) -> Settings:
    """The new code's settings; the campaign keeps these pacing rules from its start: claims
    stale after STALE_CLAIM_SECONDS, retries after about a second (plus the ledger's jitter),
    production's three attempts: wave 1's release is the first, and at K = 5 Dagster's race
    (`assert_run_history`) makes the killed worker's failure the second, so the episode's
    success is its third. A corrupt archive is rejected at its first run, whatever its count."""
    pacing = dataclasses.replace(
        settings.campaign,
        stale_claim_seconds=float(STALE_CLAIM_SECONDS),
        max_attempts=3,
        retry_base_seconds=1.0,
    )
    return dataclasses.replace(preset_settings(settings, "superfast"), campaign=pacing)


def preset_env(preset: str) -> dict[str, str]:
    return {
        "TRANSCODE_PRESET": preset,
        "TRANSCODE_LADDER_PRESET": preset,
        "CAMPAIGN_TICK_SECONDS": "2",
    }


@pytest.fixture(scope="module")
def stage(
    crash_stage: CrashStage, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CrashStage]:
    """The crash stage's database read by the local instance itself: production's dagster.yaml
    but for `local_differences` and `SOAK_DIFFERENCES` (test_instance_config.py), so
    `run_retries` and run monitoring are production's; none of the crash tests' differences."""
    home = tmp_path_factory.mktemp("soak-dagster")
    crash = yaml.safe_load((crash_stage.dagster_home / "dagster.yaml").read_text())
    url = crash["run_storage"]["config"]["postgres_url"]
    (home / "dagster.yaml").write_text(yaml.safe_dump(soak_config(url)))
    # The crash tests' 24-s visibility is for a redelivery they wait for; the soak waits for
    # none, and on a loaded machine (load 15-22) the serial sensors' heartbeat missed it three
    # times, so a succeeded upload's message went to the DLQ.
    aws_setup.client("sqs", crash_stage.settings.aws.endpoint_url).set_queue_attributes(
        QueueUrl=crash_stage.queue.queue_url,
        Attributes={"VisibilityTimeout": str(VISIBILITY_SECONDS)},
    )
    env = {
        **crash_stage.env,
        "DAGSTER_HOME": str(home),
        "SQS_VISIBILITY_TIMEOUT_SECONDS": str(VISIBILITY_SECONDS),
    }
    yield dataclasses.replace(crash_stage, dagster_home=home, env=env)
    kill_leftovers({str(home)})  # what the SIGKILLs spared: crash_stage's looks for its own


def sample(folder: Path, seed: int) -> Path:
    out = folder / "take.tar.zst"
    write_sample(out, SampleSpec(seconds=1.0, cameras=1, fps=FPS, seed=seed))
    return out


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample(tmp_path_factory.mktemp("soak-sample"), seed=0)


@pytest.fixture(scope="module")
def retake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another take of the same length: a re-upload is a new object version (another ETag), not
    a redelivery of the old one (which would join the run in flight)."""
    return sample(tmp_path_factory.mktemp("soak-retake"), seed=1)


# A child of the test: `episode-pipeline process` over several episodes in one process, into an
# ephemeral Dagster instance (the old fleet's runs and partitions are not the campaign's).
PROCESS_EPISODES = """
import sys
from dagster import DagsterInstance
from episode_pipeline.episodes.keys import parse_partition_key
from episode_pipeline.runner import process_episode
with DagsterInstance.ephemeral() as instance:
    for key in sys.argv[1:]:
        outcome = process_episode(parse_partition_key(key), instance, quiet=True)
        if not outcome:
            sys.exit(f"{key}: {outcome.errors}")
"""


def process_as_the_old_code(stage: CrashStage, refs: list[EpisodeRef]) -> None:
    """Every episode processed in-process in the environment of the `ultrafast` deployment, in
    two processes, one a core. Not a multiprocessing pool: its resource tracker ignores SIGTERM
    and holds the stack's stop 10 s."""
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
        codes = [child.wait(WAIT_SECONDS) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(30)
    assert codes == [0, 0], "\n".join(log.read_text(errors="replace")[-3000:] for log in logs)


def start_campaign(
    stage: CrashStage, settings: Settings, since: datetime, name: str, per_run: int
) -> tuple[str, dict[str, Any]]:
    argv = ["campaign", "start", "--stale", "--since", since.isoformat(), "--name", name]
    argv += ["--concurrency", CONCURRENCY, "--wave-size", "8", "--canary-episodes", "1"]
    # The whole graph: the broken archives must be read again to be rejected and the worker is
    # killed mid-extraction; a preset change alone would run only `hls_renditions` and after,
    # and would claim the never-processed broken archives first (as the canary).
    argv += ["--episodes-per-run", str(per_run), "--whole-graph"]
    args = build_parser().parse_args(argv)
    with connect(stage.settings.database) as conn:
        planned = commands.plan(conn, settings, args)
        # The ledger's retry jitter (up to 30 s, a rule, not a setting) cut to 2 s: the released
        # and the throttled claims come back within seconds, not spread over half a minute.
        planned["config"]["retry"]["jitter_seconds"] = 2.0
        query, params, selection = planned.pop("_query")
        with DagsterInstance.from_config(str(stage.dagster_home)) as instance:
            campaign_id, _ = commands.start(conn, instance, planned, query, params, selection, args)
        conn.commit()
    return campaign_id, planned


@dataclasses.dataclass
class Ledger:
    state: str
    attempts: int
    last_error: str | None
    error_class: str | None
    run_id: str | None


def ledger_rows(stage: CrashStage, campaign_id: str) -> dict[EpisodeRef, Ledger]:
    with connect(stage.settings.database) as conn:
        rows = conn.execute(
            "SELECT org_id, episode_id, state, attempts, last_error, error_class, run_id"
            " FROM campaign_episodes WHERE campaign_id = %s",
            (campaign_id,),
        ).fetchall()
    return {EpisodeRef(org, ep): Ledger(*rest) for org, ep, *rest in rows}


def hls_playlists(bucket: Bucket, ref: EpisodeRef) -> dict[str, bytes]:
    return {key: bucket.get_bytes(key) for key in bucket.list_keys(ref.hls_root, ".m3u8")}


def assert_whole(playlists: dict[str, bytes]) -> None:
    assert any(key.endswith("/master.m3u8") for key in playlists), sorted(playlists)
    for key, data in playlists.items():
        parsed = parse_master(data.decode()) if key.endswith("/master.m3u8") else None
        assert parsed or parse_playlist(data.decode()), key


class Soak:
    """What the test watches while the campaign runs (every second): the live partitions stay
    within a wave; a throttled episode's earlier HLS is whole once its run failed (finding 0)."""

    def __init__(
        self,
        stage: CrashStage,
        instance: DagsterInstance,
        campaign_id: str,
        throttled: list[EpisodeRef],
    ) -> None:
        self.stage, self.instance, self.campaign_id = stage, instance, campaign_id
        self.bucket = Bucket(stage.settings.bucket, stage.settings.aws)
        self.before = {ref: hls_playlists(self.bucket, ref) for ref in throttled}
        self.seen_throttled: set[EpisodeRef] = set()
        self.most_live = 0
        # Every campaign run as last seen: the prune deletes a settled episode's runs.
        self.records: dict[str, RunRecord] = {}

    @contextlib.contextmanager
    def watched(self, every: float = 1.0) -> Iterator[None]:
        """Watch in the background too, every `every` seconds: a wait's condition may block (a
        worker's hold, a kill) while a run ends and its settled episode is pruned, which would
        leave that run as last seen in flight (found in a fresh-clone run)."""
        stop = threading.Event()
        failures: list[AssertionError] = []

        def loop() -> None:
            while not stop.wait(every):
                try:
                    self.watch()
                except AssertionError as failure:  # finding 0's check: raised at the end
                    failures.append(failure)
                    return
                except Exception:  # a read during a daemon restart: the next look
                    continue

        watcher = threading.Thread(target=loop, name="soak-watch", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            stop.set()
            watcher.join(60)
        if failures:
            raise failures[0]

    def watching(self, condition: Callable[[], bool]) -> Callable[[], bool]:
        """`condition`, the campaign watched before each look."""

        def check() -> bool:
            self.watch()
            return condition()

        return check

    def runs(self) -> list[DagsterRun]:
        return [record.dagster_run for record in self.records.values()]

    def watch(self) -> None:
        campaign = RunsFilter(tags={CAMPAIGN_TAG: self.campaign_id})
        for record in self.instance.get_run_records(campaign):
            self.records[record.dagster_run.run_id] = record
        with connect(self.stage.settings.database) as conn:
            self.most_live = max(self.most_live, db.live_added_partitions(conn, self.campaign_id))
        for ref, row in ledger_rows(self.stage, self.campaign_id).items():
            failed = row.error_class == THROTTLED and row.state == "failed"
            if ref in self.before and failed and ref not in self.seen_throttled:
                # Finding 0: the run failed on S3 and removed nothing; the playlists (every PUT
                # of them refused) are the old code's, whole.
                assert hls_playlists(self.bucket, ref) == self.before[ref]
                assert_whole(self.before[ref])
                self.seen_throttled.add(ref)

    def done(self) -> bool:
        self.watch()
        with connect(self.stage.settings.database) as conn:
            campaign = db.get_campaign(conn, self.campaign_id)
        return campaign is not None and campaign.state in ("done", "stopped")

    def describe(self, daemon: Daemon) -> str:
        with connect(self.stage.settings.database) as conn:
            text = commands.format_status(commands.status(conn, self.campaign_id))
        return f"{text}\n{daemon.tail()}"


# At K = 5 a wave holds one batch run; when the backfill daemon marks that backfill
# COMPLETED_FAILED before run_retries reads the killed batch run, run_retries does not retry it
# ("Not retrying run since it is part of a backfill that is in a terminal state"): the driver
# then settles the failure once the backfill has ended and the episode runs in a later wave
# (`assert_run_history` accepts either path, docs/testing.md).
@pytest.mark.parametrize(
    "per_run",
    [pytest.param(k, marks=pytest.mark.slow(seconds=600), id=f"K{k}") for k in (1, 5)],
)
@pytest.mark.timeout(1800)  # 10-19 min at load 8-22 (docs/testing.md), 6-7 min at load 2-4
def test_a_campaign_survives_a_daemon_outage_a_killed_worker_throttled_s3_and_corrupt_archives(
    stage: CrashStage, archive: Path, retake: Path, tmp_path: Path, per_run: int
) -> None:
    tag = uuid.uuid4().hex[:6]
    count = GOOD + len(CORRUPT)
    refs = [EpisodeRef(f"soak-{tag}-{i % ORGS}", f"soak-{tag}-ep-{i}") for i in range(count)]
    good = [refs[i] for i in range(GOOD)]
    corrupt = [refs[i] for i in CORRUPT]
    throttled = [refs[i] for i in THROTTLED_EPISODES]
    killed, reuploaded = refs[KILLED], refs[REUPLOADED]
    fresh = EpisodeRef(f"soak-{tag}-new", f"soak-{tag}-fresh")
    garbage = tmp_path / "take.tar.zst"
    garbage.write_bytes(b"not an archive" * 64)
    since = datetime.now(UTC)

    # The fleet as the old code left it, and two broken archives it never processed (finding
    # 3: `--stale` selects every never-recorded episode, a fleet's broken archives included).
    for ref in good:
        upload_episode(archive, ref, stage.settings)
    for ref in corrupt:
        upload_episode(garbage, ref, stage.settings)
    clock = Clock()
    process_as_the_old_code(stage, good)
    clock.mark("old code")
    with connect(stage.settings.database, autocommit=True) as conn:
        before = {ref: output_record(conn, ref) for ref in good}
        # A row the pipeline cannot key, in the selection (finding 4).
        conn.execute(
            "INSERT INTO episodes (id, org_id, status) VALUES (%s, %s, 'processed')",
            (f"a b {tag}", refs[0].org_id),
        )
    old_version = {record["code_version"] for record in before.values()}
    # The uploads' events were handled long ago.
    aws_setup.client("sqs", stage.settings.aws.endpoint_url).purge_queue(
        QueueUrl=stage.queue.queue_url
    )

    new_settings = campaign_settings(stage.settings)
    campaign_id, planned = start_campaign(stage, new_settings, since, f"soak {tag}", per_run)
    # Finding 4: the unkeyable row is skipped and counted at start, never claimed.
    assert planned["episodes"] == len(refs) and planned["skipped"] == 1, planned
    assert planned["target_code_version"] not in old_version
    home = str(stage.dagster_home)
    with DagsterInstance.from_config(home) as instance, contextlib.ExitStack() as watched:
        soak = Soak(stage, instance, campaign_id, throttled)
        watched.enter_context(soak.watched())

        # S3 through the proxy: a third of the episodes' playlist PUTs refused (503 SlowDown,
        # Retry-After) on every attempt, for THROTTLE_SECONDS from the first.
        throttled_roots = tuple(ref.hls_root for ref in throttled)
        plan = FaultPlan(
            refuse=lambda method, path: (
                method == "PUT"
                and path.endswith(".m3u8")
                and any(r in path for r in throttled_roots)
            ),
            refuse_seconds=THROTTLE_SECONDS,
            retry_after=RETRY_AFTER,
        )
        assert stage.settings.aws.endpoint_url is not None
        with FaultProxy(stage.settings.aws.endpoint_url, plan) as proxy:
            env = {
                **stage.env,
                **preset_env("superfast"),
                "AWS_ENDPOINT_URL": proxy.url,
                "S3_MAX_ATTEMPTS": "2",  # botocore gives up in about a second
                "TRANSCODE_STEP_RETRIES": "1",  # one retry of the step, after the Retry-After
            }
            daemon_stage = dataclasses.replace(stage, env=env)

            # The canary, then a SIGKILL once wave 1 is claimed, before its backfill is recorded.
            armed = Daemon(daemon_stage, f"soak-{per_run}-armed", AFTER_CLAIM, f"{campaign_id}.w1")
            try:
                wait_until(
                    soak.watching(armed.marker.exists), WAIT_SECONDS, lambda: soak.describe(armed)
                )
                armed.crash()
            finally:
                if armed.process.poll() is None:
                    armed.stop()
            clock.mark("canary and wave 1's claim")
            killed_at = time.monotonic()
            assert instance.get_backfill(wave_backfill_id(campaign_id, 1)) is None
            upload_episode(archive, fresh, stage.settings)  # a fresh upload during the outage
            time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - killed_at)))
            clock.mark("outage")

            # Restarted, its run workers armed: the killed episode's worker is held mid-extraction
            # until the test kills it, the re-uploaded episode's until its upload's run is queued.
            daemon = Daemon(
                daemon_stage,
                f"soak-{per_run}",
                MID_EXTRACTION,
                killed.partition_key,
                hold_run_at=(MID_EXTRACTION, reuploaded.partition_key),
            )
            try:
                strikes = Strikes(stage, instance, daemon, retake, reuploaded)
                wait_until(soak.watching(strikes.done), WAIT_SECONDS, lambda: soak.describe(daemon))
                clock.mark("release, next wave, worker killed, re-upload")
                wait_until(soak.done, WAIT_SECONDS, lambda: soak.describe(daemon))
                clock.mark("campaign done")
                wait_until(
                    soak.watching(lambda: quiet(stage, instance)),
                    WAIT_SECONDS,
                    lambda: soak.describe(daemon),
                )
                clock.mark("quiet")
                assert_the_end(stage, instance, soak, planned, refs, before)
                assert_run_history(stage, instance, soak, refs)
                if per_run > 1:
                    assert_batches(soak.runs(), campaign_id, refs)
                assert_uploads(stage, instance, soak, fresh, reuploaded)
            finally:
                daemon.stop()
                print(f"\nsoak K = {per_run}: {clock}\n{run_lines(soak.runs())}")

        # Finding 0 through the real daemon: S3 refused, and the throttled runs failed on it.
        assert plan.injected["refused"] >= 2 * 2, plan.injected  # 2 tries of the step x 2 attempts
        assert soak.seen_throttled, "no throttled run failed while S3 refused"
        # The live partitions the campaign added stayed within one wave (findings 3, 9).
        assert soak.most_live <= 8


class Strikes:
    """The run worker's SIGKILL and the re-upload, each when its run reaches its hold (in either
    order: at K = 5 both episodes may be in one batch run)."""

    def __init__(
        self,
        stage: CrashStage,
        instance: DagsterInstance,
        daemon: Daemon,
        archive: Path,
        reuploaded: EpisodeRef,
    ) -> None:
        self.stage, self.instance, self.daemon = stage, instance, daemon
        self.archive, self.reuploaded = archive, reuploaded
        self.worker_pid: int | None = None
        self.upload_run: DagsterRun | None = None
        self.uploaded = False

    def done(self) -> bool:
        if self.worker_pid is None and self.daemon.marker.exists():
            self.worker_pid = kill_held_worker(self.daemon.marker)
        if not self.uploaded and self.daemon.run_marker.exists():
            upload_episode(self.archive, self.reuploaded, self.stage.settings)
            self.uploaded = True
        if self.uploaded and self.upload_run is None:
            self.upload_run = next(iter(upload_runs(self.instance, self.reuploaded)), None)
            if self.upload_run is not None:
                # Finding 8: queued while the campaign run holds the episode, it stays queued.
                time.sleep(5)
                run = self.instance.get_run_by_id(self.upload_run.run_id)
                assert run is not None and run.status == DagsterRunStatus.QUEUED, run
                release(self.daemon.run_marker)
        return self.worker_pid is not None and self.upload_run is not None


def kill_held_worker(marker: Path) -> int:
    """SIGKILL the run worker held at the point (its pid is in the marker) and what it started:
    an OOM kill of the run's task."""
    pid = int(marker.read_text().split(" by pid ")[1].split()[0])
    worker = psutil.Process(pid)
    for process in [worker, *worker.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    return pid


def upload_runs(instance: DagsterInstance, ref: EpisodeRef) -> list[DagsterRun]:
    runs = instance.get_runs(RunsFilter(tags={PARTITION_TAG: ref.partition_key}))
    return [run for run in runs if CAMPAIGN_TAG not in run.tags]


def quiet(stage: CrashStage, instance: DagsterInstance) -> bool:
    """No run in flight, no message queued or in flight."""
    in_flight = instance.get_runs(RunsFilter(statuses=IN_FLIGHT_STATUSES))
    return not in_flight and depth(stage.queue) == (0, 0)


def runs_working_on(runs: list[DagsterRun], ref: EpisodeRef) -> list[DagsterRun]:
    """The campaign's runs doing the episode's work: its own, and its batches' (K > 1)."""
    own = [run for run in runs if run.tags.get(PARTITION_TAG) == ref.partition_key]
    batches = {run.tags[BATCH_TAG] for run in own if BATCH_TAG in run.tags}
    return own + [run for run in runs if run.tags.get(PARTITION_TAG) in batches]


def run_lines(runs: list[DagsterRun]) -> str:
    """Every run as the test saw it, one a line, with the tags that tell a retry, a batch's
    child and a backfill's run apart: what a failed end-state check is read with."""
    tags = (BACKFILL_ID_TAG, BATCH_TAG, PARENT_RUN_ID_TAG, WILL_RETRY_TAG, ABANDONED_TAG)
    return "\n".join(
        f"{run.run_id[:8]} {run.job_name} {run.tags.get(PARTITION_TAG)} {run.status.value} "
        + " ".join(f"{tag.split('/')[-1]}={run.tags[tag]}" for tag in tags if tag in run.tags)
        for run in runs
    )


class Clock:
    """When each phase of the soak ended, printed (`-s`) with its length: where the time goes."""

    def __init__(self) -> None:
        self.marks = [("start", time.monotonic())]

    def mark(self, phase: str) -> None:
        self.marks.append((phase, time.monotonic()))

    def __str__(self) -> str:
        return (
            ", ".join(
                f"{phase} {at - before:.0f} s"
                for (_, before), (phase, at) in zip(self.marks, self.marks[1:], strict=False)
            )
            + f"; in all {self.marks[-1][1] - self.marks[0][1]:.0f} s"
        )


def assert_the_end(
    stage: CrashStage,
    instance: DagsterInstance,
    soak: Soak,
    planned: dict[str, Any],
    refs: list[EpisodeRef],
    before: dict[EpisodeRef, dict[str, Any]],
) -> None:
    campaign_id = soak.campaign_id
    good, corrupt = list(before), [refs[i] for i in CORRUPT]
    rows = ledger_rows(stage, campaign_id)
    assert set(rows) == set(refs)  # `a b` never in the ledger (finding 4)
    with connect(stage.settings.database) as conn:
        result = commands.status(conn, campaign_id)
        text = commands.format_status(result)
        decisions = db.decisions(conn, campaign_id, limit=1000)
        assert result["state"] == "done", text
        assert result["counts"]["succeeded"] == len(good), text
        assert result["counts"]["rejected"] == len(corrupt), text
        assert result["report"]["canary"] == "passed", text
        for ref in good:
            record = output_record(conn, ref)
            assert record is not None and rows[ref].state == "succeeded"
            assert record["code_version"] == planned["target_code_version"]
            # Whole: the old code's renditions, durations and frame rows; frames written once.
            settings = canary.CanarySettings()
            assert canary.compare(before[ref]["figures"], record["figures"], settings) == []
            assert frame_rows(conn, ref) == FPS
        # Findings 3, 9: nothing the campaign added is left; the rejected ones' pruned too.
        assert db.live_added_partitions(conn, campaign_id) == 0
        for ref in corrupt:  # their cause, where an operator looks
            assert episode_row(conn, ref)["status"] == "failed"
    messages = [d["message"] for d in decisions]
    # Finding 4: skipped and counted at start, named.
    assert any("skipped 1 row(s)" in m and "a b" in m for m in messages), messages
    # Finding 6: the stale claim's backfill canceled while still requested, then released.
    assert any(m.startswith("canceled wave 1's backfill: no run") for m in messages), messages
    assert any(m.startswith("released") and "of wave 1" in m for m in messages), messages
    # Finding 0's signal: the governor halved and paused for S3's Retry-After.
    halvings = [
        d
        for d in decisions
        if d["kind"] == "governor"
        and d["details"]["limit_after"] < d["details"]["limit_before"]
        and d["details"]["paused_until"]
    ]
    assert halvings and f"paused {RETRY_AFTER} s" in halvings[0]["message"], messages
    # Findings 3, 9: the corrupt archives end rejected, named with their cause.
    for ref in corrupt:
        assert rows[ref].state == "rejected" and rows[ref].last_error, rows[ref]
        assert "extract" in rows[ref].last_error or "archive" in rows[ref].last_error, rows[ref]
    live = set(instance.get_dynamic_partitions(EPISODES_PARTITION_NAME))
    # Only the re-uploaded episode's partition is live: its upload's, retention's to prune. (At
    # K = 5 a batch's retry once ran settled episodes again, adding a rejected one's pruned
    # partition back and leaving a throttled one's to retention: `orchestration/batches.py`.)
    assert live & {ref.partition_key for ref in refs} == {refs[REUPLOADED].partition_key}, (
        f"{sorted(live & {ref.partition_key for ref in refs})}\n{run_lines(soak.runs())}"
    )


def failed_by_their_batch(instance: DagsterInstance, runs: list[DagsterRun]) -> list[DagsterRun]:
    """The runs as last seen, but a batch's child last seen in flight and since pruned counts as
    failed when a later attempt of its batch failed it as a dead attempt's (its log names it):
    the watcher looks every second, and on fast cores the retry failed the child and the tick
    pruned its episode within one (found in a fresh-clone run). Any other such run stays as seen."""
    failed_by_retry: set[str] = set()
    for batch in (run for run in runs if run.job_name == BATCH_JOB_NAME):
        for entry in instance.all_logs(batch.run_id):
            text = entry.user_message or (entry.dagster_event and entry.dagster_event.message) or ""
            if ABANDONED_BY_RETRY in text:
                failed_by_retry.update(re.findall(r"[0-9a-f-]{36}", text))
    return [
        run.with_status(DagsterRunStatus.FAILURE)
        if run.status in IN_FLIGHT_STATUSES
        and run.run_id in failed_by_retry
        and instance.get_run_by_id(run.run_id) is None
        else run
        for run in runs
    ]


def assert_run_history(
    stage: CrashStage, instance: DagsterInstance, soak: Soak, refs: list[EpisodeRef]
) -> None:
    """From the campaign's runs as the test saw them (the prune deletes settled ones)."""
    runs = failed_by_their_batch(instance, soak.runs())
    statuses = run_lines(runs)
    failed = (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
    # Finding 6: wave 1's backfill was canceled before it made a run; no episode ran twice: of
    # each good episode's runs, all but one failed.
    assert not [run for run in runs if run.tags.get(CAMPAIGN_WAVE_TAG) == "1"], statuses
    backfill = instance.get_backfill(wave_backfill_id(soak.campaign_id, 1))
    assert backfill is not None and backfill.status == BulkActionStatus.CANCELED
    for ref in (refs[i] for i in range(GOOD)):
        own = [run for run in runs if run.tags.get(PARTITION_TAG) == ref.partition_key]
        assert len([run for run in own if run.status not in failed]) == 1, f"{ref}\n{statuses}"
    # Finding 1: the killed run failed and the ledger settled on the one success that followed.
    killed = refs[KILLED]
    by_id = {run.run_id: run for run in runs}
    working = runs_working_on(runs, killed)
    (deciding,) = [
        run
        for run in working
        if run.tags.get(PARTITION_TAG) == killed.partition_key and run.status not in failed
    ]
    row = ledger_rows(stage, soak.campaign_id)[killed]
    assert row.run_id == deciding.run_id, f"{row}\n{statuses}"
    retries = [run for run in working if run.tags.get(PARENT_RUN_ID_TAG) in by_id]
    if retries:  # run_retries retried it: the failed run is the retry's parent
        assert all(
            by_id[r.tags[PARENT_RUN_ID_TAG]].status == DagsterRunStatus.FAILURE for r in retries
        )
        return
    # Dagster's race (K = 5: a wave of one batch run): its backfill ended before run_retries read
    # the killed run, so no retry came and `will_retry` stayed; the driver settled the failure
    # once the backfill had ended (RETRY_AFTER_BACKFILL_SECONDS) and ran the episode again in a
    # later wave, as its next attempt.
    abandoned = [
        run
        for run in working
        if run.status == DagsterRunStatus.FAILURE and run.tags.get(WILL_RETRY_TAG) == "true"
    ]
    assert abandoned and row.attempts >= 2, f"{row}\n{statuses}"
    waves = {run.tags.get(CAMPAIGN_WAVE_TAG) for run in abandoned}
    assert deciding.tags.get(CAMPAIGN_WAVE_TAG) not in waves, statuses


def assert_batches(runs: list[DagsterRun], campaign_id: str, refs: list[EpisodeRef]) -> None:
    """K > 1: every episode's campaign run a child of a batch run (its batch tag)."""
    children = {run.tags[PARTITION_TAG] for run in runs if BATCH_TAG in run.tags}
    assert children >= {refs[i].partition_key for i in range(GOOD)}
    batches = [run for run in runs if run.job_name == BATCH_JOB_NAME]
    assert batches and all(run.tags[PARTITION_TAG].startswith(campaign_id) for run in batches)


def interval(record: RunRecord) -> tuple[float, float]:
    assert record.start_time is not None and record.end_time is not None, record.dagster_run
    return record.start_time, record.end_time


def assert_uploads(
    stage: CrashStage,
    instance: DagsterInstance,
    soak: Soak,
    fresh: EpisodeRef,
    reuploaded: EpisodeRef,
) -> None:
    # The fresh upload, by the upload path: one run, processed.
    (run,) = upload_runs(instance, fresh)
    assert run.status == DagsterRunStatus.SUCCESS
    # Finding 8: the re-upload's run never ran beside a campaign run working on the episode.
    (upload,) = upload_runs(instance, reuploaded)
    assert upload.status == DagsterRunStatus.SUCCESS
    record = instance.get_run_record_by_id(upload.run_id)
    assert record is not None
    start, end = interval(record)
    for working in runs_working_on(soak.runs(), reuploaded):
        other_start, other_end = interval(soak.records[working.run_id])
        assert end <= other_start or other_end <= start, (working.run_id, upload.run_id)
    with connect(stage.settings.database) as conn:
        for ref in (fresh, reuploaded):
            assert episode_row(conn, ref)["status"] == "processed"
            assert frame_rows(conn, ref) == FPS
    # Nothing left queued: no run in flight (quiet), no message on the queue or the DLQ.
    assert depth(stage.queue) == (0, 0) and depth(stage.dlq) == (0, 0)
