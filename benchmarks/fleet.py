"""Stage `fleet`: every per-upload operation against the size of the fleet (issue 18).

The deployment is built synthetically but truthfully in the real stores (`fleet_state`): N
dynamic partitions, N application rows (and a `uuid`-id variant), N past successful runs with the
upload sensor's tags and their materialization and check events, S3 archives where the
reconciliation walk reads them. The store grows through the sizes of `fleet_sizes` (make bench:
1,000 then 10,000; `--set fleet_sizes=1000,10000,100000` for a full run), and at each size the
same operations are measured; the figure is the **growth factor**: the operation at N against the
same operation at the first size (1,000), both in this run. Every operation goes through the
product's public entry point (a sensor's evaluation as the daemon calls it, the CLI as a user
runs it, the GraphQL queries the UI sends), so a rerun measures whatever the code then does:

- `uploads_tick`: one `episode_uploads` tick deciding `fleet_new_uploads` (300) new uploads
  (`evaluate_uploads`, moto queues of ten as in the `sensor` stage); `uploads_tick_sql`: the
  seconds of its SQL statements alone (`fleet_probe`);
- `heartbeat`: one `episode_upload_heartbeat` evaluation (`keep_in_flight`) over
  `fleet_burst` (1,000) queued runs that hold received messages;
- `done_release`: those runs succeed at once (a `RUN_SUCCESS` event each, as a run worker
  reports it); `episode_upload_done` is evaluated tick after tick (its cursor carried, exactly as
  the daemon keeps it) until every message is deleted. Time is on Dagster's schedule: a tick
  every `minimum_interval_seconds` or its own duration, whichever is longer; messages deleted
  after the queue's visibility timeout would have come back (`came_back`);
- `reconcile_*`: `waiting_uploads` ticks (with `lost_upload_after_seconds=0`, so an archive is
  lost as soon as it is written) walk the application table from the start; a lost upload is
  the newest episode row (an archive with no event, no run, no partition). Reported: seconds per
  tick, S3 and database requests per tick and per hour, and the time until the lost upload's
  run request: measured when it is found within `fleet_reconcile_ticks`, else the walk's
  position extrapolated at the ticks' measured pace (what a walk of the whole table takes);
  the same tick on the `uuid` application database;
- `status` and `process_start`: `episode-pipeline status fleet/ep-…` and `episode-pipeline
  process` of a new 1-second sample episode (exec until the run's first event), on the stack;
- `ui_*` (`fleet_ui`): the GraphQL documents the UI's asset page, its partitions view, one
  episode's partition page and the backfill dialog send, captured from a real browser on a
  `dagster-webserver` of this instance and replayed; and launching a backfill of `fleet_burst`
  episodes;
- storage: rows and bytes of Dagster's tables that the real sample run wrote (one episode, all
  its events), and of the whole store at each size.

Targets (issue 18): per-upload work ≤ 1.5x its N = 1,000 cost (the issue's is at 1,000,000);
each UI page ≤ 3 s; a lost upload found within 1 hour; the done sensor releases a burst within
2 minutes. Set-up (building the state) is not measured; its seconds are in `phases_s`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from benchmarks import fleet_state, sensor, startup
from benchmarks.common import BenchContext, Result, median
from benchmarks.fleet_common import UI_PAGE_SECONDS, Sample, fleet_stack, sizes
from benchmarks.fleet_probe import Probe
from episode_pipeline.episodes.keys import EpisodeRef

NAME = "fleet"
PER_UPLOAD_FACTOR = 1.5
LOST_UPLOAD_SECONDS = 3600
DONE_RELEASE_SECONDS = 120
CLI_TIMEOUT_SECONDS = 600
MAX_DONE_TICKS = 2_000
STATUS_PAGE = 20  # episodes `status` without an episode lists in the benchmark
UI_ONLY = 2  # `fleet_ui=2`: the UI's figures alone at each size (results/fleet-ui/)


# -- the stack and the state --------------------------------------------------------------------


def cli_env(info: Any) -> dict[str, str]:
    """What a user has: the stack's home, nothing exported (the CLI finds the rest there)."""
    return {**os.environ, "EPISODE_PIPELINE_HOME": str(info.home)}


def sample_archive(ctx: BenchContext) -> Path:
    from episode_pipeline.samples.writer import SampleSpec, write_sample

    archive = ctx.workdir / "fleet" / fleet_state.ARCHIVE_NAME
    archive.parent.mkdir(parents=True, exist_ok=True)
    write_sample(archive, SampleSpec(cameras=1, seconds=1.0))
    return archive


def new_processed_episode(
    info: Any, settings: Any, archive: Path, org: str
) -> tuple[EpisodeRef, dict[str, Any]]:
    """Upload the sample as a new episode and `episode-pipeline process` it (the real run)."""
    from episode_pipeline.local.upload import upload_episode

    ref = EpisodeRef(org, f"ep-{org}-{uuid.uuid4().hex[:8]}")
    upload_episode(archive, ref, settings)
    return ref, startup.process_once(cli_env(info), ref)


# -- measuring ----------------------------------------------------------------------------------


class QueueResource:
    """The upload queue resource the sensors are given: its client is the sharded queue."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def get_client(self) -> Any:
        return self.queue


class BucketResource:
    """The data-bucket resource the uploads sensor HEADs new uploads through."""

    def __init__(self, bucket: Any) -> None:
        self.bucket = bucket

    def get_client(self) -> Any:
        return self.bucket


class CountingQueue(sensor.ShardedQueue):
    """The sharded queue, counting successful deletes (the done sensor's work)."""

    def __init__(self, queues: list[Any], messages: int) -> None:
        super().__init__(queues, messages)
        self.deleted: set[str] = set()

    def delete(self, receipt_handle: str) -> bool:
        ok = super().delete(receipt_handle)
        if ok:
            self.deleted.add(receipt_handle)
        return ok


def evaluate(sensor_def: Any, context: Any, instance: Any) -> Any:
    """One tick as the daemon's code server evaluates it: the sensor's function, then its run
    requests resolved and their partition keys checked against the instance (`context` was
    built by `sensor_context`)."""
    return sensor_def.evaluate_tick(context)


def sensor_context(instance: Any, **kwargs: Any) -> Any:
    """A sensor context as the code server builds it: with the instance's ref (partition keys
    of run requests are checked through it)."""
    from dagster import build_sensor_context

    return build_sensor_context(instance=instance, instance_ref=instance.get_ref(), **kwargs)


def measure_uploads_tick(ctx: BenchContext, fleet: Any, sample: Sample, repeat: int) -> None:

    from episode_pipeline.defs.sensors import sqs as upload_sensors

    count = ctx.config.fleet_new_uploads
    shim = SimpleNamespace(stack=lambda: fleet.info)
    with (
        sensor.sharded_queue(shim, count) as queues,  # type: ignore[arg-type]
        sensor.bench_bucket(shim) as bucket,  # type: ignore[arg-type]
    ):
        keys = sensor.enqueue_sharded(queues, f"n{sample.size}-r{repeat}", count, bucket)
        queue = sensor.ShardedQueue(queues, count)
        uploads = fleet.definitions.get_sensor_def(upload_sensors.UPLOADS_SENSOR_NAME)
        context = sensor_context(
            fleet.instance, sensor_name=uploads.name,
            resources={"upload_queue": QueueResource(queue), "s3": BucketResource(bucket)},
            repository_def=fleet.definitions.get_repository_def(),
        )  # fmt: skip
        with Probe() as probe:
            started = time.perf_counter()
            result = evaluate(uploads, context, fleet.instance)
            seconds = time.perf_counter() - started
    requests = result.run_requests or []
    requested = {(r.run_key or "").split("@", 1)[0] for r in requests}
    sample.add("uploads_tick", seconds)
    sample.add("uploads_tick_sql", probe.sql_seconds)
    sample.details.setdefault("uploads_tick", []).append(
        {"requested": len(requested), "of": len(keys), **probe.summary()}
    )
    for request in result.dynamic_partitions_requests or []:  # as the daemon does next
        fleet.instance.add_dynamic_partitions(
            request.partitions_def_name, list(request.partition_keys)
        )


def hold_burst(fleet: Any, queues: list[Any], count: int, prefix: str) -> CountingQueue:
    """`count` started runs of the episode job, each holding one received message."""
    from dagster import DagsterRun, DagsterRunStatus

    from episode_pipeline.instance.run_tags import EPISODE_JOB_NAME, episode_tags
    from episode_pipeline.orchestration.upload_runs import sqs_tag
    from episode_pipeline.uploads.deliveries import HeldMessage

    sensor.enqueue_sharded(queues, prefix, count)
    queue = CountingQueue(queues, count)
    shares = zip(queues, sensor.shard_sizes(len(queues), count), strict=True)
    for shard, messages in zip(queues, sensor.in_parallel(sensor.receive_all, shares), strict=True):
        queue.own(shard, messages)
    runs = []
    for index, (handle, message_id) in enumerate(queue.message_ids.items()):
        key = f"fleet/{prefix}-{index:05d}"
        tags = {
            **episode_tags(key),
            "dagster/partition": key,
            **sqs_tag([HeldMessage(message_id, handle, 1)]),
        }
        # Started (a queued run needs a remote origin): with none, the done sensor evaluated
        # here (no code location) matches the run, as the daemon's does its own location's.
        runs.append(
            DagsterRun(
                job_name=EPISODE_JOB_NAME,
                run_id=str(uuid.uuid4()),
                status=DagsterRunStatus.STARTED,
                tags=tags,
            )
        )
    sensor.add_runs(fleet.instance, runs)
    if len(runs) != count:
        raise RuntimeError(f"{NAME}: received {len(runs)} of {count} messages to hold")
    queue.run_ids = [run.run_id for run in runs]  # type: ignore[attr-defined]
    return queue


def measure_heartbeat_and_done(ctx: BenchContext, fleet: Any, sample: Sample) -> None:
    from dagster import DagsterEvent, DagsterEventType

    from episode_pipeline.config.settings import QueueSettings
    from episode_pipeline.defs.sensors import sqs as upload_sensors
    from episode_pipeline.instance.run_tags import EPISODE_JOB_NAME
    from episode_pipeline.orchestration.upload_runs import keep_in_flight

    count = ctx.config.fleet_burst
    shim = SimpleNamespace(stack=lambda: fleet.info)
    with sensor.sharded_queue(shim, count) as queues:  # type: ignore[arg-type]
        with ctx.phase("set-up: burst runs holding messages"):
            queue = hold_burst(fleet, queues, count, f"burst-{sample.size}")
        for _ in range(ctx.config.repeats):
            with Probe() as probe:
                started = time.perf_counter()
                renewed = keep_in_flight(fleet.instance, queue, sensor.LOG)  # type: ignore[arg-type]
                sample.add("heartbeat", time.perf_counter() - started)
            sample.details.setdefault("heartbeat", []).append(
                {"renewed": renewed, "of": count, **probe.summary()}
            )
        done = fleet.definitions.get_sensor_def(upload_sensors.UPLOAD_DONE_SENSOR_NAME)
        resources = {"upload_queue": QueueResource(queue)}
        first = evaluate(done, sensor_context(fleet.instance, resources=resources), fleet.instance)
        cursor = first.cursor
        with ctx.phase("set-up: burst runs succeed"):

            def succeed(run_id: str) -> None:
                fleet.instance.report_dagster_event(
                    DagsterEvent(
                        event_type_value=DagsterEventType.RUN_SUCCESS.value,
                        job_name=EPISODE_JOB_NAME,
                        message="Finished execution of run (benchmark).",
                    ),
                    run_id,
                )

            sensor.in_parallel(succeed, queue.run_ids)  # type: ignore[attr-defined]
        interval = done.minimum_interval_seconds or 30
        visibility = QueueSettings().visibility_timeout_seconds
        clock = 0.0
        ticks: list[float] = []
        came_back = 0
        with Probe() as probe:
            while len(queue.deleted) < count and len(ticks) < MAX_DONE_TICKS:
                before = len(queue.deleted)
                context = sensor_context(fleet.instance, cursor=cursor, resources=resources)
                started = time.perf_counter()
                data = evaluate(done, context, fleet.instance)
                seconds = time.perf_counter() - started
                cursor = data.cursor or cursor
                ticks.append(seconds)
                clock += seconds if not ticks[:-1] else max(interval, seconds)
                if clock > visibility:
                    came_back += len(queue.deleted) - before
        if len(queue.deleted) < count:
            clock = math.inf
        sample.add("done_release", clock)
        sample.add("done_tick", median(ticks) if ticks else math.inf)
        sample.details["done"] = {
            "runs": count,
            "deleted": len(queue.deleted),
            "ticks": len(ticks),
            "interval_seconds": interval,
            "tick_seconds_median": round(median(ticks), 3) if ticks else None,
            "tick_seconds_max": round(max(ticks), 3) if ticks else None,
            "modelled_seconds": round(clock, 1) if math.isfinite(clock) else None,
            "came_back_after_visibility_timeout": came_back,
            "visibility_timeout_seconds": visibility,
            "process_limit_env": os.environ.get("DAGSTER_RUN_STATUS_SENSOR_PROCESS_LIMIT"),
            **probe.summary(),
        }
        sample.details["done"]["came_back"] = came_back
        with ctx.phase("set-up: burst runs deleted"):  # gone before the next size
            sensor.in_parallel(fleet.instance.delete_run, queue.run_ids)  # type: ignore[attr-defined]


def deployed(settings: Any) -> Any:
    """The code location's `Definitions` as the daemon loads them (`build_definitions`), with
    what its loader sets up for the process that evaluates the sensors (the run-status
    sensors' per-tick limits, when the location sets them)."""
    from episode_pipeline import definitions as location

    set_up = getattr(location, "apply_run_status_sensor_limits", None)
    if set_up is not None:
        set_up()
    return location.build_definitions(settings)


def reconcile_sensor(settings: Any) -> tuple[Any, Any, Any]:
    """`waiting_uploads` as deployed, except that an archive is lost as soon as it is written."""
    from episode_pipeline.defs.sensors import reconcile

    reconcile_settings = dataclasses.replace(settings.reconcile, lost_upload_after_seconds=0)
    definitions = deployed(dataclasses.replace(settings, reconcile=reconcile_settings))
    waiting = definitions.get_sensor_def(reconcile.WAITING_UPLOADS_SENSOR_NAME)
    return waiting, definitions, reconcile_settings


def add_lost_upload(fleet: Any, size: int) -> tuple[EpisodeRef, str]:
    """An archive with no event, no run, no partition: the newest row of both tables."""
    from episode_pipeline.db.connection import connect
    from episode_pipeline.storage.bucket import Bucket

    ref = EpisodeRef(fleet_state.FLEET_ORG, f"ep-zlost-{size:07d}")
    lost_uuid = f"ffffffff-ffff-4fff-bfff-{size:012d}"
    with connect(fleet.settings.database, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO episodes (id, org_id, status) VALUES (%s, %s, 'uploaded')",
            (ref.episode_id, ref.org_id),
        )
    with connect(fleet.uuid_database, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO episodes (id, org_id, status) VALUES (%s, %s, 'uploaded')",
            (lost_uuid, ref.org_id),
        )
    bucket = Bucket(fleet.settings.bucket, fleet.settings.aws)
    bucket.put_bytes(fleet_state.archive_key(ref.org_id, ref.episode_id), b"lost")
    bucket.put_bytes(fleet_state.archive_key(ref.org_id, lost_uuid), b"lost")
    return ref, lost_uuid


def measure_reconcile(ctx: BenchContext, fleet: Any, sample: Sample) -> None:

    from episode_pipeline.defs.resources.database import PostgresResource
    from episode_pipeline.defs.resources.s3 import S3BucketResource

    ref, lost_uuid = add_lost_upload(fleet, sample.size)
    position = sample.size + 1  # the newest row: the last of a walk in id order
    for variant, database, lost in (
        ("text", fleet.settings.database, ref.partition_key),
        ("uuid", fleet.uuid_database, f"{ref.org_id}/{lost_uuid}"),
    ):
        waiting, definitions, settings = reconcile_sensor(
            dataclasses.replace(fleet.settings, database=database)
        )
        interval = waiting.minimum_interval_seconds or 30
        repository = definitions.get_repository_def()
        resources = {
            "postgres": PostgresResource.from_settings(database),
            "s3": S3BucketResource.from_settings(fleet.settings),
        }
        cursor = None
        ticks: list[dict[str, Any]] = []
        found_at = None
        error = None
        limit = ctx.config.fleet_reconcile_ticks if variant == "text" else 1
        for tick in range(limit):
            context = sensor_context(
                fleet.instance, cursor=cursor, resources=resources,
                repository_def=repository,
            )  # fmt: skip
            with Probe() as probe:
                started = time.perf_counter()
                try:
                    data = evaluate(waiting, context, fleet.instance)
                except Exception as failure:  # the finding is the error itself
                    error = describe_error(failure)
                    break
                seconds = time.perf_counter() - started
            cursor = data.cursor
            ticks.append({"seconds": seconds, "s3": probe.s3_calls(),
                          "sql": probe.sql_statements, "top": probe.top(3)})  # fmt: skip
            keys = [r.partition_key for r in data.run_requests or []]
            if lost in keys:
                found_at = tick + 1
                break
        details: dict[str, Any] = {"ticks_measured": len(ticks), "interval_seconds": interval}
        if error:
            details["error"] = error
        if ticks:
            per_tick = median([t["seconds"] for t in ticks])
            s3_per_tick = median([t["s3"] for t in ticks])
            sql_per_tick = median([t["sql"] for t in ticks])
            pace = getattr(settings, "episodes_per_tick", None)
            if found_at is not None:
                to_find = found_at * max(interval, per_tick)
                how = f"found at tick {found_at}"
            elif pace:
                needed = math.ceil(position / pace)
                to_find = needed * max(interval, per_tick)
                how = f"extrapolated: row {position:,} at {pace} episodes a tick = {needed} ticks"
            else:
                to_find = math.inf
                how = f"not found within {len(ticks)} ticks"
            ticks_per_hour = 3600 / max(interval, per_tick)
            details |= {
                "tick_seconds": [round(t["seconds"], 3) for t in ticks],
                "s3_requests_per_tick": s3_per_tick,
                "sql_statements_per_tick": sql_per_tick,
                "s3_requests_per_hour": round(s3_per_tick * ticks_per_hour),
                "sql_statements_per_hour": round(sql_per_tick * ticks_per_hour),
                "lost_upload_to_request_seconds": to_find,
                "how": how,
                "top_statements": ticks[0]["top"],
            }
            sample.add(f"reconcile_tick_{variant}", per_tick)
            if variant == "text":
                sample.add("reconcile_lost_upload", to_find)
                sample.add("reconcile_s3_per_hour", s3_per_tick * ticks_per_hour)
                sample.add("reconcile_sql_per_hour", sql_per_tick * ticks_per_hour)
        sample.details[f"reconcile_{variant}"] = details


def describe_error(failure: BaseException) -> str:
    """The error and its causes, one line each (a resource error hides its cause)."""
    parts = []
    current: BaseException | None = failure
    while current is not None and len(parts) < 4:
        parts.append(f"{type(current).__name__}: {str(current).strip().splitlines()[0][:300]}")
        current = current.__cause__ or current.__context__
    return " <- ".join(parts)


def timed_cli(env: dict[str, str], args: list[str]) -> float:
    started = time.perf_counter()
    out = subprocess.run(
        [startup._cli(), *args], env=env, capture_output=True, text=True,
        timeout=CLI_TIMEOUT_SECONDS, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"{NAME}: episode-pipeline {' '.join(args)}:\n{out.stderr[-2000:]}")
    return time.perf_counter() - started


def measure_cli(ctx: BenchContext, fleet: Any, sample: Sample, archive: Path) -> None:
    env = cli_env(fleet.info)
    some = fleet_state.partition_key(fleet.state.status_index())
    for _ in range(ctx.config.repeats):
        sample.add("status", timed_cli(env, ["status", some]))
    for _ in range(ctx.config.repeats):  # one page of the newest episodes, whatever N is
        page = ["status", "--org", fleet_state.FLEET_ORG, "--limit", str(STATUS_PAGE)]
        sample.add("status_page", timed_cli(env, page))
    for _ in range(ctx.config.repeats):
        _, run = new_processed_episode(fleet.info, fleet.settings, archive, "fleetnew")
        part = startup.breakdown(fleet.instance, run)
        sample.add("process_start", part["process_start"])
        sample.add("process_wall", run["wall"])


def measure_storage(fleet: Any, sample: Sample) -> None:
    sizes = fleet_state.store_sizes(fleet.dsn)
    sample.details["store"] = sizes
    total_rows = sum(t["rows"] for t in sizes.values())
    total_bytes = sum(t["bytes"] for t in sizes.values())
    sample.add("store_bytes_per_episode", total_bytes / max(1, sample.size))
    sample.add("store_rows_per_episode", total_rows / max(1, sample.size))
    sample.add("store_bytes", total_bytes)
    sample.add("store_rows", total_rows)
    sample.details["application_store"] = {
        "text ids": fleet_state.application_sizes(fleet.settings.database),
        "uuid ids": fleet_state.application_sizes(fleet.uuid_database),
    }


def measure_size(ctx: BenchContext, fleet: Any, size: int, archive: Path) -> Sample:
    sample = Sample(size)
    with ctx.phase(f"set-up: grow the fleet to {size:,}"):
        fleet.state.grow(size)
    # A shared machine's load moves between sizes: each size says what it was measured under.
    sample.details["load_average"] = [round(os.getloadavg()[0], 2)]
    sample.details["state"] = (
        {"kind": "with retention", **fleet.state.settled}
        if fleet.state.settled
        else {"kind": "unpruned: every run kept", "runs": size}
    )
    if ctx.config.fleet_campaign_seconds:  # the campaign figures alone (fleet_campaign.py)
        from benchmarks import fleet_campaign

        fleet_campaign.measure(ctx, fleet, sample, archive)
        sample.details["load_average"].append(round(os.getloadavg()[0], 2))
        return sample
    with ctx.phase(f"measure at {size:,}"):
        ui_only = ctx.config.fleet_ui == UI_ONLY
        if not ui_only:
            for repeat in range(ctx.config.repeats):
                measure_uploads_tick(ctx, fleet, sample, repeat)
            measure_heartbeat_and_done(ctx, fleet, sample)
            measure_reconcile(ctx, fleet, sample)
            measure_cli(ctx, fleet, sample, archive)
        if ctx.config.fleet_daemon_uploads and not ui_only:
            from benchmarks import fleet_daemon

            fleet_daemon.measure(ctx, fleet, sample)
        if ctx.config.fleet_ui:
            from benchmarks import fleet_ui

            fleet_ui.measure(ctx, fleet, sample)
        measure_storage(fleet, sample)
    sample.details["load_average"].append(round(os.getloadavg()[0], 2))
    return sample


# -- figures ------------------------------------------------------------------------------------

# metric → (unit, what the figure is, target kind)
FIGURES: dict[str, tuple[str, str, str]] = {
    "uploads_tick": ("s", "one episode_uploads tick deciding the new uploads", "per_upload"),
    "uploads_tick_sql": ("s", "the SQL statements of that tick alone", "per_upload"),
    "heartbeat": ("s", "one heartbeat over the burst's queued runs", "per_upload"),
    "done_tick": ("s", "one episode_upload_done tick (median) in the burst", "per_upload"),
    "done_release": ("s", "the burst's successes until every message is deleted (modelled)",
                     "done"),
    "status": ("s", "`episode-pipeline status ORG/EP` wall", "per_upload"),
    "status_page": ("s", f"`episode-pipeline status --limit {STATUS_PAGE}` (no episode) wall",
                    "per_upload"),
    "daemon_runs_exist": ("s", "queued uploads until their runs exist, through the daemon",
                          "per_upload"),
    "daemon_done_release": ("s", "their successes until every message is deleted, through the "
                            "daemon", "done"),
    "process_start": ("s", "`episode-pipeline process`: exec until the run's first event",
                      "per_upload"),
    "reconcile_tick_text": ("s", "one waiting_uploads tick", "report"),
    "reconcile_tick_uuid": ("s", "one waiting_uploads tick on the uuid application table",
                            "report"),
    "reconcile_lost_upload": ("s", "a lost upload (newest row) until its run request", "lost"),
    "reconcile_s3_per_hour": ("requests/h", "S3 requests of the walk per hour", "report"),
    "reconcile_sql_per_hour": ("statements/h", "SQL statements of the walk per hour", "report"),
    "store_bytes_per_episode": ("B", "Dagster tables' bytes over episodes", "report"),
    "store_rows_per_episode": ("rows", "Dagster tables' rows over episodes", "report"),
    "store_bytes": ("B", "Dagster tables' bytes on disk (indexes, TOAST)", "report"),
    "store_rows": ("rows", "Dagster tables' rows", "report"),
}  # fmt: skip


def figures(samples: list[Sample]) -> list[Result]:
    """Each metric at every larger size against the same metric at the first size."""
    base = samples[0]
    results = []
    from benchmarks import fleet_ui

    known = {**FIGURES, **fleet_ui.FIGURES}
    for grown in samples[1:]:
        for metric, ours in grown.values.items():
            theirs = base.values.get(metric)
            if not theirs or metric not in known:
                continue
            unit, what, kind = known[metric]
            result = Result(
                stage=NAME,
                metric=f"{metric}@{grown.size:,}",
                ours=_round(median(ours)),
                baseline=_round(median(theirs)),
                unit=unit,
                better="lower",
                repeats=min(len(ours), len(theirs)),
                details={
                    "what": what,
                    "sizes": [base.size, grown.size],
                    **_detail_of(grown, metric),
                },
                baseline_name=f"the same at N = {base.size:,}",
                ours_samples=[_round(v) for v in ours],
                baseline_samples=[_round(v) for v in theirs],
            )
            _target(result, kind, median(ours), median(theirs))
            results.append(result)
    return [*results, *fleet_ui.versus_dagster(samples)]


def _detail_of(sample: Sample, metric: str) -> dict[str, Any]:
    for prefix, key in (("uploads_tick", "uploads_tick"), ("heartbeat", "heartbeat"),
                        ("done", "done"), ("reconcile_tick_uuid", "reconcile_uuid"),
                        ("reconcile", "reconcile_text"), ("store", "store"),
                        ("ui_", "ui"), ("daemon_done", "daemon_done"),
                        ("daemon", "daemon")):  # fmt: skip
        if metric.startswith(prefix) and key in sample.details:
            value = sample.details[key]
            if isinstance(value, list):
                value = value[-1]
            if key == "ui":
                value = value.get(metric.removeprefix("ui_"), value)
            return {"at_n": value, "state": sample.details.get("state")}
    return {"state": sample.details.get("state")}


def _target(result: Result, kind: str, ours: float, base: float) -> None:
    if kind == "per_upload":
        result.target = f"≤ {PER_UPLOAD_FACTOR}x its N = 1,000 cost"
        result.met = ours <= PER_UPLOAD_FACTOR * base
    elif kind == "ui":
        result.target = f"≤ {UI_PAGE_SECONDS:g} s (at the live partition count)"
        result.met = ours <= UI_PAGE_SECONDS
    elif kind == "lost":
        result.target = f"≤ {LOST_UPLOAD_SECONDS:,} s (at N = 1,000,000)"
        result.met = ours <= LOST_UPLOAD_SECONDS
    elif kind == "done":
        result.target = f"≤ {DONE_RELEASE_SECONDS} s for the burst"
        result.met = ours <= DONE_RELEASE_SECONDS


def _round(value: float) -> float:
    if not math.isfinite(value):
        return value
    return round(value) if abs(value) >= 100 else round(value, 4)


def storage_figures(fleet: Any) -> list[Result]:
    """What one real processed episode stored in Dagster's tables (all its events)."""
    per_table = fleet.per_episode
    rows = sum(t["rows"] for t in per_table.values())
    size = sum(t["bytes"] for t in per_table.values())
    out = []
    for metric, value, unit in (("episode_rows", rows, "rows"), ("episode_bytes", size, "B")):
        result = Result(
            stage=NAME, metric=f"dagster_{metric}_per_processed_episode", ours=value,
            baseline=value, unit=unit, better="lower", repeats=1,
            details={
                "per_table": per_table,
                "event_logs": fleet.per_event,
                "run_id": fleet.template.run_id,
            },
            baseline_name="reported (one real run of a 1-camera 1-second sample)",
        )  # fmt: skip
        result.target = "reported"
        out.append(result)
    return out


# -- the stage ----------------------------------------------------------------------------------


PARTIAL_ENV = "FLEET_PARTIAL"  # a file: each size's samples are written there as they come


def dump_partial(samples: list[Sample], fleet: Any) -> None:
    """A long run's sizes so far, for a run that is stopped before it ends."""
    import json

    target = os.environ.get(PARTIAL_ENV)
    if target:
        document = {
            "samples": [
                {"size": s.size, "values": s.values, "details": s.details} for s in samples
            ],
            "build_seconds": fleet.state.build_seconds,
        }
        Path(target).write_text(json.dumps(document, default=str, indent=1))


def run(ctx: BenchContext) -> list[Result]:
    from dagster import DagsterInstance

    from episode_pipeline.config.settings import Settings

    samples: list[Sample] = []
    with fleet_stack(ctx) as info, sensor.stderr_to(ctx.workdir / "fleet-ticks.log"):
        settings = Settings.from_env(info.env)
        with (
            ctx.phase("set-up: sample, real run, template"),
            DagsterInstance.from_config(info.env["DAGSTER_HOME"]) as instance,
        ):
            archive = sample_archive(ctx)
            ref, run_info = new_processed_episode(info, settings, archive, fleet_state.TEMPLATE_ORG)
            dsn = fleet_state.dagster_dsn(info.env)
            template = fleet_state.capture_template(
                instance, dsn, run_info["run_id"], bool(ctx.config.fleet_all_events)
            )
            fleet = SimpleNamespace(
                info=info,
                settings=settings,
                instance=instance,
                dsn=dsn,
                template=template,
                per_episode=fleet_state.storage_of_run(dsn, template.run_id, ref.partition_key),
                per_event=fleet_state.events_of_run(dsn, template.run_id),
            )
            if not sizes(ctx.config):  # fleet_sizes=0: the one real episode's storage only
                return storage_figures(fleet)
            fleet.uuid_database = fleet_state.create_uuid_database(info.env, settings.database)
            fleet.definitions = deployed(settings)
            fleet.state = fleet_state.FleetState(
                env=info.env, instance=instance, settings=settings, template=template,
                uuid_database=fleet.uuid_database, s3_objects=ctx.config.fleet_s3_objects,
                unpruned_max=ctx.config.fleet_unpruned_max,
                per_day=ctx.config.fleet_per_day,
            )  # fmt: skip
            ctx.facts["fleet_template_events_per_run"] = len(template.events)
        with DagsterInstance.from_config(info.env["DAGSTER_HOME"]) as instance:
            fleet.instance = fleet.state.instance = instance
            try:
                for size in sizes(ctx.config):
                    try:
                        samples.append(measure_size(ctx, fleet, size, archive))
                    except Exception as failure:  # the smaller sizes' figures still count
                        ctx.facts[f"fleet_failed_at_{size}"] = describe_error(failure)
                        if len(samples) < 2:
                            raise
                        break
                    finally:
                        dump_partial(samples, fleet)
            finally:
                ctx.facts["fleet_build_seconds"] = fleet.state.build_seconds
                ctx.facts["fleet_samples"] = [
                    {"size": s.size, "values": s.values, "details": s.details} for s in samples
                ]
                if ctx.config.fleet_ui:
                    from benchmarks import fleet_ui

                    fleet_ui.close(fleet)
    from benchmarks import fleet_campaign

    return [*figures(samples), *fleet_campaign.figures(samples), *storage_figures(fleet)]


def write_profile(report: dict[str, Any], target: Path) -> None:
    """Each missed figure with the statements that took longest at its size."""
    import json

    lines = [f"# fleet: where the missed figures go ({report['generated_at']})", ""]
    for row in report["results"]:
        if row["stage"] != NAME or row.get("met") is not False:
            continue
        first = row["details"].get("sizes", ["?"])[0]
        lines.append(
            f"## {row['metric']}: {row['ours']} {row['unit']} against {row['baseline']} at "
            f"N = {first:,} (target {row['target']})"
        )
        at_n = row["details"].get("at_n", {})
        if isinstance(at_n, dict):
            for statement in at_n.get("top_statements") or []:
                lines.append(
                    f"- {statement['seconds']} s in {statement['count']}x `{statement['sql']}`"
                )
            at_n = {k: v for k, v in at_n.items() if k != "top_statements"}
        lines += [f"- details: {json.dumps(at_n, default=str)[:1500]}", ""]
    target.write_text("\n".join(lines) + "\n")


def report_from_partial(partial: Path, per_episode: Path, out: Path, note: str) -> None:
    """latest.json / latest.md from a stopped run's `FLEET_PARTIAL` dump (the sizes it
    finished) and the template run's storage read from its stack while it ran."""
    import datetime as dt
    import json
    from dataclasses import replace

    from benchmarks.common import Config, machine_facts
    from benchmarks.report import SCHEMA_VERSION, markdown

    given = json.loads(note)
    config = vars(replace(Config(), **given.get("config", {})))
    dump = json.loads(partial.read_text())
    samples = [Sample(s["size"], s["values"], s["details"]) for s in dump["samples"]]
    stored = json.loads(per_episode.read_text())
    fleet = SimpleNamespace(
        per_episode=stored["per_table"], template=SimpleNamespace(run_id=stored["template_run_id"])
    )
    results = [*figures(samples), *storage_figures(fleet)]
    report = {
        "schema_version": SCHEMA_VERSION,
        "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "total_seconds": float(given.get("total_seconds", 0)),
        "config": config,
        "machine": machine_facts(),
        "facts": {
            "load": given.get("load", "-"),
            "fleet_build_seconds": dump["build_seconds"],
            "fleet_storage_of_one_episode": stored,
            "fleet_samples": dump["samples"],
            "note": given.get("text", ""),
        },
        "stages": {NAME: {"status": "ok", "sizes_finished": [s.size for s in samples]}},
        "results": [r.as_dict() for r in results],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    text = markdown(report).replace(
        "by `python -m benchmarks.run`", "by `python -m benchmarks.fleet report` (a stopped run)"
    )
    (out / "latest.md").write_text(f"{text}\n**Note:** {given.get('text', '')}\n")
    write_profile(report, out / "profile.txt")


def _main(argv: list[str]) -> int:
    """`python -m benchmarks.fleet profile RESULTS.json OUT.txt`: each miss explained;
    `python -m benchmarks.fleet report PARTIAL.json PER_EPISODE.json OUT_DIR NOTE_JSON`: the
    results of a run stopped after some sizes."""
    import json

    if len(argv) == 3 and argv[0] == "profile":
        write_profile(json.loads(Path(argv[1]).read_text()), Path(argv[2]))
        return 0
    if len(argv) == 5 and argv[0] == "report":
        report_from_partial(Path(argv[1]), Path(argv[2]), Path(argv[3]), argv[4])
        return 0
    print(_main.__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
