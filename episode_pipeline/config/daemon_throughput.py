"""How fast the daemon turns a burst of finished runs and run requests into work (docs/scale.md).

Dagster's run-status sensors (`episode_upload_done`, `episode_failed_on_run_failure`) look at 25
finished runs and act on 5 per tick by default: at one tick every 10 s a burst of 1,000 successes
would keep its messages for half an hour, long past their 15-minute visibility timeout, and
every one of them would come back for another receive. Our per-run work is keyed (one SQS delete,
one row update), so a tick can take a few hundred runs well inside the 60 s tick deadline.

The two limits are environment variables read by the process that evaluates the sensors (the
code server), not instance settings: `apply_run_status_sensor_limits` sets them when the code
location loads, unless the deployment set them itself. The daemon's worker counts (sensor
threads, submit threads, dequeue threads) are instance settings: production's dagster.yaml, which
the local instance takes unchanged but for its sensor threads (`local.dagster_home`).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

PROCESS_LIMIT_ENV = "DAGSTER_RUN_STATUS_SENSOR_PROCESS_LIMIT"
FETCH_LIMIT_ENV = "DAGSTER_RUN_STATUS_SENSOR_FETCH_LIMIT"
# Runs one run-status sensor acts on per tick: 1,000 successes in five 10-second ticks.
RUN_STATUS_SENSOR_PROCESS_LIMIT = 200
# Finished runs it reads per tick; as many as it may act on, since every run is ours.
RUN_STATUS_SENSOR_FETCH_LIMIT = 200


def run_status_sensor_env() -> dict[str, str]:
    return {
        PROCESS_LIMIT_ENV: str(RUN_STATUS_SENSOR_PROCESS_LIMIT),
        FETCH_LIMIT_ENV: str(RUN_STATUS_SENSOR_FETCH_LIMIT),
    }


def apply_run_status_sensor_limits(environ: MutableMapping[str, str] = os.environ) -> None:
    """Our per-tick limits, unless the deployment set its own (Dagster reads them per tick)."""
    for name, value in run_status_sensor_env().items():
        environ.setdefault(name, value)
