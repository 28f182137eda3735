"""The local Dagster instance: DAGSTER_HOME under the stack home, storage in embedded Postgres.

Run, event-log and schedule storage live in the `dagster` database so the webserver, the daemon
and `dagster asset materialize` (run in-process) all see the same runs and dynamic partitions.
The URL uses `postgresql+psycopg2://`: with SQLAlchemy 2.1 a bare `postgresql://` selects
psycopg 3, and dagster-postgres's `NOTIFY run_events, $1` then fails
(docs/platform-notes.md#dagster-storage-url).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from episode_pipeline.config import daemon_throughput as throughput

MAX_CONCURRENT_RUNS = 2  # a laptop has few cores; FFmpeg runs fill them
DEFAULT_POOL_LIMIT = 2
# The whole run's deadline, as in production's dagster.yaml: past it run monitoring terminates
# the run and fails it. A run whose worker died is failed sooner, at the next poll
# (`local.run_launcher`).
RUN_MAX_RUNTIME_SECONDS = 2 * 3600
MONITORING_POLL_SECONDS = 30


def storage_url(password: str, port: int, database: str = "dagster") -> str:
    return f"postgresql+psycopg2://postgres:{password}@127.0.0.1:{port}/{database}"


# Dagster's three Postgres storages named one by one (not `storage: postgres`) so that the event
# log is ours: Dagster's with the partitioned checks' statuses computed in one pass
# (defs/event_log_storage.py). Each keeps a pool of connections (defs/instance_storage.py), as
# production's dagster.yaml names them: the local instance and every crash test run these.
POOLED_STORAGE_CLASSES = {
    "run_storage": ("episode_pipeline.defs.instance_storage", "PooledPostgresRunStorage"),
    "event_log_storage": ("episode_pipeline.defs.instance_storage", "PooledEpisodeEventLogStorage"),
    "schedule_storage": ("episode_pipeline.defs.instance_storage", "PooledPostgresScheduleStorage"),
}

# The same without the pool (a new connection per statement): the local instance before issue
# 27, now only the baseline of benchmarks/local_burst.py.
UNPOOLED_STORAGE_CLASSES = {
    "run_storage": ("dagster_postgres.run_storage", "PostgresRunStorage"),
    "event_log_storage": ("episode_pipeline.defs.event_log_storage", "EpisodeEventLogStorage"),
    "schedule_storage": ("dagster_postgres.schedule_storage", "PostgresScheduleStorage"),
}


def storage_config(postgres: dict[str, Any], *, pooled: bool = True) -> dict[str, Any]:
    """The instance's storage blocks, all on one database (`postgres_url` or `postgres_db`)."""
    classes = POOLED_STORAGE_CLASSES if pooled else UNPOOLED_STORAGE_CLASSES
    return {
        block: {"module": module, "class": cls, "config": postgres}
        for block, (module, cls) in classes.items()
    }


def instance_config(
    password: str,
    port: int,
    *,
    database: str = "dagster",
    max_runtime_seconds: int = RUN_MAX_RUNTIME_SECONDS,
) -> dict[str, Any]:
    """dagster.yaml for the local instance (pure: the tests read it back)."""
    return {
        **storage_config({"postgres_url": storage_url(password, port, database)}),
        "run_launcher": {
            "module": "episode_pipeline.local.run_launcher",
            "class": "LocalRunLauncher",
        },
        "run_coordinator": {
            # The run queue, tagging every episode run `org`/`episode` (defs/run_coordinator.py).
            "module": "episode_pipeline.defs.run_coordinator",
            "class": "EpisodeRunCoordinator",
            # Dagster's default 5 s is felt on a laptop, where a run starts in seconds (on ECS
            # a task's start dwarfs it); the dequeue query is one cheap read. Launches of one
            # dequeue go side by side, as in production (config/daemon_throughput.py).
            # The limits sit here, as in dagster.yaml, not under `concurrency: runs:` (which
            # would replace the coordinator's, and with them each campaign's launch limit).
            "config": {
                "dequeue_interval_seconds": 1,
                "dequeue_use_threads": True,
                "dequeue_num_workers": throughput.DEQUEUE_WORKERS,
                "max_concurrent_runs": MAX_CONCURRENT_RUNS,
                # One run per org at a time: an org's uploads are processed in arrival order
                # and one busy org cannot take every slot.
                "tag_concurrency_limits": [
                    {"key": "org", "value": {"applyLimitPerUniqueValue": True}, "limit": 1},
                    # Campaign runs, all campaigns together (dagster.yaml's, scaled down).
                    {"key": "episode_pipeline/campaign", "limit": 2},
                ],
            },
        },
        "concurrency": {
            "pools": {"default_limit": DEFAULT_POOL_LIMIT},
        },
        "run_monitoring": {
            "enabled": True,
            "max_runtime_seconds": max_runtime_seconds,
            "poll_interval_seconds": MONITORING_POLL_SECONDS,
        },
        # Ticks one after another, unlike production: with the sensor thread pool, a tick the
        # pool starts while the daemon shuts down fails with DagsterCodeLocationNotFoundError,
        # so every Ctrl-C of `dev` could leave a failed tick. A laptop's ticks are short.
        "sensors": throughput.daemon_sensor_config(threads=False),
        # Tick history purged as in production (dagster.yaml); runs and events are pruned by
        # the retention sensor (docs/retention.md).
        "retention": {
            "schedule": {"purge_after_days": 90},
            "sensor": {
                "purge_after_days": {"skipped": 3, "success": 14, "failure": 30, "started": 14}
            },
        },
        "telemetry": {"enabled": False},
    }


def write_dagster_yaml(dagster_home: Path, password: str, port: int) -> Path:
    """(Re)write dagster.yaml; the port may change between starts, so it is written every time."""
    dagster_home.mkdir(parents=True, exist_ok=True)
    path = dagster_home / "dagster.yaml"
    text = (
        "# Generated by episode_pipeline.local.stack on every `stack up`; edits are overwritten.\n"
        + yaml.safe_dump(instance_config(password, port), sort_keys=False)
    )
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def initialize_instance(dagster_home: Path) -> None:
    """Create Dagster's tables once, so the webserver and daemon do not race to create them."""
    from dagster import DagsterInstance

    with DagsterInstance.from_config(str(dagster_home)) as instance:
        instance.get_runs_count()
