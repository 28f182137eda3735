"""The `fleet` stage's campaign figures (issue 26): a campaign over the fleet, the real daemon.

`--set fleet_campaign_seconds=S` (with one size, e.g. `--set fleet_sizes=100000 --set
fleet_unpruned_max=0`: retention's steady state, `fleet_state.FleetState.settle`) measures only
this at that size, for a bounded slice of S seconds of the campaign.

**What is real and what is a stand-in.** `dagster-daemon run` with production's `sensors:` and
`run_coordinator:` blocks (dagster.yaml: 20 runs, 4 per org, one per partition, the backfill lane
10, the campaign lane 8, a dequeue every 5 s), pooled storages, every sensor of the code location
ticking on the fleet's store; the campaign written by `campaign start --stale` (commands.campaign),
its ledger, the `campaign_driver` sensor (reconcile, governor, canary, prune, one backfill a
wave), the backfill daemon creating the runs and the run queue dequeuing them: all the product's.
**The run worker is a stand-in** (`StandInRunLauncher` + `standin_worker`): it replaces what the
run launcher starts for a run (`EcsRunLauncher`'s task, locally `dagster api execute_run`), the
episode job's steps (S3, FFmpeg, frames). The launcher hands the run over by leaving it STARTING
(Dagster marks it so before `launch_run`); the stand-in worker, a process of its own that outlives
a daemon's SIGKILL as an ECS task does, takes every STARTING run, reports `RUN_START`, waits
`STANDIN_RUN_SECONDS` (1 s), then in one transaction marks the episode `processed` and writes its
durable record (`episode_outputs`, the deployed code versions: what the asset writes) and its own
log row (`bench_standin_runs`: one row per run it processed), and reports `RUN_SUCCESS`. It writes
no materialization, no frames, no HLS. With `fleet_campaign_k=K` > 1 the campaign runs the batch
job (`process_episode_batch`) and the stand-in plays it as `orchestration/batches.run_batch`
does: each of the batch's episodes a child run of `process_episode` with the tags `run_batch`
gives it, made in turn within the batch's `fleet_campaign_run_seconds`, their partitions added
first as `run_batch` adds them.

**At the plan's rate** (`fleet_campaign_k=25`, issue 33): the campaign runs at the default plan's
run rate (`campaign plan` for a million at the defaults: K = 25, 340 batches of 681 s at once,
~12.5 episodes/s, 0.5 runs/s). The stand-in's batches are shorter (`fleet_campaign_run_seconds`,
their children's bookkeeping inside it, as the plan's measured batch life holds it) and fewer at
once (`paced_concurrency`: ceil(rate / K * (seconds + the run queue's dequeue interval)), the
governor's maximum and start: a freed slot waits for the next dequeue, under 1 % of the plan's
681 s batch, 17 % of a 30 s one), so the run queue, the backfill daemon and the driver see the
plan's runs a second and episodes a second; what is scaled down is the runs in flight (18
instead of 340 at 30 s) and with them the episodes the driver keeps claimed.
`campaign_rate_vs_plan` is the steady rate against a million in 24 h (11.57 episodes/s),
`campaign_queue_depth` the campaign's queued batch runs through the steady state (its last third
against its first: not growing, never drained; `slots_held_mean` beside it, the batch runs in
progress against the limit). The steady state starts after a warm-up, named in `warm_up`: the
driver's first wave after the canary is sized before a rate of full slots is measured (one
limit queued) and reaches the queue a driver's lead later (`campaign_lead_seconds`, 95 s), so
runs shorter than that lead drain the queue once (production's 681 s batches do not).
`fleet_campaign_ceiling_runs=0` skips the ceiling, `fleet_ui=0` the pages (each costs minutes
on 2 cores and measures what K = 1 measures); each size's campaign is canceled at its end.

**The figures** (each with the load average when it was measured):
- `campaign_live_partitions_max`: the `episodes` dynamic partitions, sampled every
  `SAMPLE_SECONDS` through the slice; target ≤ the retention window (the episodes Dagster holds
  in the steady state) + one wave (`CAMPAIGN_WAVE_SIZE`).
- `campaign_ui_<page>`: the UI's pages (fleet_ui's recorded GraphQL documents: asset page,
  partitions view, one live campaign episode's page, the backfill dialog; and the newest wave's
  backfill page — its documents written here after the UI's `/runs/b/<id>` page, not recorded
  from a browser) at the live count near its maximum, warm; `..._after_add` the same replayed once
  right after a new partition was added (the partition caches invalidated). Target ≤ 3 s.
- `campaign_throughput`: succeeded episodes/s from the steady state's start (the canary passed
  and the queue holding the launch limit's runs) to the kill; with the kill and the restart, to
  the slice's end, in `rate_with_the_kill`. The
  campaign starts at the governor's maximum (`--concurrency`, `CAMPAIGN_CONCURRENCY_MAX`): the
  ramp from the default start is the governor's choice, not the orchestration's cost.
  **The ceiling** is the run queue's measured rate with nothing else running: a backfill of
  `fleet_campaign_ceiling_runs` window episodes with the campaign's tags (its lane, priority),
  recorded directly (no driver, no ledger), through the same daemon, run queue and stand-in, its
  runs' ends from the first quarter to the last (`ceiling_runs_per_second`). The lane's nominal
  ceiling (`CAMPAIGN_CONCURRENCY_MAX` / the stand-in's 1 s) is given beside it. Target ≥ 0.9x
  the measured ceiling. The time to finish the whole campaign is **extrapolated** from the steady
  rate (`extrapolated_hours_to_finish`).
- `campaign_upload_to_launch`: a fresh upload (org `fresh`, its own org's slot) from its S3
  object until its run leaves QUEUED, during the campaign, against the same before the campaign
  (idle), same daemon; target ≤ 1.5x idle.
- `campaign_kill`: the daemon (and its code server) SIGKILLed mid-campaign and restarted; the
  ledger's counts just before and at the end, and nothing lost or doubled: per (episode,
  campaign) at most one stand-in run, every `succeeded` row's run the one the stand-in processed,
  every processed episode's row `succeeded` or still `requested` (in flight).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from dagster import DagsterRun
from dagster._core.launcher import LaunchRunContext, RunLauncher
from dagster._serdes import ConfigurableClass, ConfigurableClassData

STANDIN_RUN_SECONDS = 1.0  # what a stand-in run takes (orchestration is measured, not FFmpeg)
PLAN_EPISODES = 1_000_000  # the plan the rate is held to: a million short episodes
DAY_SECONDS = 86_400
STANDIN_POLL_SECONDS = 0.2
STANDIN_THREADS = 32
STANDIN_TABLE = "bench_standin_runs"
SAMPLE_SECONDS = 5.0
FRESH_ORG = "fresh"
FRESH_UPLOADS = 3
LAUNCH_DEADLINE_SECONDS = 300
UI_PAGE_SECONDS = 3.0
UPLOAD_FACTOR = 1.5
THROUGHPUT_FACTOR = 0.9
QUEUE_GROWTH = 1.5  # the queue's depth steady: its last third within 1.5x of its first
REPO = Path(__file__).resolve().parents[1]
PRODUCTION_YAML = REPO / "dagster.yaml"

BACKFILL_PAGE = [
    {
        "operationName": "BackfillStatusesByAsset",
        "query": """
query BackfillStatusesByAsset($backfillId: String!) {
  partitionBackfillOrError(backfillId: $backfillId) {
    __typename
    ... on PartitionBackfill {
      id status title description numPartitions timestamp endTimestamp
      isAssetBackfill
      assetBackfillData {
        rootTargetedPartitions { partitionKeys ranges { start end } }
        assetBackfillStatuses {
          ... on AssetPartitionsStatusCounts {
            assetKey { path }
            numPartitionsTargeted numPartitionsInProgress numPartitionsMaterialized
            numPartitionsFailed
          }
        }
      }
    }
    ... on PythonError { message }
  }
}""",
        "variables": {"backfillId": "__BACKFILL__"},
    },
    {
        "operationName": "BackfillRunsQuery",
        "query": """
query BackfillRunsQuery($filter: RunsFilter!) {
  runsOrError(filter: $filter, limit: 25) {
    __typename
    ... on Runs { results { id status startTime endTime tags { key value } } }
    ... on PythonError { message }
  }
}""",
        "variables": {"filter": {"tags": [{"key": "dagster/backfill", "value": "__BACKFILL__"}]}},
    },
]


# -- the stand-in run worker ---------------------------------------------------------------------


class StandInRunLauncher(RunLauncher, ConfigurableClass):
    """BENCHMARK STAND-IN for the run launcher's worker: the run is left STARTING (Dagster set it
    before calling us) for `standin_worker`, a separate process, to run (see the module)."""

    def __init__(self, inst_data: ConfigurableClassData | None = None) -> None:
        self._inst_data = inst_data
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {}

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData, config_value: dict[str, Any]
    ) -> StandInRunLauncher:
        return cls(inst_data=inst_data)

    def launch_run(self, context: LaunchRunContext) -> None:
        return None  # the stand-in worker polls for STARTING runs

    def terminate(self, run_id: str) -> bool:
        return False


def create_standin_table(database: Any) -> None:
    from episode_pipeline.db.connection import connect

    with connect(database) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {STANDIN_TABLE} (run_id text PRIMARY KEY, org_id text,"
            " episode_id text, campaign text, wave text, finished_at timestamptz DEFAULT now())"
        )
        conn.commit()


def standin_worker(stop_file: Path, run_seconds: float = STANDIN_RUN_SECONDS) -> None:
    """BENCHMARK STAND-IN run worker (`python -m benchmarks.fleet_campaign worker STOP_FILE
    [RUN_SECONDS]`): until STOP_FILE exists, runs every STARTING run as described in the
    module's docstring, each in RUN_SECONDS (a batch run's K episodes share them)."""
    from dagster import (
        DagsterEvent,
        DagsterEventType,
        DagsterInstance,
        DagsterRunStatus,
        RunsFilter,
    )

    from episode_pipeline.commands.campaign import current_code_versions
    from episode_pipeline.config.settings import Settings
    from episode_pipeline.db.batches import batch_episodes
    from episode_pipeline.db.connection import connect
    from episode_pipeline.db.outputs import record_output
    from episode_pipeline.episodes.keys import EpisodeRef, parse_partition_key
    from episode_pipeline.instance.run_tags import (
        BATCH_JOB_NAME,
        CAMPAIGN_TAG,
        CAMPAIGN_WAVE_TAG,
        EPISODE_JOB_NAME,
        PARTITION_TAG,
        batch_child_tags,
        episode_tags,
    )
    from episode_pipeline.orchestration.runs import add_partitions

    settings = Settings.from_env(dict(os.environ))
    versions = current_code_versions(settings)
    seen: set[str] = set()

    with DagsterInstance.get() as instance:

        def report(run: DagsterRun, kind: DagsterEventType, message: str) -> None:
            event = DagsterEvent(
                event_type_value=kind.value, job_name=run.job_name, message=message
            )
            instance.report_dagster_event(event, run.run_id)

        def process(run: DagsterRun, ref: EpisodeRef, seconds: float, until: float) -> None:
            """What the episode's run writes that the driver reads: processed, its record;
            it ends no sooner than `until` (its share of the run's seconds)."""
            time.sleep(max(0.0, until - time.monotonic()))
            with connect(settings.database) as conn:
                conn.execute(
                    "UPDATE episodes SET status = 'processed', processed_at = now()"
                    " WHERE org_id = %s AND id = %s",
                    (ref.org_id, ref.episode_id),
                )
                record_output(
                    conn, ref, versions, {}, run_id=run.run_id, wall_seconds=seconds,
                    archive_bytes=None,
                )  # fmt: skip
                conn.execute(
                    f"INSERT INTO {STANDIN_TABLE} (run_id, org_id, episode_id, campaign, wave)"
                    " VALUES (%s, %s, %s, %s, %s)",
                    (
                        run.run_id, ref.org_id, ref.episode_id,
                        run.tags.get(CAMPAIGN_TAG), run.tags.get(CAMPAIGN_WAVE_TAG),
                    ),
                )  # fmt: skip
                conn.commit()

        def batch(run: DagsterRun) -> None:
            """A batch run (K > 1): each episode in turn as a child run of the episode job with
            the tags `orchestration/batches.run_batch` gives it, the i-th ending at i / K of
            `run_seconds` from the batch's start: the batch lives `run_seconds`, its children's
            bookkeeping included, as the `batch` stage's measured batch life includes it (the
            plan's)."""
            began = time.monotonic()
            key = run.tags[PARTITION_TAG]
            with connect(settings.database) as conn:
                refs = batch_episodes(conn, key)
            add_partitions(instance, [ref.partition_key for ref in refs])  # as run_batch does
            tags = batch_child_tags(key, run.run_id, run.tags)
            for index, ref in enumerate(refs, start=1):
                child = DagsterRun(
                    job_name=EPISODE_JOB_NAME, run_id=str(uuid.uuid4()),
                    tags={**tags, **episode_tags(ref.partition_key),
                          PARTITION_TAG: ref.partition_key},
                )  # fmt: skip
                instance.add_run(child)
                report(child, DagsterEventType.RUN_START, "Started (benchmark stand-in child).")
                share = run_seconds / len(refs)
                process(child, ref, share, until=began + index * share)
                report(child, DagsterEventType.RUN_SUCCESS, "Finished (benchmark stand-in).")

        def work(run: DagsterRun) -> None:
            try:
                report(run, DagsterEventType.RUN_START, "Started (benchmark stand-in worker).")
                if run.job_name == BATCH_JOB_NAME:
                    batch(run)
                else:
                    process(
                        run, parse_partition_key(run.tags[PARTITION_TAG]), run_seconds,
                        until=time.monotonic() + run_seconds,
                    )  # fmt: skip
                report(run, DagsterEventType.RUN_SUCCESS, "Finished (benchmark stand-in worker).")
            except Exception as failure:  # the run fails, the worker goes on
                print(f"stand-in: run {run.run_id} failed: {failure!r}", file=sys.stderr)
                report(run, DagsterEventType.RUN_FAILURE, f"stand-in worker: {failure!r}")

        with ThreadPoolExecutor(STANDIN_THREADS) as pool:
            while not stop_file.exists():
                for run in instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.STARTING])):
                    if run.run_id not in seen:
                        seen.add(run.run_id)
                        pool.submit(work, run)
                time.sleep(STANDIN_POLL_SECONDS)


@contextlib.contextmanager
def standin_process(env: dict[str, str], workdir: Path, run_seconds: float) -> Any:
    stop_file = workdir / f"standin-stop-{uuid.uuid4().hex[:6]}"
    log = workdir / "fleet-campaign-standin.log"
    command = [sys.executable, "-m", "benchmarks.fleet_campaign", "worker", str(stop_file)]
    with log.open("ab") as output:
        process = subprocess.Popen(
            [*command, str(run_seconds)],
            env=env, cwd=REPO, start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield process
    finally:
        stop_file.touch()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- the deployment ------------------------------------------------------------------------------


def deploy_config(dagster_home: str) -> str:
    """Production's run queue and sensors, pooled storages, the stand-in launcher; returns the
    text to restore."""
    from episode_pipeline.local.dagster_home import storage_config

    path = Path(dagster_home) / "dagster.yaml"
    original = path.read_text()
    config = yaml.safe_load(original)
    production = yaml.safe_load(PRODUCTION_YAML.read_text())
    config["run_coordinator"] = production["run_coordinator"]
    config.get("concurrency", {}).pop("runs", None)  # the limits are the coordinator's now
    config["sensors"] = production["sensors"]
    config["run_launcher"] = {"module": __name__, "class": StandInRunLauncher.__name__}
    config.update(storage_config(config["run_storage"]["config"], pooled=True))
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return original


def live_partitions(dsn: str) -> int:
    import psycopg

    from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME

    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM dynamic_partitions WHERE partitions_def_name = %s",
            (EPISODES_PARTITION_NAME,),
        ).fetchone()
    return int(row[0]) if row else 0


def load() -> float:
    return round(os.getloadavg()[0], 2)


# -- the measurements ----------------------------------------------------------------------------


def upload_to_launch(fleet: Any, archive: Path, label: str) -> dict[str, Any]:
    """One fresh upload: seconds from its object's upload until its run leaves QUEUED."""
    from dagster import DagsterRunStatus, RunsFilter

    from episode_pipeline.episodes.keys import EpisodeRef
    from episode_pipeline.instance.run_tags import PARTITION_TAG
    from episode_pipeline.local.upload import upload_episode

    ref = EpisodeRef(FRESH_ORG, f"ep-fresh-{label}-{uuid.uuid4().hex[:6]}")
    at_load = load()
    started = time.time()
    upload_episode(archive, ref, fleet.settings)
    deadline = time.monotonic() + LAUNCH_DEADLINE_SECONDS
    filters = RunsFilter(tags={PARTITION_TAG: ref.partition_key})
    while time.monotonic() < deadline:
        runs = fleet.instance.get_runs(filters)
        left = [r for r in runs if r.status not in (DagsterRunStatus.QUEUED,)]
        if left:
            record = fleet.instance.get_run_record_by_id(left[0].run_id)
            return {
                "seconds": round(time.time() - started, 2),
                "run_created_after_seconds": round(
                    record.create_timestamp.timestamp() - started, 2
                ),
                "status": left[0].status.value,
                "load_average": [at_load, load()],
            }
        time.sleep(0.25)
    return {"seconds": float("inf"), "load_average": [at_load, load()]}


def measure_ceiling(ctx: Any, fleet: Any, count: int) -> dict[str, Any]:
    """The run queue's rate alone: a backfill with the campaign's tags, no driver (see module)."""
    from dagster import DagsterRunStatus, RunsFilter

    from benchmarks import fleet_state
    from episode_pipeline.orchestration.backfills import record_backfill
    from episode_pipeline.orchestration.campaigns import campaign_tags

    size = fleet.state.size
    held = fleet.state.settled.get("window_episodes", size) if fleet.state.settled else size
    keys = [fleet_state.partition_key(i) for i in range(size - held, size - held + count)]
    tag = f"bench-ceiling-{uuid.uuid4().hex[:4]}"
    at_load = load()
    started = time.time()
    backfill = record_backfill(
        fleet.instance, keys, title="benchmark: the run queue's ceiling",
        description="fleet_campaign.measure_ceiling", tags=campaign_tags(tag, 0),
    )  # fmt: skip
    filters = RunsFilter(tags={"dagster/backfill": backfill})
    deadline = time.monotonic() + 1800
    done = 0
    while time.monotonic() < deadline:
        done = fleet.instance.get_runs_count(
            RunsFilter(tags={"dagster/backfill": backfill}, statuses=[DagsterRunStatus.SUCCESS])
        )
        if done >= count:
            break
        time.sleep(1.0)
    ends = sorted(
        r.end_time for r in fleet.instance.get_run_records(filters) if r.end_time is not None
    )
    quarter = len(ends) // 4
    rate = (len(ends) - 1 - quarter) / (ends[-1] - ends[quarter]) if len(ends) > 4 else 0.0
    return {
        "runs": count,
        "succeeded": done,
        "seconds": round(time.time() - started, 1),
        "runs_per_second": round(rate, 3),
        "load_average": [at_load, load()],
    }


def page_documents(fleet_ui: Any, backfill_id: str) -> dict[str, list[dict[str, Any]]]:
    recorded = json.loads(fleet_ui.QUERIES_FILE.read_text())
    pages = dict(recorded["pages"])
    pages["backfill_page"] = json.loads(
        json.dumps(BACKFILL_PAGE).replace("__BACKFILL__", backfill_id)
    )
    return {"episode": recorded["episode"], "pages": pages}


def measure_pages(ctx: Any, fleet: Any, server: Any, backfill_id: str, episode: str) -> dict:
    """Each page warm at the live count, then each once right after a partition was added."""
    from benchmarks import fleet_ui
    from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME

    document = page_documents(fleet_ui, backfill_id)
    found: dict[str, Any] = {}
    for page, requests in document["pages"].items():
        at_load, count = load(), live_partitions(fleet.dsn)
        cold = fleet_ui.replay(server, requests, episode, document["episode"])
        warm = [
            fleet_ui.replay(server, requests, episode, document["episode"])
            for _ in range(ctx.config.repeats)
        ]
        fleet.instance.add_dynamic_partitions(
            EPISODES_PARTITION_NAME, [f"{FRESH_ORG}/ep-added-{uuid.uuid4().hex[:8]}"]
        )
        after = fleet_ui.replay(server, requests, episode, document["episode"])
        profiled = profile_after_add(ctx, fleet, server, page, requests, episode, document)
        found[page] = {
            "live_partitions": count,
            "cold_seconds": round(cold["seconds"], 3),
            "warm_seconds": [round(r["seconds"], 3) for r in warm],
            "after_add_seconds": round(after["seconds"], 3),
            "slowest": warm[-1]["slowest"] if warm else cold["slowest"],
            "after_add_slowest": after["slowest"],
            "errors": cold["errors"] + after["errors"],
            "load_average": [at_load, load()],
            "profile": profiled,
        }
    return found


def profile_after_add(
    ctx: Any, fleet: Any, server: Any, page: str, requests: Any, episode: str, document: Any
) -> str | None:
    """One more partition added and the page replayed under py-spy (the webserver sampled;
    collapsed stacks in the scratch directory), when py-spy is installed: where the time after
    an added partition goes. Not a figure (the profiler is attached)."""
    from benchmarks import fleet_ui
    from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME

    spy = Path(sys.executable).parent / "py-spy"
    if not spy.exists():
        return None
    out = ctx.workdir / f"pyspy-after-add-{page}.txt"
    fleet.instance.add_dynamic_partitions(
        EPISODES_PARTITION_NAME, [f"{FRESH_ORG}/ep-added-{uuid.uuid4().hex[:8]}"]
    )
    command = [str(spy), "record", "--pid", str(server.process.pid), "--rate", "100",
               "--format", "raw", "--nonblocking", "--subprocesses", "-o", str(out)]  # fmt: skip
    spying = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        fleet_ui.replay(server, requests, episode, document["episode"])
    finally:
        spying.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            spying.wait(30)
        if spying.poll() is None:
            spying.kill()
    return str(out)


class Sampler(threading.Thread):
    """Every SAMPLE_SECONDS: the ledger's counts, the live partitions, the load."""

    def __init__(self, fleet: Any, campaign_id: str, batches: bool = False) -> None:
        super().__init__(daemon=True)
        self.fleet, self.campaign_id, self.batches = fleet, campaign_id, batches
        self.samples: list[dict[str, Any]] = []
        self.stop = threading.Event()

    def take(self) -> dict[str, Any]:
        from dagster import DagsterRunStatus, RunsFilter

        from episode_pipeline.db import campaigns as db
        from episode_pipeline.db.connection import connect
        from episode_pipeline.instance.run_tags import BATCH_JOB_NAME, CAMPAIGN_TAG

        with connect(self.fleet.settings.database) as conn:
            counts = db.state_counts(conn, self.campaign_id)
            campaign = db.get_campaign(conn, self.campaign_id)
        # At K > 1 a batch run's child is STARTED beside it: the slots are the batch runs'.
        job = BATCH_JOB_NAME if self.batches else None
        runs = {
            status.value.lower(): self.fleet.instance.get_runs_count(
                RunsFilter(tags={CAMPAIGN_TAG: self.campaign_id}, statuses=[status], job_name=job)
            )
            for status in (DagsterRunStatus.QUEUED, DagsterRunStatus.STARTING,
                           DagsterRunStatus.STARTED)
        }  # fmt: skip
        sample = {
            "t": round(time.time(), 1),
            "load": load(),
            "live_partitions": live_partitions(self.fleet.dsn),
            "counts": counts,
            "runs": runs,  # the launch limit held (starting + started), the queue kept fed
            "limit": (campaign.governor or {}).get("limit") if campaign else None,
            "next_wave": campaign.next_wave if campaign else None,
            "state": campaign.state if campaign else None,
        }
        self.samples.append(sample)
        return sample

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_SECONDS):
            with contextlib.suppress(Exception):  # one missed sample is not a figure
                self.take()


def integrity(fleet: Any, campaign_id: str) -> dict[str, Any]:
    """Per (episode, campaign): stand-in runs, against the ledger's row."""
    from episode_pipeline.db import campaigns as db
    from episode_pipeline.db.connection import connect

    with connect(fleet.settings.database) as conn:
        doubled = conn.execute(
            f"SELECT count(*) FROM (SELECT org_id, episode_id FROM {STANDIN_TABLE} WHERE"
            " campaign = %s GROUP BY org_id, episode_id HAVING count(*) > 1) d",
            (campaign_id,),
        ).fetchone()[0]
        processed = conn.execute(
            f"SELECT count(*) FROM {STANDIN_TABLE} WHERE campaign = %s", (campaign_id,)
        ).fetchone()[0]
        # a succeeded row whose run is not the one the stand-in processed, or none
        lost_succeeded = conn.execute(
            f"SELECT count(*) FROM campaign_episodes c LEFT JOIN {STANDIN_TABLE} s"
            " ON s.campaign = c.campaign_id AND s.org_id = c.org_id AND s.episode_id ="
            " c.episode_id WHERE c.campaign_id = %s AND c.state = 'succeeded'"
            " AND (s.run_id IS NULL OR s.run_id <> c.run_id)",
            (campaign_id,),
        ).fetchone()[0]
        # processed by a run, its row neither succeeded nor in flight
        lost_processed = conn.execute(
            f"SELECT count(*) FROM {STANDIN_TABLE} s JOIN campaign_episodes c"
            " ON s.campaign = c.campaign_id AND s.org_id = c.org_id AND s.episode_id ="
            " c.episode_id WHERE c.campaign_id = %s AND c.state NOT IN ('succeeded', 'requested')",
            (campaign_id,),
        ).fetchone()[0]
        counts = db.state_counts(conn, campaign_id)
    return {
        "counts": counts,
        "standin_runs": processed,
        "episodes_run_twice": doubled,
        "succeeded_without_its_run": lost_succeeded,
        "run_but_not_succeeded_nor_in_flight": lost_processed,
    }


def default_plan(settings: Any, episodes: int = PLAN_EPISODES) -> dict[str, Any]:
    """What `campaign plan` plans at the settings' defaults for `episodes` short episodes (K,
    the runs at once, episodes/s and runs/s), beside what a million in a day needs."""
    from episode_pipeline.campaign.capacity import Workload
    from episode_pipeline.cli import build_parser
    from episode_pipeline.commands.campaign import capacity_of, config_of

    args = build_parser().parse_args(["campaign", "plan", "--stale"])
    planned, _ = capacity_of(episodes, config_of(args, settings), settings, Workload(), None)
    k = planned.episodes_per_run
    return {
        "episodes": episodes,
        "episodes_per_run": k,
        "concurrency": planned.concurrency,
        "episodes_per_second": round(planned.episodes_per_second, 3),
        "runs_per_second": round(planned.episodes_per_second / k, 4),
        "hours_to_finish": round(planned.hours_to_finish, 2),
        "day_needs_episodes_per_second": round(episodes / DAY_SECONDS, 3),
    }


def paced_concurrency(
    episodes_per_second: float, k: int, run_seconds: float, slot_gap_seconds: float = 0.0
) -> int:
    """Stand-in runs at once that settle `episodes_per_second` in runs of K episodes lasting
    `run_seconds`: the plan's run rate with fewer, shorter runs than its 681 s batches (the
    queue sees the same runs a second; fewer are in flight). A slot a run frees stays empty
    until the run queue's next dequeue (`slot_gap_seconds`): under 1 % of the plan's batch,
    17 % of a 30-s stand-in's, so the slots are sized for the run and its gap."""
    return max(1, math.ceil(episodes_per_second / k * (run_seconds + slot_gap_seconds)))


def dequeue_interval_seconds() -> float:
    """The run queue's dequeue interval in production's dagster.yaml."""
    coordinator = yaml.safe_load(PRODUCTION_YAML.read_text())["run_coordinator"]["config"]
    return float(coordinator["dequeue_interval_seconds"])


def start_campaign(
    fleet: Any, name: str, k: int, concurrency: int
) -> tuple[str, dict[str, Any], float]:
    from benchmarks import fleet_state
    from episode_pipeline.cli import build_parser
    from episode_pipeline.commands import campaign as commands
    from episode_pipeline.db.connection import connect

    # The fleet was never processed: its canary has no figures from before to compare.
    start = ["campaign", "start", "--stale", "--org", fleet_state.FLEET_ORG, "--name", name]
    start.append("--accept-no-baseline")
    # K = 1: the stand-in plays `process_episode` runs; above, the batch job's runs.
    start += ["--episodes-per-run", str(k)]
    args = build_parser().parse_args([*start, "--concurrency", str(concurrency)])
    # The governor starts at `concurrency` and stays there: its maximum is the campaign's.
    campaign = dataclasses.replace(fleet.settings.campaign, concurrency_max=concurrency)
    settings = dataclasses.replace(fleet.settings, campaign=campaign)
    started = time.perf_counter()
    with connect(fleet.settings.database) as conn:
        planned = commands.plan(conn, settings, args)
        query, params, selection = planned.pop("_query")
        campaign_id, count = commands.start(
            conn, fleet.instance, planned, query, params, selection, args
        )
        conn.commit()
    planned["count"] = count
    return campaign_id, planned, time.perf_counter() - started


def newest_wave(fleet: Any, campaign_id: str) -> tuple[str, str]:
    """The newest wave's backfill id and one of its episodes (live, for the episode page)."""
    from episode_pipeline.db import campaigns as db
    from episode_pipeline.db.connection import connect
    from episode_pipeline.orchestration.campaigns import wave_backfill_id

    with connect(fleet.settings.database) as conn:
        campaign = db.get_campaign(conn, campaign_id)
        assert campaign is not None
        wave = max(campaign.next_wave - 1, 0)
        rows = db.wave_rows(conn, campaign_id, wave)
    return wave_backfill_id(campaign_id, wave), rows[0].ref.partition_key


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the daemon we started and its code server (its own session)."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def measure(ctx: Any, fleet: Any, sample: Any, archive: Path) -> None:
    from benchmarks import end_to_end, fleet_daemon, fleet_ui
    from episode_pipeline.config.settings import CampaignSettings

    seconds = ctx.config.fleet_campaign_seconds
    k, run_seconds = ctx.config.fleet_campaign_k, ctx.config.fleet_campaign_run_seconds
    plan = default_plan(fleet.settings)
    # K = 1: the governor's maximum, the queue's ceiling the figure; K > 1: the default plan's
    # run rate (the stand-in's runs at once paced to it), the plan the figure.
    concurrency = (
        paced_concurrency(plan["episodes_per_second"], k, run_seconds, dequeue_interval_seconds())
        if k > 1
        else CampaignSettings().concurrency_max
    )
    home = fleet.info.env["DAGSTER_HOME"]
    # The daemon and webserver load the stand-in launcher from this repository.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    env = {**os.environ, **fleet.info.env}
    create_standin_table(fleet.settings.database)
    original = deploy_config(home)
    details: dict[str, Any] = {
        "standin": f"BENCHMARK STAND-IN run worker: {run_seconds:g} s a run of K = {k} (a batch "
        "run's episodes are child runs sharing them), marks each episode processed and writes "
        "its record; no FFmpeg, S3 or frames (fleet_campaign.py)",
        "slice_seconds": seconds,
        "episodes_per_run": k,
        "run_seconds": run_seconds,
        "concurrency": concurrency,
        "plan": plan,
        "settings": {
            **{k: v for k, v in vars(CampaignSettings()).items()},
            "run_coordinator": yaml.safe_load(PRODUCTION_YAML.read_text())["run_coordinator"],
        },
        "state": sample.details.get("state"),
    }
    sample.details["campaign"] = details
    logs = ctx.workdir
    try:
        with standin_process(env, ctx.workdir, run_seconds):
            server = None
            if ctx.config.fleet_ui:
                with ctx.phase("set-up: campaign webserver"):
                    server = fleet.webserver = fleet_ui.start(ctx, fleet)
            first_log = logs / "fleet-campaign-daemon-1.log"
            with end_to_end.daemon(fleet.info, first_log) as first:
                end_to_end.wait_for_daemon(fleet.instance, first, first_log)
                with ctx.phase("campaign: idle uploads"):
                    details["upload_idle"] = [
                        upload_to_launch(fleet, archive, f"idle{i}") for i in range(FRESH_UPLOADS)
                    ]
                if ctx.config.fleet_campaign_ceiling_runs:
                    with ctx.phase("campaign: the run queue's ceiling"):
                        details["ceiling"] = measure_ceiling(
                            ctx, fleet, ctx.config.fleet_campaign_ceiling_runs
                        )
                with ctx.phase("campaign: start"):
                    campaign_id, planned, start_s = start_campaign(
                        fleet, "bench campaign", k, concurrency
                    )
                details["campaign_id"] = campaign_id
                details["episodes"] = planned["count"]
                details["start_seconds"] = round(start_s, 2)
                details["start_load"] = load()
                sampler = Sampler(fleet, campaign_id, batches=k > 1)
                sampler.take()
                sampler.start()
                began = time.time()
                with ctx.phase(f"campaign: {seconds} s slice"):
                    time.sleep(seconds * 0.35)
                    details["upload_during"] = [
                        upload_to_launch(fleet, archive, f"busy{i}") for i in range(FRESH_UPLOADS)
                    ]
                    time.sleep(max(0.0, began + seconds * 0.6 - time.time()))
                    before = integrity(fleet, campaign_id)
                    before["load_average"] = load()
                    before["after_seconds"] = round(time.time() - began, 1)
                    kill_group(first)
                    details["kill"] = {"before": before, "killed_at": round(time.time(), 1)}
            time.sleep(5)
            second_log = logs / "fleet-campaign-daemon-2.log"
            with end_to_end.daemon(fleet.info, second_log) as second:
                end_to_end.wait_for_daemon(fleet.instance, second, second_log)
                details["kill"]["restarted_after_seconds"] = round(
                    time.time() - details["kill"]["killed_at"], 1
                )
                time.sleep(max(0.0, began + seconds * 0.8 - time.time()))
                if server is not None:
                    with ctx.phase("campaign: the UI's pages at the live count"):
                        backfill_id, episode = newest_wave(fleet, campaign_id)
                        details["ui"] = measure_pages(ctx, fleet, server, backfill_id, episode)
                time.sleep(max(0.0, began + seconds - time.time()))
                sampler.stop.set()
                sampler.join()
                details["kill"]["after"] = integrity(fleet, campaign_id)
                details["kill"]["after"]["load_average"] = load()
                cancel(fleet, campaign_id)  # the next size's campaign runs alone
            details["samples"] = sampler.samples
            details["decisions"] = decision_log(fleet, campaign_id)
            summarise(
                details, fleet, lambda a, b: standin_rate(fleet, details["campaign_id"], a, b)
            )
        # The stand-in stopped with batches in flight (it waits 30 s, a batch can take longer):
        # fail what it left, as run monitoring fails a dead task's run, or their episodes stay
        # locked against the next size's campaign (its canary waited on one at 1,000,000).
        details["left_in_flight"] = fail_left_in_flight(fleet, campaign_id)
    finally:
        (Path(home) / "dagster.yaml").write_text(original)
        fleet_ui.close(fleet)
        with contextlib.suppress(Exception):
            fleet_daemon.drain(
                __import__("episode_pipeline.local.aws_setup", fromlist=["client"]).client(
                    "sqs", fleet.info.s3_endpoint
                ),
                fleet.info.sqs_queue_url,
            )


def cancel(fleet: Any, campaign_id: str) -> None:
    """`campaign cancel`'s own steps: the campaign canceled, its waves' backfills too."""
    from episode_pipeline.commands import campaign as commands
    from episode_pipeline.db import campaigns as db
    from episode_pipeline.db.connection import connect

    with connect(fleet.settings.database) as conn:
        commands.act(conn, campaign_id, "cancel")
        campaign = db.get_campaign(conn, campaign_id)
        conn.commit()
    commands.cancel_backfills(fleet.instance, campaign_id, campaign.next_wave if campaign else 0)


def fail_left_in_flight(fleet: Any, campaign_id: str) -> int:
    from dagster import DagsterRunStatus, RunsFilter

    from episode_pipeline.instance.run_tags import CAMPAIGN_TAG

    left = fleet.instance.get_runs(
        RunsFilter(
            tags={CAMPAIGN_TAG: campaign_id},
            statuses=[DagsterRunStatus.STARTING, DagsterRunStatus.STARTED],
        )
    )
    for run in left:
        fleet.instance.report_run_failed(run, "benchmark: the size's stand-in worker stopped")
    return len(left)


def decision_log(fleet: Any, campaign_id: str) -> list[dict[str, Any]]:
    from episode_pipeline.db.connection import connect

    with connect(fleet.settings.database) as conn:
        rows = conn.execute(
            "SELECT at, kind, message FROM campaign_decisions WHERE campaign_id = %s ORDER BY id",
            (campaign_id,),
        ).fetchall()
    return [{"at": row[0].timestamp(), "kind": row[1], "message": row[2]} for row in rows]


def standin_rate(fleet: Any, campaign_id: str, start: float, end: float) -> float:
    """The campaign's runs ended per second between two times (the stand-in's rows)."""
    from episode_pipeline.db.connection import connect

    with connect(fleet.settings.database) as conn:
        count, first, last = conn.execute(
            f"SELECT count(*), extract(epoch FROM min(finished_at)),"
            f" extract(epoch FROM max(finished_at)) FROM {STANDIN_TABLE} WHERE campaign = %s"
            " AND finished_at BETWEEN to_timestamp(%s) AND to_timestamp(%s)",
            (campaign_id, start, end),
        ).fetchone()
    if count < 2 or last <= first:
        return 0.0
    return (count - 1) / float(last - first)


def summarise(
    details: dict[str, Any],
    fleet: Any,
    runs_ended_rate: Callable[[float, float], float] | None = None,
) -> None:
    """The steady rate (canary's end until the kill), the extrapolation, the window."""
    from episode_pipeline.config.settings import CampaignSettings

    samples = details["samples"]
    killed = details["kill"]["killed_at"]
    # The steady state starts once the canary has passed and the queue holds at least the
    # launch limit's runs (the driver's pace measured): what the pacing keeps up from then on.
    # A queue that never held the limit (the campaign fell behind its launch limit: at the
    # plan's rate, issue 33) starts it at the canary's end; the queue's depth then says so.
    passed = [s for s in samples if (s["next_wave"] or 0) >= 2]
    full = next(
        (s for s in passed if s.get("runs", {}).get("queued", 0) >= (s.get("limit") or 0)), None
    )
    canary_done = full or next(iter(passed), None)
    details["steady_from"] = "a full queue" if full else "the canary's end (the queue never full)"
    if details.get("plan") and canary_done:
        # At the plan's rate: the driver's first budget after the canary is set before a rate
        # of full slots is measured (one limit queued), and reaches the queue a lead later
        # (`campaign_lead_seconds`); runs shorter than that lead drain it once. The steady state
        # starts after that warm-up; the warm-up's samples are kept beside it.
        warm_until = canary_done["t"] + campaign_lead_seconds()
        details["warm_up"] = [
            s.get("runs", {}).get("queued", 0)
            for s in samples
            if canary_done["t"] <= s["t"] < warm_until
        ]
        canary_done = next((s for s in passed if s["t"] >= warm_until), canary_done)
        details["steady_from"] = "the canary's end and the driver's lead (the warm-up)"

    def rate_between(start: float, end: float) -> float:
        inside = [s for s in samples if start <= s["t"] <= end]
        if len(inside) < 2 or inside[-1]["t"] <= inside[0]["t"]:
            return 0.0
        done = inside[-1]["counts"].get("succeeded", 0) - inside[0]["counts"].get("succeeded", 0)
        return done / (inside[-1]["t"] - inside[0]["t"])

    # The steady state: from its start to the kill; and on to the slice's end. Measured as the
    # ceiling is, by the runs' ends (the stand-in's rows); the ledger's count moves in steps of
    # a driver tick (30 s), so its rate over a few minutes is given beside it.
    start = canary_done["t"] if canary_done else math.inf
    steady = [s for s in samples if start <= s["t"] <= killed]
    rate = (runs_ended_rate or rate_between)(start, killed)
    details["ledger_rate_before_the_kill"] = round(rate_between(start, killed), 4)
    details["rate_with_the_kill"] = round(rate_between(start, math.inf), 4)
    total = details["episodes"]
    succeeded = samples[-1]["counts"].get("succeeded", 0) if samples else 0
    size = fleet.state.size
    window = fleet.state.settled.get("window_episodes", size) if fleet.state.settled else size
    max_sample = max(samples, key=lambda s: s["live_partitions"]) if samples else {}
    campaign = CampaignSettings()
    details["summary"] = {
        "steady_rate_episodes_per_second": round(rate, 4),
        "steady_from_to": [steady[0]["t"], steady[-1]["t"]] if steady else None,
        "steady_load_average": [min(s["load"] for s in steady), max(s["load"] for s in steady)]
        if steady
        else None,
        "succeeded_in_slice": succeeded,
        "extrapolated_hours_to_finish": round((total - succeeded) / rate / 3600, 1)
        if rate
        else None,
        "live_partitions_max": max_sample.get("live_partitions"),
        "live_partitions_max_load": max_sample.get("load"),
        "window_episodes": window,
        "wave_size": campaign.wave_size,
        "nominal_ceiling_runs_per_second": campaign.concurrency_max / STANDIN_RUN_SECONDS,
        "queue_depth": queue_depth(steady),
    }
    if plan := details.get("plan"):
        k = details.get("episodes_per_run", 1)
        details["summary"]["plan"] = {
            **plan,
            "measured_runs_per_second": round(rate / k, 4),
            "rate_against_the_plan": round(rate / plan["episodes_per_second"], 3),
            "rate_against_a_day": round(rate / plan["day_needs_episodes_per_second"], 3),
        }


def campaign_lead_seconds() -> float:
    """A claim's way to the run queue at the default tick: the driver's `lead_seconds`."""
    from episode_pipeline.orchestration.campaigns import BACKFILL_LEAD_SECONDS, DEFAULT_TICK_SECONDS

    return 2 * DEFAULT_TICK_SECONDS + BACKFILL_LEAD_SECONDS


def queue_depth(steady: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The campaign's queued runs over the steady state: its thirds' medians (steady: the last
    no deeper than the first by more than half, nor drained), its range, each sample's."""
    from statistics import median

    depths = [s.get("runs", {}).get("queued", 0) for s in steady]
    if len(depths) < 3:
        return None
    third = len(depths) // 3
    # The launch slots the queue kept filled: runs starting or started against the limit.
    held = [
        (s["runs"].get("starting", 0) + s["runs"].get("started", 0)) / s["limit"]
        for s in steady
        if s.get("limit") and "runs" in s
    ]
    return {
        "first_third_median": median(depths[:third]),
        "last_third_median": median(depths[-third:]),
        "min": min(depths),
        "max": max(depths),
        "slots_held_mean": round(sum(held) / len(held), 3) if held else None,
        "samples": depths,
    }


# -- figures ---------------------------------------------------------------------------------------


def figures(samples: list[Any]) -> list[Any]:
    from benchmarks.common import Result, median

    results: list[Any] = []
    for sample in samples:
        details = sample.details.get("campaign")
        if not details or "summary" not in details:
            continue
        summary = details["summary"]
        at = f"@{sample.size:,}"
        base = {"state": details.get("state"), "standin": details["standin"]}
        limit = summary["window_episodes"] + summary["wave_size"]
        live = Result(
            stage="fleet", metric=f"campaign_live_partitions_max{at}",
            ours=summary["live_partitions_max"] or 0, baseline=limit, unit="partitions",
            better="lower", baseline_name="the retention window + one wave",
            details={**base, "load_average": summary["live_partitions_max_load"]},
            target="≤ window + one wave",
        )  # fmt: skip
        live.met = live.ours <= limit
        results.append(live)
        for page, found in details.get("ui", {}).items():
            for variant, value in (
                ("", median(found["warm_seconds"] or [found["cold_seconds"]])),
                ("_after_add", found["after_add_seconds"]),
            ):
                result = Result(
                    stage="fleet", metric=f"campaign_ui_{page}{variant}{at}", ours=value,
                    baseline=UI_PAGE_SECONDS, unit="s", better="lower",
                    baseline_name="the target", details={**base, **found},
                    target=f"≤ {UI_PAGE_SECONDS:g} s",
                )  # fmt: skip
                result.met = value <= UI_PAGE_SECONDS
                results.append(result)
        if "ceiling" in details:
            ceiling = details["ceiling"]["runs_per_second"]
            throughput = Result(
                stage="fleet", metric=f"campaign_throughput{at}",
                ours=summary["steady_rate_episodes_per_second"], baseline=ceiling,
                unit="episodes/s", better="higher",
                baseline_name="the run queue's measured rate alone (same daemon, stand-in)",
                details={**base, **summary, "ceiling": details["ceiling"]},
                target=f"≥ {THROUGHPUT_FACTOR}x the ceiling",
            )  # fmt: skip
            throughput.met = throughput.ours >= THROUGHPUT_FACTOR * ceiling
            results.append(throughput)
        results += plan_figures(summary, base, at)
        idle = [u["seconds"] for u in details["upload_idle"]]
        busy = [u["seconds"] for u in details["upload_during"]]
        upload = Result(
            stage="fleet", metric=f"campaign_upload_to_launch{at}", ours=median(busy),
            baseline=median(idle), unit="s", better="lower", repeats=len(busy),
            baseline_name="the same before the campaign (idle), same daemon",
            ours_samples=busy, baseline_samples=idle,
            details={**base, "during": details["upload_during"], "idle": details["upload_idle"]},
            target=f"≤ {UPLOAD_FACTOR}x idle",
        )  # fmt: skip
        upload.met = upload.ours <= UPLOAD_FACTOR * upload.baseline
        results.append(upload)
        kill = details["kill"]
        after = kill["after"]
        broken = (
            after["episodes_run_twice"]
            + after["succeeded_without_its_run"]
            + after["run_but_not_succeeded_nor_in_flight"]
        )
        before_done = kill["before"]["counts"].get("succeeded", 0)
        lost = max(0, before_done - after["counts"].get("succeeded", 0))
        result = Result(
            stage="fleet", metric=f"campaign_kill_lost_or_doubled{at}", ours=broken + lost,
            baseline=max(1, after["standin_runs"]), unit="episodes", better="lower",
            baseline_name="the campaign's stand-in runs (target: none lost or doubled)",
            details={**base, **kill},
            target="0",
        )  # fmt: skip
        result.met = result.ours == 0
        results.append(result)
    return results


def plan_figures(summary: dict[str, Any], base: dict[str, Any], at: str) -> list[Any]:
    """The rate against what a million a day needs (the default plan's beside it), and the
    queue's depth through the steady state, when the campaign ran at the plan's run rate."""
    from benchmarks.common import Result

    plan, depth = summary.get("plan"), summary.get("queue_depth")
    if not plan:
        return []
    need = plan["day_needs_episodes_per_second"]
    rate = Result(
        stage="fleet", metric=f"campaign_rate_vs_plan{at}",
        ours=summary["steady_rate_episodes_per_second"], baseline=need, unit="episodes/s",
        better="higher", baseline_name=f"a million in 24 h (the default plan: "
        f"{plan['episodes_per_second']:g}/s, K = {plan['episodes_per_run']})",
        details={**base, **summary}, target="≥ a million a day",
    )  # fmt: skip
    rate.met = rate.ours >= need
    results = [rate]
    if depth:
        steady = Result(
            stage="fleet", metric=f"campaign_queue_depth{at}",
            ours=depth["last_third_median"], baseline=max(1, depth["first_third_median"]),
            unit="runs", better="lower",
            baseline_name="the same in the steady state's first third (its growth)",
            details={**base, "queue_depth": depth}, target=f"≤ {QUEUE_GROWTH}x, never drained",
        )  # fmt: skip
        steady.met = steady.ratio <= QUEUE_GROWTH and depth["min"] > 0
        results.append(steady)
    return results


# -- the profile of the missed targets -------------------------------------------------------------


def top_frames(collapsed: Path, top: int = 25) -> list[str]:
    """py-spy's raw (collapsed) stacks → the frames with the most samples, inclusive."""
    samples: dict[str, int] = {}
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        total += int(count)
        for frame in {re.sub(r":\d+\)$", ")", f) for f in stack.split(";")}:
            samples[frame] = samples.get(frame, 0) + int(count)
    plumbing = ("(threading.py)", "(asyncio/", "(anyio/", "process ")  # in every sample
    ranked = sorted(
        ((frame, n) for frame, n in samples.items() if not any(p in frame for p in plumbing)),
        key=lambda item: -item[1],
    )[:top]
    lines = [f"{collapsed.name}: {total} samples at 100 Hz"]
    lines += [f"  {100 * n / max(1, total):5.1f}%  {frame}" for frame, n in ranked]
    return lines


def write_profile(results: dict[str, Any], pyspy: Path | None, target: Path) -> None:
    """Where a missed target's time goes: the driver's waves and the samples (throughput, the
    live count), and the webserver's py-spy stacks after an added partition (the pages)."""
    lines = [f"# fleet-campaign: where the missed targets' time goes ({results['generated_at']})"]
    for row in results["results"]:
        if row["stage"] == "fleet" and row["metric"].startswith("campaign_"):
            met = {True: "met", False: "MISSED", None: "-"}[row.get("met")]
            lines.append(f"- {row['metric']}: {row['ours']} {row['unit']} against "
                         f"{row['baseline']} ({row.get('target')}): {met}")  # fmt: skip
    throughput = next(
        (r for r in results["results"] if r["metric"].startswith("campaign_throughput")), None
    )
    details = (throughput or {}).get("details", {})
    campaign = next(
        (s["details"]["campaign"] for s in results.get("facts", {}).get("fleet_samples", [])
         if "campaign" in s.get("details", {})), None,
    )  # fmt: skip
    if campaign:
        decisions = campaign.get("decisions", [])
        start = decisions[0]["at"] if decisions else 0.0
        lines += ["", "## The driver's waves (campaign_decisions)", ""]
        lines += [f"  +{d['at'] - start:7.1f} s  {d['kind']:<9} {d['message']}" for d in decisions]
        lines += ["", "## Samples (t, load, live partitions, ledger, campaign runs, limit)", ""]
        first = campaign["samples"][0]["t"] if campaign.get("samples") else 0.0
        for sample in campaign.get("samples", []):
            lines.append(
                f"  +{sample['t'] - first:6.1f} s load {sample['load']:5.2f} live "
                f"{sample['live_partitions']} {sample['counts']} runs {sample.get('runs')} "
                f"limit {sample.get('limit')} next_wave {sample['next_wave']}"
            )
    if details:
        wanted = ("steady_rate_episodes_per_second", "steady_from_to", "steady_load_average",
                  "succeeded_in_slice", "extrapolated_hours_to_finish", "ceiling")  # fmt: skip
        summary = {key: details[key] for key in wanted if key in details}
        lines += ["", "## Throughput", "", f"  {json.dumps(summary, default=str)}"]
        if campaign:
            rates = {
                k: campaign.get(k) for k in ("ledger_rate_before_the_kill", "rate_with_the_kill")
            }
            lines.append(f"  ledger rates: {json.dumps(rates)}")
    if pyspy and pyspy.exists():
        lines += ["", "## UI pages after an added partition: py-spy of the webserver", ""]
        for collapsed in sorted(pyspy.glob("pyspy-after-add-*.txt")):
            lines += [*top_frames(collapsed), ""]
    target.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"] and len(sys.argv) in (3, 4):
        standin_worker(Path(sys.argv[2]), *(float(a) for a in sys.argv[3:]))
    elif sys.argv[1:2] == ["profile"] and len(sys.argv) == 5:
        found = json.loads(Path(sys.argv[2]).read_text())
        write_profile(found, Path(sys.argv[3]), Path(sys.argv[4]))
    else:
        print("python -m benchmarks.fleet_campaign worker STOP_FILE [RUN_SECONDS]\n"
              "python -m benchmarks.fleet_campaign profile LATEST.json PYSPY_DIR OUT.txt",
              file=sys.stderr)  # fmt: skip
        sys.exit(2)
