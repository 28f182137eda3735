"""Stage `sensor`: the upload sensor at fleet scale, and the heartbeat over thousands of runs.

Uploads: `sensor_uploads` (1,000) S3 events are queued at once in moto (spread over queues of
50, see `ShardedQueue`: moto, unlike SQS, slows with a queue's size), each for an object of a
new bucket (the sensor HEADs every new upload's object: its size sizes the run); the uploads
sensor's
evaluation function (``evaluate_uploads``, exactly what the daemon calls) is ticked until the
queue is drained. Between ticks the benchmark adds the requested partitions, as the daemon
does with a tick's result (not timed as the sensor's work; reported). Dagster starts a tick
at most every ``UPLOADS_INTERVAL_SECONDS``, so the rate is modelled on that schedule: tick *k+1*
starts ``max(interval, tick k's duration)`` after tick *k*; uploads/min = uploads over the time
until the last run request. The ticks themselves run back to back (nobody waits 10 s for
nothing). Every upload must get exactly one run request: 0 duplicates, 0 missing.
Limit: draining the same number of messages with bare ``ReceiveMessage`` calls (10 a call), the
queue's own rate with no bookkeeping at all.

Heartbeat: `heartbeat_runs` (5,000) queued runs each hold a received message; one heartbeat
evaluation (``keep_in_flight``) must renew all of them well within its interval. Limit: bare
``ChangeMessageVisibilityBatch`` calls over the same receipt handles.

The Dagster instance is a fresh one whose storage is a new database on the stack's PostgreSQL
(dropped at the end), so the developer's or the test session's runs are never touched.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    SensorResult,
    build_sensor_context,
)
from dagster._core.remote_origin import (
    GrpcServerCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)

from benchmarks.common import BenchContext, Result, median, timed
from episode_pipeline.config.settings import AwsSettings, QueueSettings
from episode_pipeline.defs.sensors import sqs as upload_sensors
from episode_pipeline.instance.run_tags import EPISODE_JOB_NAME
from episode_pipeline.local.dagster_home import instance_config
from episode_pipeline.orchestration.upload_runs import evaluate_uploads, keep_in_flight, sqs_tag
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.uploads.deliveries import HeldMessage
from episode_pipeline.uploads.upload_queue import MAX_BATCH, UploadQueue

NAME = "sensor"
LOG = logging.getLogger("benchmarks.sensor")
SENSOR_TIME_LIMIT_SECONDS = 60  # Dagster's default gRPC deadline for one sensor evaluation


# -- the instance and the queue ------------------------------------------------------------------


@contextmanager
def bench_instances(ctx: BenchContext) -> Iterator[tuple[DagsterInstance, DagsterInstance]]:
    """Two Dagster instances on a new database of the stack's PostgreSQL (dropped afterwards).

    The first is the sensors' own, as the local daemon has it (a new connection per statement);
    the second, with the webserver's pool, does the benchmark's bookkeeping (thousands of runs)
    without timing noise.
    """
    env = ctx.stack().env
    password, port = env["DB_PASSWORD"], int(env["DB_PORT"])
    database = f"bench_dagster_{uuid.uuid4().hex[:8]}"
    admin = f"host=127.0.0.1 port={port} user=postgres password={password} dbname=postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")
    home = ctx.workdir / "sensor-dagster-home"
    home.mkdir(parents=True, exist_ok=True)
    config = instance_config(password, port, database=database)
    (home / "dagster.yaml").write_text(json.dumps(config))  # JSON is YAML
    try:
        with (
            DagsterInstance.from_config(str(home)) as instance,
            DagsterInstance.from_config(str(home)) as bookkeeping,
        ):
            bookkeeping.optimize_for_webserver(60_000, 3600, 2)
            yield instance, bookkeeping
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


def s3_event(bucket: str, key: str, etag: str) -> str:
    """The body S3 sends for one uploaded object (the fields the pipeline reads)."""
    record = {
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "eventTime": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
        "eventName": "ObjectCreated:Put",
        "s3": {
            "bucket": {"name": bucket},
            "object": {"key": key, "size": OBJECT_BYTES, "eTag": etag},
        },
    }
    return json.dumps({"Records": [record]})


OBJECT_BYTES = 1024  # each upload's object: what its event says too


@contextmanager
def bench_bucket(ctx: BenchContext) -> Iterator[Bucket]:
    """A new bucket for the uploads' objects, emptied and deleted afterwards."""
    bucket = Bucket(f"bench-uploads-{uuid.uuid4().hex[:8]}", AwsSettings.from_env(ctx.stack().env))
    bucket.client.create_bucket(
        Bucket=bucket.name, CreateBucketConfiguration={"LocationConstraint": bucket.aws.region}
    )
    try:
        yield bucket
    finally:
        bucket.delete_prefix("orgs/")
        bucket.client.delete_bucket(Bucket=bucket.name)


def upload_partitions(prefix: str, count: int) -> list[str]:
    """The partition keys of `count` uploads of distinct episodes."""
    return [f"fleet/{prefix}-{index:05d}" for index in range(count)]


def upload_objects(prefix: str, count: int) -> list[str]:
    """Their archives' S3 keys (`orgs/<org>/episodes/<episode>/take.tar.zst`)."""
    return [
        f"orgs/{key.replace('/', '/episodes/')}/take.tar.zst"
        for key in upload_partitions(prefix, count)
    ]


def put_uploads(bucket: Bucket, prefix: str, count: int) -> list[tuple[str, str]]:
    """Write `upload_objects`' objects (`OBJECT_BYTES` each: the sensor HEADs an upload and
    sizes its run from it; nothing reads the bytes before a run starts); their (key, ETag).
    A bucket that notifies a queue (the stack's data bucket) queues an event for each."""

    def put(key: str) -> tuple[str, str]:
        response = bucket.client.put_object(Bucket=bucket.name, Key=key, Body=b"\0" * OBJECT_BYTES)
        return key, str(response["ETag"]).strip('"')

    return in_parallel(put, upload_objects(prefix, count))


def send_events(queue: UploadQueue, bucket_name: str, objects: list[tuple[str, str]]) -> None:
    """One S3 event per (key, ETag) on `queue`, ten a call, as fast as the queue takes them."""
    for start in range(0, len(objects), MAX_BATCH):
        entries = [
            {"Id": str(offset), "MessageBody": s3_event(bucket_name, key, etag)}
            for offset, (key, etag) in enumerate(objects[start : start + MAX_BATCH])
        ]
        response = queue.client.send_message_batch(QueueUrl=queue.queue_url, Entries=entries)
        if response.get("Failed"):
            raise RuntimeError(f"{NAME}: send_message_batch failed: {response['Failed'][:1]}")


def enqueue_uploads(
    queue: UploadQueue, prefix: str, count: int, bucket: Bucket | None = None
) -> list[str]:
    """`count` upload events for distinct episodes, each object written to `bucket` first
    (without one the events name objects that do not exist: enough for the heartbeat, which
    never HEADs); returns their partition keys. `bucket` must not notify `queue` (each upload
    would arrive twice): for the stack's data bucket, `put_uploads` then `send_events`."""
    if bucket is None:
        objects = [(key, uuid.uuid4().hex) for key in upload_objects(prefix, count)]
        send_events(queue, "bench-bucket", objects)
    else:
        send_events(queue, bucket.name, put_uploads(bucket, prefix, count))
    return upload_partitions(prefix, count)


# -- the queue, spread over moto queues ----------------------------------------------------------

SHARD_SIZE = MAX_BATCH  # messages per moto queue (see ShardedQueue)
SETUP_THREADS = 4  # untimed set-up (queues, messages) goes side by side
T = TypeVar("T")
R = TypeVar("R")


class ShardedQueue:
    """Several moto queues behind the calls the sensors make of one `UploadQueue`.

    moto checks the visibility of every message of a queue, in flight too, for each message it
    returns, so one queue of thousands costs seconds a call (quadratic in its size; SQS answers
    in tens of milliseconds whatever the size). The messages are spread over queues of
    `SHARD_SIZE` (ten: one receive's worth, about 20 ms a call in moto, as in SQS): each
    `receive` asks the next queue that still holds messages, once all are drained one call
    answers empty, as one queue would; each handle is renewed or deleted through the queue that
    gave it. The same calls, ten messages or handles each, as against one queue; the bare
    baselines go through it too.
    """

    configured = True

    def __init__(self, queues: list[UploadQueue], messages: int) -> None:
        self.queues = queues
        self.owner: dict[str, UploadQueue] = {}
        self.message_ids: dict[str, str] = {}  # receipt handle → message id
        self._left = shard_sizes(len(queues), messages)
        self._turn = 0

    def receive(self, max_messages: int = MAX_BATCH, wait_seconds: int = 0) -> list[dict[str, Any]]:
        for _ in range(len(self.queues)):
            index, self._turn = self._turn, (self._turn + 1) % len(self.queues)
            if self._left[index] > 0:
                queue = self.queues[index]
                messages = queue.receive(max_messages)
                self._left[index] = self._left[index] - len(messages) if messages else 0
                if messages:
                    self.own(queue, messages)
                    return messages
        return self.queues[0].receive(max_messages)  # drained: the one empty answer

    def own(self, queue: UploadQueue, messages: list[dict[str, Any]]) -> None:
        """Remember that `queue` gave these messages (their handles go back to it)."""
        for message in messages:
            self.owner[message["ReceiptHandle"]] = queue
            self.message_ids[message["ReceiptHandle"]] = message["MessageId"]

    def delete(self, receipt_handle: str) -> bool:
        return self.owner[receipt_handle].delete(receipt_handle)

    def extend_visibility_many(
        self, receipt_handles: list[str], seconds: int | None = None
    ) -> dict[str, str]:
        by_queue: dict[int, list[str]] = {}
        for handle in receipt_handles:
            by_queue.setdefault(id(self.owner[handle]), []).append(handle)
        failed: dict[str, str] = {}
        for handles in by_queue.values():
            failed |= self.owner[handles[0]].extend_visibility_many(handles, seconds)
        return failed


@contextmanager
def sharded_queue(ctx: BenchContext, messages: int) -> Iterator[list[UploadQueue]]:
    """Enough new moto queues of `SHARD_SIZE` for `messages`, made and deleted side by side.

    Each has the upload queue's visibility timeout; all share one client (a copy of one
    `UploadQueue`), as the sensors' one queue would.
    """
    aws = AwsSettings.from_env(ctx.stack().env)
    template = UploadQueue(None, aws, QueueSettings().visibility_timeout_seconds)
    attributes = {"VisibilityTimeout": str(template.visibility_timeout_seconds)}

    def create(_: int) -> UploadQueue:
        queue = copy.copy(template)
        name = f"bench-uploads-{uuid.uuid4().hex[:8]}"
        queue.queue_url = template.client.create_queue(QueueName=name, Attributes=attributes)[
            "QueueUrl"
        ]
        return queue

    queues = in_parallel(create, range(-(-messages // SHARD_SIZE)))
    try:
        yield queues
    finally:
        in_parallel(lambda q: template.client.delete_queue(QueueUrl=q.queue_url), queues)


def shards_note(messages: int) -> str:
    return f"{-(-messages // SHARD_SIZE)} moto queues of ≤ {SHARD_SIZE} (moto is quadratic in one)"


def shard_sizes(queues: int, messages: int) -> list[int]:
    """How many of `messages` each of `queues` holds: `SHARD_SIZE` each, the rest in the last."""
    return [min(SHARD_SIZE, messages - index * SHARD_SIZE) for index in range(queues)]


def enqueue_sharded(
    queues: list[UploadQueue], prefix: str, count: int, bucket: Bucket | None = None
) -> list[str]:
    """`count` upload events spread over `queues` (`shard_sizes`), their objects in `bucket`;
    their partition keys."""
    shares = list(enumerate(shard_sizes(len(queues), count)))
    keys = in_parallel(
        lambda s: enqueue_uploads(queues[s[0]], f"{prefix}-q{s[0]}", s[1], bucket), shares
    )
    return [key for shard in keys for key in shard]


def in_parallel(call: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """`call` over `items` on a few threads (set-up work, never the timed part), in order."""
    with ThreadPoolExecutor(max_workers=SETUP_THREADS) as pool:
        return list(pool.map(call, items))


# -- what the daemon does with a tick's result ---------------------------------------------------

# Where a queued run would be launched from; the queue needs one, nothing here connects to it.
_ORIGIN = RemoteJobOrigin(
    RemoteRepositoryOrigin(
        GrpcServerCodeLocationOrigin(host="localhost", port=4000, location_name="bench"),
        "__repository__",
    ),
    EPISODE_JOB_NAME,
)


def queued_run(tags: dict[str, str]) -> DagsterRun:
    """A run as the daemon leaves it after submitting a request to the run queue."""
    return DagsterRun(
        job_name=EPISODE_JOB_NAME,
        run_id=str(uuid.uuid4()),
        status=DagsterRunStatus.QUEUED,
        tags=tags,
        remote_job_origin=_ORIGIN,
    )


def add_runs(instance: DagsterInstance, runs: list[DagsterRun]) -> None:
    """Store `runs` with the rows `instance.add_run` writes (its own insertion values), in two
    statements: `add_run` takes two round trips a run, 23 s for the heartbeat's 5,000, and this is
    set-up, not what is measured (the heartbeat reads them back through Dagster as ever)."""
    from dagster._core.storage.runs.schema import RunsTable, RunTagsTable

    storage: Any = instance.run_storage
    rows = [storage._get_run_insertion_values(run) for run in runs]
    tags = [
        {"run_id": run.run_id, "key": key, "value": value}
        for run in runs
        for key, value in run.tags_for_storage().items()
    ]
    with storage.connect() as conn:
        conn.execute(RunsTable.insert(), rows)
        conn.execute(RunTagsTable.insert(), tags)


def add_partitions(instance: DagsterInstance, result: SensorResult) -> None:
    """What the daemon does with a tick's result that the next tick reads: the partitions.

    The queued runs the daemon would also record are left out: the next ticks look up runs by
    their own uploads only (each upload here is new), and the heartbeat has already filled the
    instance with 5,000 (1,000 more cost 8 s of the stage's time a repeat).
    """
    for request in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))


# -- uploads -------------------------------------------------------------------------------------


@contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """The sensor's per-upload log lines (the daemon writes them to its log) go to a file."""
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("ab") as target:
        os.dup2(target.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


@dataclass
class Drain:
    """One drain of the queue by the sensor: each tick's seconds and the run keys requested."""

    tick_seconds: list[float] = field(default_factory=list)
    tick_requests: list[int] = field(default_factory=list)
    daemon_seconds: float = 0.0
    run_keys: list[str] = field(default_factory=list)

    def schedule_seconds(self, interval: float) -> float:
        """Time from the uploads' arrival to the last run request, on Dagster's tick schedule."""
        busy = [(s, n) for s, n in zip(self.tick_seconds, self.tick_requests, strict=True)]
        while busy and busy[-1][1] == 0:  # trailing empty ticks request nothing
            busy.pop()
        if not busy:
            return 0.0
        return sum(max(interval, s) for s, _ in busy[:-1]) + busy[-1][0]


def drain_with_sensor(
    instances: tuple[DagsterInstance, DagsterInstance],
    queue: ShardedQueue,
    bucket: Bucket,
    expected: int,
    max_ticks: int,
) -> Drain:
    instance, bookkeeping = instances
    drain = Drain()
    context = build_sensor_context(
        instance=instance, sensor_name=upload_sensors.UPLOADS_SENSOR_NAME
    )
    for _ in range(max_ticks):
        started = time.perf_counter()
        result = evaluate_uploads(context, queue, bucket)  # type: ignore[arg-type]
        drain.tick_seconds.append(time.perf_counter() - started)
        requests = result.run_requests if isinstance(result, SensorResult) else []
        drain.tick_requests.append(len(requests or []))
        drain.run_keys += [r.run_key or "" for r in requests or []]
        if isinstance(result, SensorResult):
            started = time.perf_counter()
            add_partitions(bookkeeping, result)
            drain.daemon_seconds += time.perf_counter() - started
        if len(drain.run_keys) >= expected or not isinstance(result, SensorResult):
            break
    return drain


def drain_bare(queue: ShardedQueue, expected: int) -> float:
    """The limit: receive every message, 10 a call, nothing else; then make them visible again
    (untimed), so the sensor drains the very same messages."""
    seen: dict[str, str] = {}
    started = time.perf_counter()
    while len(seen) < expected:
        messages = queue.receive()
        if not messages:
            break
        seen |= {m["MessageId"]: m["ReceiptHandle"] for m in messages}
    seconds = time.perf_counter() - started
    if len(seen) != expected:
        raise RuntimeError(f"{NAME}: the bare drain received {len(seen)} of {expected} messages")
    failed = queue.extend_visibility_many(list(seen.values()), seconds=0)
    if failed:
        raise RuntimeError(f"{NAME}: {len(failed)} messages not made visible again: {failed}")
    return seconds


def measure_uploads(
    ctx: BenchContext, instances: tuple[DagsterInstance, DagsterInstance]
) -> list[Result]:
    config = ctx.config
    count = config.sensor_uploads
    interval = upload_sensors.UPLOADS_INTERVAL_SECONDS
    ours_rate: list[float] = []
    base_rate: list[float] = []
    drains: list[Drain] = []
    missing = duplicates = 0
    for repeat in range(config.repeats):
        with (
            sharded_queue(ctx, count) as queues,
            bench_bucket(ctx) as bucket,
            ctx.phase("uploads (set-up and timed)"),
        ):
            keys = enqueue_sharded(queues, f"r{repeat}", count, bucket)
            bare_seconds = drain_bare(ShardedQueue(queues, count), count)
            drain = drain_with_sensor(
                instances, ShardedQueue(queues, count), bucket, count, max_ticks=count + 5
            )
        requested = [k.split("@", 1)[0] for k in drain.run_keys]
        missing += len(set(keys) - set(requested))
        duplicates += len(requested) - len(set(requested))
        ours_rate.append(count / drain.schedule_seconds(interval) * 60)
        base_rate.append(count / bare_seconds * 60)
        drains.append(drain)
    tick_max = [max(d.tick_seconds) for d in drains]
    details = {
        "uploads": count,
        "queues": shards_note(count),
        "interval_seconds": interval,
        "ticks": [sum(1 for n in d.tick_requests if n) for d in drains],
        "requests_per_tick": [max(d.tick_requests) for d in drains],
        "tick_seconds_max": [round(s, 3) for s in tick_max],
        "tick_seconds_sum": [round(sum(d.tick_seconds), 3) for d in drains],
        "daemon_partition_adds_seconds": [round(d.daemon_seconds, 3) for d in drains],
        "missing_runs": missing,
        "duplicate_runs": duplicates,
    }
    rate = Result(
        stage=NAME,
        metric="uploads_per_minute",
        ours=round(median(ours_rate)),
        baseline=round(median(base_rate)),
        unit="uploads/min",
        better="higher",
        repeats=config.repeats,
        details=details,
        baseline_name="limit: bare ReceiveMessage of the same messages (no bookkeeping)",
        ours_samples=[round(r) for r in ours_rate],
        baseline_samples=[round(r) for r in base_rate],
    )
    rate.target = "≥ 1,000 uploads/min, 0 duplicate and 0 missing runs"
    rate.met = rate.ours >= 1000 and missing == 0 and duplicates == 0
    if config.quick:
        rate.met = missing == 0 and duplicates == 0
    return [rate]


# -- heartbeat -----------------------------------------------------------------------------------


def hold_messages(instance: DagsterInstance, queues: list[UploadQueue], count: int) -> ShardedQueue:
    """`count` queued runs, each holding one received message as the uploads sensor tags it."""
    enqueue_sharded(queues, "held", count)
    sharded = ShardedQueue(queues, count)
    shares = zip(queues, shard_sizes(len(queues), count), strict=True)
    for queue, messages in zip(queues, in_parallel(receive_all, shares), strict=True):
        sharded.own(queue, messages)
    runs = [
        queued_run(sqs_tag([HeldMessage(message_id, handle, 1)]))
        for handle, message_id in sharded.message_ids.items()
    ]
    add_runs(instance, runs)
    if len(runs) != count:
        raise RuntimeError(f"{NAME}: received {len(runs)} of {count} messages to hold")
    return sharded


def receive_all(queue_and_size: tuple[UploadQueue, int]) -> list[dict[str, Any]]:
    """Every message of one shard (it holds `size`)."""
    queue, size = queue_and_size
    messages: list[dict[str, Any]] = []
    while len(messages) < size and (batch := queue.receive()):
        messages += batch
    return messages


def measure_heartbeat(
    ctx: BenchContext, instances: tuple[DagsterInstance, DagsterInstance]
) -> list[Result]:
    instance, bookkeeping = instances
    config = ctx.config
    count = config.heartbeat_runs
    interval = QueueSettings().heartbeat_seconds
    ours: list[float] = []
    base: list[float] = []
    renewed: list[int] = []
    with sharded_queue(ctx, count) as queues:
        with ctx.phase("heartbeat set-up: queues, messages, runs"):
            sharded = hold_messages(bookkeeping, queues, count)
        handles = list(sharded.owner)
        for _ in range(config.repeats):
            started = time.perf_counter()
            renewed.append(keep_in_flight(instance, sharded, LOG))  # type: ignore[arg-type]
            ours.append(time.perf_counter() - started)
            base.append(timed(lambda: sharded.extend_visibility_many(handles)))
        ctx.phases["heartbeat timed"] = round(sum(ours) + sum(base), 2)
    result = Result(
        stage=NAME,
        metric=f"heartbeat_{count}_runs",
        ours=round(median(ours), 3),
        baseline=round(median(base), 3),
        unit="s",
        better="lower",
        repeats=config.repeats,
        details={
            "runs_in_flight": count,
            "queues": shards_note(count),
            "renewed": renewed,
            "heartbeat_interval_seconds": interval,
            "sensor_time_limit_seconds": SENSOR_TIME_LIMIT_SECONDS,
        },
        baseline_name="limit: bare ChangeMessageVisibilityBatch over the same handles",
        ours_samples=[round(s, 3) for s in ours],
        baseline_samples=[round(s, 3) for s in base],
    )
    result.target = f"all {count:,} renewed within the {interval} s interval (and the 60 s limit)"
    result.met = all(n == count for n in renewed) and max(ours) < SENSOR_TIME_LIMIT_SECONDS
    return [result]


def run(ctx: BenchContext) -> list[Result]:
    with bench_instances(ctx) as instances, stderr_to(ctx.workdir / "sensor-ticks.log"):
        # The heartbeat first: the uploads' runs hold messages of queues deleted afterwards.
        heartbeat = measure_heartbeat(ctx, instances)
        return [*measure_uploads(ctx, instances), *heartbeat]
