"""The `fleet` stage's daemon figure: queued uploads until their runs exist, through the daemon.

`dagster-daemon run` on the fleet's stack (the instance's own dagster.yaml: its sensor threads
and submit workers as configured), with the run queue held (`max_concurrent_runs: 0`, so no
run is launched on this machine: a run *exists* once the daemon has submitted it to the queue).
`fleet_daemon_uploads` S3 events are sent to the stack's upload queue at once; the time is from
the send to the moment that many new runs of the episode job exist. The whole daemon works as it
would in production meanwhile: every sensor of the location ticks on the fleet's store.

The upload queue is one moto queue here (the daemon's sensor reads the deployed queue URL), and
moto's receive slows with the queue's depth (`sensor.ShardedQueue`), so the default burst is
one tick's worth (300), not the issue's 1,000; the same at every size, so the growth factor is
the daemon's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks import end_to_end, sensor

DEADLINE_SECONDS = 900
POLL_SECONDS = 0.5


def hold_run_queue(dagster_home: str) -> str:
    """`max_concurrent_runs: 0` in the instance's dagster.yaml; returns the text to restore."""
    path = Path(dagster_home) / "dagster.yaml"
    original = path.read_text()
    config = yaml.safe_load(original)
    config.setdefault("concurrency", {}).setdefault("runs", {})["max_concurrent_runs"] = 0
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return original


def measure(ctx: Any, fleet: Any, sample: Any) -> None:
    from dagster import DagsterInstance, RunsFilter

    from episode_pipeline.config.settings import AwsSettings, QueueSettings
    from episode_pipeline.defs.sensors.sqs import UPLOADS_SENSOR_NAME
    from episode_pipeline.local import aws_setup
    from episode_pipeline.uploads.upload_queue import UploadQueue

    count = ctx.config.fleet_daemon_uploads
    info = fleet.info
    queue = UploadQueue(
        info.sqs_queue_url,
        AwsSettings.from_env(info.env),
        QueueSettings().visibility_timeout_seconds,
    )
    purge = aws_setup.client("sqs", info.s3_endpoint).purge_queue
    purge(QueueUrl=info.sqs_queue_url)  # the samples' own events: processed already
    original = hold_run_queue(info.env["DAGSTER_HOME"])
    log = ctx.workdir / f"fleet-daemon-{sample.size}.log"
    try:
        with (
            ctx.phase("set-up: daemon"),
            end_to_end.daemon(info, log) as process,
            DagsterInstance.from_config(info.env["DAGSTER_HOME"]) as instance,
        ):
            end_to_end.wait_for_daemon(instance, process, log)
            since = time.time()
            filters = RunsFilter(
                tags={"dagster/sensor_name": UPLOADS_SENSOR_NAME}, created_after=_utc(since)
            )
            sensor.enqueue_uploads(queue, f"daemon-{sample.size}", count)
            deadline = time.monotonic() + DEADLINE_SECONDS
            existing = 0
            first_seen = None
            while existing < count and time.monotonic() < deadline:
                existing = instance.get_runs_count(filters)
                if existing and first_seen is None:
                    first_seen = time.time() - since
                time.sleep(POLL_SECONDS)
            seconds = time.time() - since if existing >= count else float("inf")
            sample.add("daemon_runs_exist", seconds)
            sample.details["daemon"] = {
                "uploads": count,
                "runs_existing": existing,
                "first_run_after_seconds": round(first_seen, 2) if first_seen else None,
                "seconds": round(seconds, 2),
                "runs_per_second": round(count / seconds, 2) if seconds else None,
            }
            for record in instance.get_run_records(filters):
                instance.delete_run(record.dagster_run.run_id)
    finally:
        (Path(info.env["DAGSTER_HOME"]) / "dagster.yaml").write_text(original)
        purge(QueueUrl=info.sqs_queue_url)


def _utc(timestamp: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(timestamp, UTC)
