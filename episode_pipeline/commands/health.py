"""`episode-pipeline health`: one answer to "is it working?", usable as a probe."""

from __future__ import annotations

import argparse
import json

from episode_pipeline.commands.common import local_stack_unless_production

UNHEALTHY = 1


def add_health_parser(commands: argparse._SubParsersAction) -> None:
    health = commands.add_parser(
        "health",
        help="is the pipeline healthy: throughput, latency, failures, backlog, sensors, daemon",
        description="The last hour's throughput, latency p50/p95 and failures by cause; the "
        "backlog (queue depth, oldest upload waiting, dead-letter depth); each sensor's last "
        "tick and failure streak; the daemons' heartbeats. Exits 1 when unhealthy, the reasons "
        "on the first line (docs/operations.md#is-it-healthy). Thresholds: HEALTH_* settings.",
    )
    health.add_argument("--json", action="store_true", help="machine-readable output")
    health.set_defaults(handler=cmd_health)


def cmd_health(args: argparse.Namespace) -> int:
    from episode_pipeline.definitions import build_definitions
    from episode_pipeline.health import check_health, format_health
    from episode_pipeline.local.stack_env import apply_local_stack_env, load_settings
    from episode_pipeline.runner import local_instance

    local_stack_unless_production()
    apply_local_stack_env()  # DAGSTER_HOME of the local instance, when nothing is exported
    settings = load_settings()
    sensors = [sensor.name for sensor in build_definitions(settings).sensors]
    report = check_health(local_instance(settings), settings, sensors).as_dict()
    print(json.dumps(report, indent=2, default=str) if args.json else format_health(report))
    return 0 if report["healthy"] else UNHEALTHY
