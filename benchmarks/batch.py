"""Stage `batch`: task-seconds per episode of a campaign's batch run at K = 10 against K = 1.

Each side is one run of `process_episode_batch` executed by the run worker's own command,
`dagster api execute_run` (what `EcsRunLauncher` gives a run's ECS task as its command, and the
process the local launcher starts per run), timed from exec to exit: the task-seconds the run
costs, cold start aside. The batch's episodes are short (`batch_cameras` cameras, 1 by default,
`batch_seconds` s, 320x240 H.264), each processed as its own child run in that one process.

- `task_s_per_episode`: ours the K = `batch_k` batch's seconds / K, baseline a batch of one
  (K = 1: each episode pays the process start, imports and instance alone).
- `task_s_per_episode_cold`: the same with an ECS cold start added to each task, the ~60 s
  platform-notes.md gives for Fargate (never cached images); not measured here, added per task.
- `cpu_s_per_episode`: the same as CPU seconds of the run worker and the children it waited
  for (the transcode program, FFmpeg; not the stack's PostgreSQL and moto): steadier than wall
  time on a shared machine, where the wall grows with the load.
- `batch_of_one`: the batch of one against the uploads' own run, `process_episode` of the same
  episode by the same command: what the batch job adds at K = 1 (uploads keep K = 1 and this
  job is not theirs).
- `ladder_only_task_s_per_episode`: a ladder-only campaign's batch of the same K episodes (its
  run tagged with the selection `hls_renditions` and what depends on it, as the driver tags a
  wave: campaign/assets.py), against the whole graph's K side; with the cold start added, and
  as CPU seconds (`ladder_only_cpu_s_per_episode`).
  Each episode's own run then loads `extracted_files` as stored and leaves its frames. The
  figure's details give, for both sides, what their episode runs executed (`steps`: each step's
  runs and median seconds, the assets materialized, from the runs' own events) and
  `materialized_outside_selection`, empty unless a ladder-only run ran more than its selection.

Its details also give what `campaign plan` counts per task and per episode (campaign/capacity.py):
the most database connections a run worker held at once (PostgreSQL's client backends, sampled
every 0.2 s, less those open before it started: the stack is the stage's alone) and the objects
one episode writes to the bucket (its S3 PUTs, counted on the first batch's new keys).

Each repeat makes new batches of the same uploaded episodes (a batch skips the episodes it
already processed); the sides run interleaved.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import BenchContext, Result, median, seconds_result

NAME = "batch"
COLD_START_SECONDS = 60.0  # Fargate's, platform-notes.md (ECS); added, not measured
RUN_TIMEOUT_SECONDS = 1800  # one batch process; a hang fails the stage
REPOSITORY = "__repository__"


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


CLIENT_BACKENDS = (
    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
    " AND pid <> pg_backend_pid()"
)


class PeakConnections:
    """The most client connections the server held above `baseline` while the sampler ran."""

    def __init__(self, database: Any) -> None:
        self.database = database
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _count(self, conn: Any) -> int:
        return int(conn.execute(CLIENT_BACKENDS).fetchone()[0])

    def __enter__(self) -> PeakConnections:
        from episode_pipeline.db.connection import connect

        def sample() -> None:
            with connect(self.database, autocommit=True) as conn:
                baseline = self._count(conn)
                ready.set()
                while not self._stop.wait(0.2):
                    self.peak = max(self.peak, self._count(conn) - baseline)

        ready = threading.Event()
        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)


def run_worker(env: dict[str, str], command: list[str], database: Any) -> tuple[float, float, int]:
    """Exec the run worker's command and wait for its exit: its wall seconds, the CPU seconds
    of it and every child it waited for (the transcode program, FFmpeg), and the most database
    connections it held at once."""
    cpu_before = children_cpu()
    started = time.perf_counter()
    with PeakConnections(database) as connections:
        out = subprocess.run(
            command,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_SECONDS,
            check=False,
        )
    wall = time.perf_counter() - started
    if out.returncode != 0:
        raise RuntimeError(f"{NAME}: run worker failed:\n{(out.stdout + out.stderr)[-3000:]}")
    return wall, children_cpu() - cpu_before, connections.peak


def cold_share(walls: list[float]) -> float:
    """The cold start's share of a task: its seconds over the task's whole life."""
    return round(COLD_START_SECONDS / (median(walls) + COLD_START_SECONDS), 3)


class Runs:
    """Creates runs in the stack's instance as the daemon would (with their code origin) and
    returns the run worker's command for each."""

    def __init__(self, instance: Any, settings: Any) -> None:
        from dagster._core.remote_origin import InProcessCodeLocationOrigin
        from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

        from episode_pipeline.definitions import build_definitions

        self.instance = instance
        self.defs = build_definitions(settings)
        self.origin = InProcessCodeLocationOrigin(
            LoadableTargetOrigin(
                executable_path=sys.executable, module_name="episode_pipeline.definitions"
            )
        )
        with self.origin.create_location(instance) as location:
            repository = location.get_repository(REPOSITORY)
            self.code_origins = {
                job.name: job.get_python_origin() for job in repository.get_all_jobs()
            }

    def command(
        self, job_name: str, partition_key: str, tags: dict[str, str] | None = None
    ) -> tuple[str, list[str]]:
        from dagster import DagsterRunStatus
        from dagster._core.remote_origin import RemoteJobOrigin, RemoteRepositoryOrigin
        from dagster._core.storage.tags import PARTITION_NAME_TAG
        from dagster._grpc.types import ExecuteRunArgs

        job = self.defs.resolve_job_def(job_name)
        run = self.instance.create_run_for_job(
            job_def=job,
            tags={**job.run_tags, PARTITION_NAME_TAG: partition_key, **(tags or {})},
            remote_job_origin=RemoteJobOrigin(
                RemoteRepositoryOrigin(self.origin, REPOSITORY), job_name
            ),
            job_code_origin=self.code_origins[job_name],
            status=DagsterRunStatus.NOT_STARTED,
        )
        args = ExecuteRunArgs(
            job_origin=self.code_origins[job_name],
            run_id=run.run_id,
            instance_ref=self.instance.get_ref(),
        )
        return run.run_id, args.get_command_args()


def bucket_objects(settings: Any) -> int:
    """Objects in the data bucket (the stack is the stage's alone)."""
    from episode_pipeline.storage.bucket import Bucket

    return sum(1 for _ in Bucket(settings.bucket, settings.aws).iter_objects(""))


def prepare(ctx: BenchContext) -> tuple[Any, list[Any], dict[str, str]]:
    """K short episodes uploaded; the settings and the env the run worker gets."""
    from episode_pipeline.config.settings import Settings
    from episode_pipeline.episodes.keys import EpisodeRef
    from episode_pipeline.local.upload import upload_episode
    from episode_pipeline.samples.writer import SampleSpec, write_sample

    stack = ctx.stack()
    settings = Settings.from_env(stack.env)
    archive = ctx.workdir / NAME / "short.tar.zst"
    archive.parent.mkdir(parents=True, exist_ok=True)
    spec = SampleSpec(cameras=ctx.config.batch_cameras, seconds=ctx.config.batch_seconds)
    write_sample(archive, spec)
    refs = [
        EpisodeRef("bench-batch", f"ep-{uuid.uuid4().hex[:8]}") for _ in range(ctx.config.batch_k)
    ]
    for ref in refs:
        upload_episode(archive, ref, settings)
    env = {**os.environ, **stack.env, "EPISODE_PIPELINE_HOME": stack.home}
    # `dagster` as the task's image has it on PATH: this interpreter's.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return settings, refs, env


def run(ctx: BenchContext) -> list[Result]:
    saved = dict(os.environ)
    try:
        return measure(ctx)
    finally:  # the stack's variables were this process's for the stage (its runs' config)
        os.environ.clear()
        os.environ.update(saved)


def measure(ctx: BenchContext) -> list[Result]:
    from dagster import DagsterInstance, DagsterRunStatus

    from episode_pipeline.db.batches import create_batch
    from episode_pipeline.db.connection import connect
    from episode_pipeline.defs.partitions import BATCHES_PARTITION_NAME, EPISODES_PARTITION_NAME
    from episode_pipeline.episodes.batches import batch_key
    from episode_pipeline.instance.run_tags import (
        BATCH_JOB_NAME,
        CAMPAIGN_ASSETS_TAG,
        EPISODE_JOB_NAME,
        assets_tags,
    )
    from episode_pipeline.samples.writer import SampleSpec

    k = ctx.config.batch_k
    with ctx.phase("set-up: sample, uploads, code location"):
        settings, refs, env = prepare(ctx)
        os.environ.update(env)  # the code location's settings and its runs' config read them
        instance = DagsterInstance.from_config(ctx.stack().env["DAGSTER_HOME"])
        runs = Runs(instance, settings)
        instance.add_dynamic_partitions(EPISODES_PARTITION_NAME, [refs[0].partition_key])
    campaign = f"bench{uuid.uuid4().hex[:6]}"

    ladder = assets_tags(ladder_only_assets(runs.defs))

    def batch(
        repeat: int,
        episodes: list[Any],
        number: int | None = None,
        tags: dict[str, str] | None = None,
    ) -> tuple[str, tuple[float, float, int]]:
        key = batch_key(campaign, repeat, len(episodes) if number is None else number)
        with connect(settings.database) as conn:
            create_batch(conn, key, episodes)
            conn.commit()
        instance.add_dynamic_partitions(BATCHES_PARTITION_NAME, [key])
        run_id, command = runs.command(BATCH_JOB_NAME, key, tags)
        return run_id, run_worker(env, command, settings.database)

    sides = ("k", "one", "upload", "ladder")
    walls: dict[str, list[float]] = {side: [] for side in sides}
    cpus: dict[str, list[float]] = {side: [] for side in sides}
    connections: dict[str, list[int]] = {side: [] for side in sides}
    run_ids: dict[str, list[str]] = {side: [] for side in sides}

    def measured(side: str, run_id: str, measure: tuple[float, float, int]) -> None:
        walls[side].append(measure[0])
        cpus[side].append(measure[1])
        connections[side].append(measure[2])
        run_ids[side].append(run_id)

    objects_before = bucket_objects(settings)
    objects_per_episode = 0.0
    for repeat in range(ctx.config.repeats):
        with ctx.phase(f"ours: K={k}"):
            measured("k", *batch(repeat, refs))
        if repeat == 0:  # the K episodes' first processing: every key they write is new
            objects_per_episode = (bucket_objects(settings) - objects_before) / k
        with ctx.phase("baseline: K=1"):
            measured("one", *batch(repeat, refs[:1]))
        with ctx.phase("baseline: the uploads' run"):
            run_id, command = runs.command(EPISODE_JOB_NAME, refs[0].partition_key)
            measured("upload", run_id, run_worker(env, command, settings.database))
        with ctx.phase(f"ours: a ladder-only campaign's batch, K={k}"):
            # The K side processed these episodes: their extracted files are stored.
            measured("ladder", *batch(repeat, refs, number=k + 1, tags=ladder))
    every_run = [run_id for ids in run_ids.values() for run_id in ids]
    statuses = {instance.get_run_by_id(run_id).status for run_id in every_run}  # type: ignore[union-attr]
    if statuses != {DagsterRunStatus.SUCCESS}:
        raise RuntimeError(f"{NAME}: runs ended {statuses}")
    # What each side's episode runs executed, step by step: a ladder-only run must leave out
    # extraction and frames, and where its seconds go says what the selection saves.
    steps = {side: batch_steps(instance, run_ids[side]) for side in ("k", "ladder")}
    instance.dispose()

    details = {
        "episode": f"{ctx.config.batch_cameras} camera(s), {ctx.config.batch_seconds:g} s, "
        "320x240 H.264",
        "archive_bytes": (ctx.workdir / NAME / "short.tar.zst").stat().st_size,
        "frame_rows_per_episode": round(ctx.config.batch_seconds * SampleSpec.fps),
        "s3_objects_per_episode": round(objects_per_episode, 1),
        "db_connections_peak": connections,
        "k": k,
        "process_seconds": {name: [round(w, 2) for w in values] for name, values in walls.items()},
        "process_cpu_seconds": {
            name: [round(c, 2) for c in values] for name, values in cpus.items()
        },
        "cold_start_s": COLD_START_SECONDS,
    }
    per_episode = seconds_result(
        NAME, f"task_s_per_episode@K={k}", [w / k for w in walls["k"]], walls["one"],
        baseline_name="a batch of one (K = 1), the same command", details=details,
    )  # fmt: skip
    cold = seconds_result(
        NAME, f"task_s_per_episode_cold@K={k}",
        [(w + COLD_START_SECONDS) / k for w in walls["k"]],
        [w + COLD_START_SECONDS for w in walls["one"]],
        baseline_name=f"K = 1, each task +{COLD_START_SECONDS:g} s cold start (not measured)",
        details={"cold_start_share": {f"K={k}": cold_share(walls["k"]),
                                      "K=1": cold_share(walls["one"])}},
    )  # fmt: skip
    cpu = seconds_result(
        NAME, f"cpu_s_per_episode@K={k}", [c / k for c in cpus["k"]], cpus["one"],
        baseline_name="a batch of one (K = 1): CPU of the worker and its children",
    )  # fmt: skip
    cpu.unit = "CPU s"
    of_one = seconds_result(
        NAME, "batch_of_one", walls["one"], walls["upload"],
        baseline_name="the uploads' run (process_episode) of the same episode, same command",
    )  # fmt: skip
    ladder_walls = [w / k for w in walls["ladder"]]
    ladder_only = seconds_result(
        NAME, f"ladder_only_task_s_per_episode@K={k}", ladder_walls, [w / k for w in walls["k"]],
        baseline_name=f"the whole graph's batch of the same K = {k} episodes, the same command",
        details={
            "assets": ladder[CAMPAIGN_ASSETS_TAG].split(","),
            "steps": {side: found.summary() for side, found in steps.items()},
            "materialized_outside_selection": sorted(
                steps["ladder"].materialized - set(ladder[CAMPAIGN_ASSETS_TAG].split(","))
            ),
        },
    )  # fmt: skip
    ladder_cold = seconds_result(
        NAME, f"ladder_only_task_s_per_episode_cold@K={k}",
        [(w + COLD_START_SECONDS) / k for w in walls["ladder"]],
        [(w + COLD_START_SECONDS) / k for w in walls["k"]],
        baseline_name=f"the whole graph's, each task +{COLD_START_SECONDS:g} s cold start",
    )  # fmt: skip
    ladder_cpu = seconds_result(
        NAME, f"ladder_only_cpu_s_per_episode@K={k}",
        [c / k for c in cpus["ladder"]], [c / k for c in cpus["k"]],
        baseline_name=f"the whole graph's batch of the same K = {k} episodes: CPU",
    )  # fmt: skip
    ladder_cpu.unit = "CPU s"
    return [per_episode, cold, cpu, of_one, ladder_only, ladder_cold, ladder_cpu]


@dataclass
class Steps:
    """What the episode runs of some batch runs executed: each step's seconds (one value per
    run that executed it) and the assets they materialized."""

    seconds: dict[str, list[float]] = field(default_factory=dict)
    materialized: set[str] = field(default_factory=set)
    runs: int = 0

    def add_run(self, events: Iterable[tuple[str, str, float]]) -> None:
        """One run's step events, `(step key, event type, timestamp)` in order."""
        self.runs += 1
        started: dict[str, float] = {}
        for step, kind, at in events:
            if kind == "STEP_START":
                started[step] = at
            elif kind in ("STEP_SUCCESS", "STEP_FAILURE") and step in started:
                self.seconds.setdefault(step, []).append(at - started.pop(step))

    def summary(self) -> dict[str, Any]:
        """Per step: the runs that executed it and its median seconds."""
        return {
            "runs": self.runs,
            "materialized": sorted(self.materialized),
            "step_seconds_median": {
                step: round(median(values), 2) for step, values in sorted(self.seconds.items())
            },
            "step_runs": {step: len(values) for step, values in sorted(self.seconds.items())},
        }


def batch_steps(instance: Any, batch_run_ids: list[str]) -> Steps:
    """The steps and materializations of every episode run these batch runs made."""
    from dagster import DagsterEventType, RunsFilter

    from episode_pipeline.instance.run_tags import BATCH_RUN_TAG

    kinds = {
        DagsterEventType.STEP_START,
        DagsterEventType.STEP_SUCCESS,
        DagsterEventType.STEP_FAILURE,
        DagsterEventType.ASSET_MATERIALIZATION,
    }
    found = Steps()
    for batch_run_id in batch_run_ids:
        for run in instance.get_runs(RunsFilter(tags={BATCH_RUN_TAG: batch_run_id})):
            entries = [
                entry for entry in instance.all_logs(run.run_id)
                if entry.dagster_event is not None and entry.dagster_event.event_type in kinds
            ]  # fmt: skip
            found.add_run(
                (entry.step_key or "", entry.dagster_event.event_type_value, entry.timestamp)
                for entry in entries
            )
            found.materialized.update(
                entry.dagster_event.asset_key.to_user_string()
                for entry in entries
                if entry.dagster_event.event_type == DagsterEventType.ASSET_MATERIALIZATION
            )
    return found


def ladder_only_assets(defs: Any) -> list[str]:
    """A ladder change's selection: `hls_renditions` and what depends on it, in graph order."""
    from episode_pipeline.campaign.assets import downstream_closure
    from episode_pipeline.defs.code_versions import asset_children
    from episode_pipeline.defs.jobs import EPISODE_ASSETS

    closure = downstream_closure(["hls_renditions"], asset_children(defs.resolve_asset_graph()))
    return [name for name in EPISODE_ASSETS if name in closure]
