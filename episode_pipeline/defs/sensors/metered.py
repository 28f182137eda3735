"""Every sensor evaluation writes one metric line (runtime/metrics.py), whatever the sensor.

`metered` wraps the function Dagster's `SensorDefinition.evaluate_tick` calls — once per tick for
a plain sensor and for a run-status sensor alike (the latter's own loop over runs is inside it) —
so no sensor body knows about metrics beyond the `metrics.count(...)` of what only it can count.
The line goes to the stdout of the process evaluating the sensor: the code server (or the
process of a test that evaluates a tick). A tick that raises writes its line, then re-raises.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from dagster import RunRequest, SensorDefinition, SensorResult

from episode_pipeline.runtime import metrics

_METERED = "_episode_pipeline_metered"


def runs_requested(result: Any) -> int:
    """Run requests in what the evaluation function returned (a list of its yields)."""
    items = result if isinstance(result, list) else [result]
    requested = 0
    for item in items:
        if isinstance(item, SensorResult):
            requested += len(item.run_requests or [])
        elif isinstance(item, RunRequest):
            requested += 1
    return requested


def metered(
    sensor: SensorDefinition, emitter: Callable[[], metrics.Emitter] = metrics.Emitter.from_env
) -> SensorDefinition:
    """The same sensor, its every evaluation timed and counted on one metric line."""
    if getattr(sensor, _METERED, False):
        return sensor
    evaluate = sensor._evaluation_fn
    name = sensor.name
    counters = metrics.tick_counters(name)

    @functools.wraps(evaluate)
    def evaluate_and_count(context: Any) -> Any:
        started = time.monotonic()
        failed = True
        with metrics.counting_tick(dict.fromkeys(counters, 0)) as counts:
            try:
                result = evaluate(context)
                failed = False
                if metrics.RUNS_REQUESTED in counters:
                    counts.values[metrics.RUNS_REQUESTED] = runs_requested(result)
                return result
            finally:
                # A failed tick carries only its failure and duration: partial counts mislead.
                values = {} if failed else counts.values
                by_reason = {} if failed else counts.by_reason
                emitter().sensor_tick(name, time.monotonic() - started, failed, values, by_reason)

    sensor._evaluation_fn = evaluate_and_count
    setattr(sensor, _METERED, True)
    return sensor


def is_metered(sensor: SensorDefinition) -> bool:
    return bool(getattr(sensor, _METERED, False))
