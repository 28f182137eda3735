"""The daemon keeps up with a fleet's bursts: per-tick limits and worker counts, in both instances.

The production dagster.yaml and the local instance must agree with `defs.sensors.throughput`;
the run-status sensors' limits reach the code server's environment without overriding a value
the deployment set itself.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from episode_pipeline.config import daemon_throughput as throughput
from episode_pipeline.local.dagster_home import instance_config

DAGSTER_YAML = Path(__file__).resolve().parents[1] / "dagster.yaml"


def test_both_instances_launch_and_submit_side_by_side() -> None:
    production = yaml.safe_load(DAGSTER_YAML.read_text())
    local = instance_config("pw", 1)
    assert production["sensors"] == throughput.daemon_sensor_config()
    # Locally sensors tick one after another: no failed tick when `dev` stops.
    assert local["sensors"] == {"use_threads": False}
    for config in (production, local):
        coordinator = config["run_coordinator"]["config"]
        assert coordinator["dequeue_use_threads"] is True
        assert coordinator["dequeue_num_workers"] == throughput.DEQUEUE_WORKERS


def test_run_status_limits_are_set_unless_the_deployment_set_them() -> None:
    environ: dict[str, str] = {throughput.FETCH_LIMIT_ENV: "50"}
    throughput.apply_run_status_sensor_limits(environ)
    assert environ == {
        throughput.FETCH_LIMIT_ENV: "50",
        throughput.PROCESS_LIMIT_ENV: str(throughput.RUN_STATUS_SENSOR_PROCESS_LIMIT),
    }
    # 1,000 successes within two minutes at one tick every 10 s.
    assert throughput.RUN_STATUS_SENSOR_PROCESS_LIMIT * (120 // 10 - 2) >= 1_000


def test_both_instances_purge_sensor_ticks_alike() -> None:
    production = yaml.safe_load(DAGSTER_YAML.read_text())
    assert instance_config("pw", 1)["retention"] == production["retention"]
