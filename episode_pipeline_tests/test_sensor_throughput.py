"""The daemon keeps up with a fleet's bursts: per-tick limits and worker counts, in both instances.

Production's dagster.yaml runs the daemon's sensors, submissions and launches on threads (the
local instance takes its values: test_instance_config.py); the run-status sensors' limits reach
the code server's environment without overriding a value the deployment set itself.
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
    # 4 sensors tick at once, and 4 threads submit one tick's run requests (300 a tick).
    assert production["sensors"] == {"use_threads": True, "num_workers": 4, "num_submit_workers": 4}
    # Locally sensors tick one after another: no failed tick when `dev` stops.
    assert local["sensors"]["use_threads"] is False
    for config in (production, local):
        # An ECS RunTask takes ~1 s; 4 threads stay under its 20 calls/s.
        coordinator = config["run_coordinator"]["config"]
        assert coordinator["dequeue_use_threads"] is True
        assert coordinator["dequeue_num_workers"] == 4


def test_run_status_limits_are_set_unless_the_deployment_set_them() -> None:
    environ: dict[str, str] = {throughput.FETCH_LIMIT_ENV: "50"}
    throughput.apply_run_status_sensor_limits(environ)
    assert environ == {
        throughput.FETCH_LIMIT_ENV: "50",
        throughput.PROCESS_LIMIT_ENV: str(throughput.RUN_STATUS_SENSOR_PROCESS_LIMIT),
    }
    # 1,000 successes within two minutes at one tick every 10 s.
    assert throughput.RUN_STATUS_SENSOR_PROCESS_LIMIT * (120 // 10 - 2) >= 1_000
