"""The `fleet` stage's daemon figures: a burst through the real `dagster-daemon`, run queue held.

`dagster-daemon run` on the fleet's stack with the sensors block of production's dagster.yaml
(its sensor threads and submit workers: what a fleet's daemon runs), its pooled storages
(`instance/storage.py`) and the run queue held
(`max_concurrent_runs: 0`, so nothing is launched on this machine: a run *exists* once the daemon
has created and queued it). The whole daemon works as in production meanwhile: every sensor of
the location ticks on the fleet's store, the code server evaluates them.

- `daemon_runs_exist`: `fleet_daemon_uploads` S3 events are sent to the stack's upload queue at
  once, each for an object put in the stack's data bucket beforehand (the sensor HEADs every
  upload and refuses one of no object; the objects' own notifications are purged before the
  daemon starts, so each upload arrives once, in the burst); seconds from the send until that
  many runs of the uploads sensor exist, with the first and the last run's creation and the
  rate between them, and each uploads tick (its runs and seconds, evaluation and submission
  together);
- `daemon_done_release`: those runs then succeed at once (a `RUN_SUCCESS` event each, as a run
  worker reports it) and the daemon's own `episode_upload_done` deletes their messages; seconds
  until the queue holds none, the done sensor's ticks meanwhile, and how many messages were still
  held when the queue's visibility timeout passed since their receive (those would have come
  back for another receive).

One moto queue, as deployed: the stack's moto server receives in time linear in the queue's
depth (`local/moto_main.py`), so a queue of 1,000 measures the daemon, not moto.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import yaml

from benchmarks import end_to_end, sensor

DEADLINE_SECONDS = 1_800
POLL_SECONDS = 0.5
REPORT_THREADS = 8  # the burst's RUN_SUCCESS events, as close to at once as the machine allows
PRODUCTION_YAML = Path(__file__).resolve().parents[1] / "dagster.yaml"


def deploy_daemon_config(dagster_home: str) -> str:
    """The instance as the benchmark's daemon runs it; returns the text to restore: the run
    queue held (`max_concurrent_runs: 0`), production's `sensors:` block and its pooled storages
    (on the stack's database)."""
    from episode_pipeline.local.dagster_home import storage_config

    path = Path(dagster_home) / "dagster.yaml"
    original = path.read_text()
    config = yaml.safe_load(original)
    config["run_coordinator"].setdefault("config", {})["max_concurrent_runs"] = 0
    config["sensors"] = yaml.safe_load(PRODUCTION_YAML.read_text())["sensors"]
    config.update(storage_config(config["run_storage"]["config"], pooled=True))
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return original


def forget_cursor(instance: Any, name: str) -> int:
    """Drop a run-status sensor's state, so the daemon's first tick starts its cursor at the
    newest event: a deployment handles its runs' successes as they come, while the fleet's
    synthetic runs never went through a daemon and the previous size's daemon left the cursor
    before them (its next ticks would first walk them all, 200 a tick)."""
    states = [s for s in instance.all_instigator_state() if s.instigator_name == name]
    for state in states:
        instance.delete_instigator_state(state.instigator_origin_id, state.selector_id)
    return len(states)


def queue_depth(client: Any, queue_url: str) -> int:
    """Messages on the queue, visible or received (in flight): 0 once every one is deleted."""
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attributes = client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)
    return sum(int(attributes["Attributes"][name]) for name in names)


def sensor_ticks(instance: Any, name: str, after: float) -> list[Any]:
    """The daemon's ticks of one sensor since `after` (oldest first)."""
    ticks = [
        tick
        for state in instance.all_instigator_state()
        if state.instigator_name == name
        for tick in instance.get_ticks(state.instigator_origin_id, state.selector_id, after=after)
    ]
    return sorted(ticks, key=lambda t: t.timestamp)


def describe_ticks(ticks: list[Any], since: float) -> list[dict[str, Any]]:
    return [
        {
            "started_after_seconds": round(t.timestamp - since, 1),
            "seconds": round((t.end_timestamp or t.timestamp) - t.timestamp, 1),
            "runs": len(t.run_ids),
            "requested": len(t.tick_data.reserved_run_ids or ()),
            "status": t.status.value,
        }
        for t in ticks
    ]


def wait_for_runs(instance: Any, filters: Any, count: int, deadline: float) -> int:
    existing = 0
    while existing < count and time.monotonic() < deadline:
        existing = instance.get_runs_count(filters)
        time.sleep(POLL_SECONDS)
    return existing


@contextmanager
def staged_uploads(info: Any, prefix: str, count: int) -> Iterator[tuple[str, list[Any]]]:
    """`count` uploads' objects in the stack's data bucket, its queue then purged of their
    notifications (and of anything else: the samples' own events, processed already); yields
    the bucket's name and the (key, ETag) pairs for `sensor.send_events`, and deletes the
    objects afterwards."""
    from episode_pipeline.config.settings import AwsSettings
    from episode_pipeline.local import aws_setup
    from episode_pipeline.storage.bucket import Bucket

    bucket = Bucket(info.bucket, AwsSettings.from_env(info.env))
    objects = sensor.put_uploads(bucket, prefix, count)
    drain(aws_setup.client("sqs", info.s3_endpoint), info.sqs_queue_url)
    try:
        yield bucket.name, objects
    finally:
        bucket.delete_keys([key for key, _ in objects])


def measure_runs_exist(
    ctx: Any, instance: Any, queue: Any, filters_for: Any, sample: Any, uploads: Any
) -> tuple[list[Any], float]:
    from episode_pipeline.defs.sensors.sqs import UPLOADS_INTERVAL_SECONDS, UPLOADS_SENSOR_NAME

    count = ctx.config.fleet_daemon_uploads
    since = time.time()
    filters = filters_for(since)
    sensor.send_events(queue, *uploads)
    existing = wait_for_runs(instance, filters, count, time.monotonic() + DEADLINE_SECONDS)
    seconds = time.time() - since if existing >= count else float("inf")
    records = instance.get_run_records(filters)
    created = sorted(r.create_timestamp.timestamp() for r in records)
    ticks = [
        t
        for t in sensor_ticks(instance, UPLOADS_SENSOR_NAME, since - UPLOADS_INTERVAL_SECONDS)
        if t.run_ids or t.tick_data.reserved_run_ids
    ]
    spread = created[-1] - created[0] if len(created) > 1 else 0.0
    sample.add("daemon_runs_exist", seconds)
    sample.details["daemon"] = {
        "uploads": count,
        "runs_existing": existing,
        "sensors": yaml.safe_load(PRODUCTION_YAML.read_text())["sensors"],
        "first_run_after_seconds": round(created[0] - since, 2) if created else None,
        "last_run_after_seconds": round(created[-1] - since, 2) if created else None,
        "seconds": round(seconds, 2),
        "runs_per_second": round(existing / seconds, 2) if seconds else None,
        "runs_per_second_first_to_last": round((len(created) - 1) / spread, 2) if spread else None,
        "uploads_ticks": describe_ticks(ticks, since),
    }
    return records, since


def measure_done_release(
    ctx: Any, instance: Any, records: list[Any], client: Any, queue_url: str,
    received_at: float, sample: Any,
) -> None:  # fmt: skip
    from dagster import DagsterEvent, DagsterEventType

    from episode_pipeline.config.settings import QueueSettings
    from episode_pipeline.defs.sensors.sqs import UPLOAD_DONE_SENSOR_NAME
    from episode_pipeline.instance.run_tags import EPISODE_JOB_NAME

    held = queue_depth(client, queue_url)
    visibility = QueueSettings().visibility_timeout_seconds

    def succeed(run_id: str) -> None:
        instance.report_dagster_event(
            DagsterEvent(
                event_type_value=DagsterEventType.RUN_SUCCESS.value,
                job_name=EPISODE_JOB_NAME,
                message="Finished execution of run (benchmark).",
            ),
            run_id,
        )

    first = time.time()
    with ThreadPoolExecutor(max_workers=REPORT_THREADS) as pool:
        list(pool.map(succeed, [r.dagster_run.run_id for r in records]))
    since = time.time()  # the burst is complete: every run has succeeded
    left_then = queue_depth(client, queue_url)
    deadline = time.monotonic() + DEADLINE_SECONDS
    left = left_then
    still_held_at_visibility_timeout = None
    while left and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        left = queue_depth(client, queue_url)
        if still_held_at_visibility_timeout is None and time.time() > received_at + visibility:
            still_held_at_visibility_timeout = left
    done = time.time()
    seconds = done - since if not left else float("inf")
    ticks = sensor_ticks(instance, UPLOAD_DONE_SENSOR_NAME, first)
    sample.add("daemon_done_release", seconds)
    sample.details["daemon_done"] = {
        "runs": len(records),
        "messages_held": held,
        "messages_left": left,
        "seconds": round(seconds, 2),
        "successes_reported_in_seconds": round(since - first, 2),
        "messages_left_when_the_last_success_was_reported": left_then,
        "seconds_from_the_first_success": round(done - first, 2) if not left else None,
        "done_ticks": describe_ticks(ticks, first),
        "came_back": still_held_at_visibility_timeout or 0,
        "visibility_timeout_seconds": visibility,
    }


def measure(ctx: Any, fleet: Any, sample: Any) -> None:
    from dagster import DagsterInstance, RunsFilter

    from episode_pipeline.config.settings import AwsSettings, QueueSettings
    from episode_pipeline.defs.sensors.sqs import UPLOAD_DONE_SENSOR_NAME, UPLOADS_SENSOR_NAME
    from episode_pipeline.local import aws_setup
    from episode_pipeline.uploads.upload_queue import UploadQueue

    info = fleet.info
    queue = UploadQueue(
        info.sqs_queue_url,
        AwsSettings.from_env(info.env),
        QueueSettings().visibility_timeout_seconds,
    )
    client = aws_setup.client("sqs", info.s3_endpoint)
    log = ctx.workdir / f"fleet-daemon-{sample.size}.log"

    def filters_for(since: float) -> Any:
        return RunsFilter(
            tags={"dagster/sensor_name": UPLOADS_SENSOR_NAME}, created_after=_utc(since)
        )

    records: list[Any] = []
    with DagsterInstance.from_config(info.env["DAGSTER_HOME"]) as instance:
        forget_cursor(instance, UPLOAD_DONE_SENSOR_NAME)
    with ExitStack() as staged:
        with ctx.phase("set-up: the burst's objects"):
            uploads = staged.enter_context(
                staged_uploads(info, f"daemon-{sample.size}", ctx.config.fleet_daemon_uploads)
            )
        original = deploy_daemon_config(info.env["DAGSTER_HOME"])
        try:
            with (
                ctx.phase("set-up: daemon"),
                end_to_end.daemon(info, log) as process,
                DagsterInstance.from_config(info.env["DAGSTER_HOME"]) as instance,
            ):
                end_to_end.wait_for_daemon(instance, process, log)
                count = ctx.config.fleet_daemon_uploads
                with ctx.phase(f"daemon: {count} uploads until runs exist"):
                    records, received_at = measure_runs_exist(
                        ctx, instance, queue, filters_for, sample, uploads
                    )
                with ctx.phase("daemon: the burst succeeds until its messages are deleted"):
                    measure_done_release(
                        ctx, instance, records, client, info.sqs_queue_url, received_at, sample
                    )
        finally:
            (Path(info.env["DAGSTER_HOME"]) / "dagster.yaml").write_text(original)
            with DagsterInstance.from_config(info.env["DAGSTER_HOME"]) as instance:
                sensor.in_parallel(instance.delete_run, [r.dagster_run.run_id for r in records])
            drain(client, info.sqs_queue_url)


def drain(client: Any, queue_url: str) -> None:
    """Empty the queue (PurgeQueue, which SQS and moto allow once a minute: retried)."""
    deadline = time.monotonic() + 90
    while True:
        try:
            client.purge_queue(QueueUrl=queue_url)
            return
        except client.exceptions.PurgeQueueInProgress:
            if time.monotonic() > deadline:
                raise
            time.sleep(5)


def _utc(timestamp: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(timestamp, UTC)


def _main(argv: list[str]) -> int:
    """`python -m benchmarks.fleet_daemon UPLOADS WORKDIR`: the daemon figures alone, on a
    stack of their own with an empty instance (a quick look; the stage measures them on the
    fleet's store)."""
    import json
    import os
    import tempfile
    from dataclasses import replace
    from types import SimpleNamespace

    from benchmarks.common import BenchContext, Config
    from benchmarks.fleet_common import Sample, fleet_stack

    if len(argv) != 2:
        print(_main.__doc__)
        return 2
    workdir = Path(argv[1] or tempfile.mkdtemp())
    workdir.mkdir(parents=True, exist_ok=True)
    config = replace(Config(), fleet_daemon_uploads=int(argv[0]))
    ctx = BenchContext(config=config, workdir=workdir, stack=lambda: None, database=lambda: None)
    with fleet_stack(ctx) as info:
        sample = Sample(0)
        load = [os.getloadavg()[0]]
        measure(ctx, SimpleNamespace(info=info), sample)
        load.append(os.getloadavg()[0])
    print(json.dumps({"load_average": load, "phases_s": ctx.phases, **sample.details}, indent=1))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
