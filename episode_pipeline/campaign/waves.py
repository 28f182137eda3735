"""Wave sizing, the campaign's pace and the plan's estimates (pure).

A wave is the episodes one driver tick claims and hands to the run queue as one backfill. The
governor's limit is how many campaign runs the run queue launches at once (the driver publishes
it as a tag limit, instance/campaign_queue.py). To keep those slots busy while the next wave is on
its way (a driver tick, then the backfill daemon's), the campaign keeps more runs claimed than it
launches: the limit plus the runs that finish in that lead time (Little's law), at least one more
limit's worth (`runs_to_keep_in_flight`). A wave fills that budget, bounded by the live-partition
budget (the campaign's own live partitions stay within `max_live_partitions`) and by the wave
size. The first wave is the canary's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class WaveSettings:
    wave_size: int = 500  # episodes per wave at most
    episodes_per_run: int = 1  # K: episodes one campaign run processes (one cold start)
    max_live_partitions: int = 500  # the campaign's own live partitions at most (one wave)

    def __post_init__(self) -> None:
        if min(self.wave_size, self.episodes_per_run, self.max_live_partitions) < 1:
            raise ValueError(f"wave settings must be positive: {self}")


RATE_TIME_CONSTANT_SECONDS = 120.0  # how fast the measured pace follows a change


def measured_rate(rate: float, measured_at: datetime | None, settled: int, now: datetime) -> float:
    """Episodes settled per second: `settled` ended since `measured_at` (None: the first tick,
    nothing to divide by). It rises at once to a faster tick's pace and falls exponentially
    (`RATE_TIME_CONSTANT_SECONDS`): a queue kept too long costs live partitions (bounded by the
    live budget), one too short idles what the run queue may launch."""
    if measured_at is None:
        return rate
    seconds = (now - measured_at).total_seconds()
    if seconds <= 0:
        return rate
    instant = settled / seconds
    weight = 1 - math.exp(-seconds / RATE_TIME_CONSTANT_SECONDS)
    return max(instant, rate + weight * (instant - rate))


def runs_to_keep_in_flight(limit: int, runs_per_second: float, lead_seconds: float) -> int:
    """Campaign runs to keep claimed: the `limit` the run queue launches, plus the queued ones
    that keep them busy for `lead_seconds` (a claim's way to the queue), at least `limit`."""
    return limit + max(limit, math.ceil(runs_per_second * lead_seconds))


def next_wave_size(
    *,
    settings: WaveSettings,
    limit: int,
    runs_budget: int,
    runs_in_flight: int,
    campaign_live_partitions: int,
    claimable: int,
    canary_size: int | None,
) -> int:
    """Episodes to claim now (0: wait). A wave starts only with room for at least half the
    governor's limit, so waves are not one episode each as runs trickle to an end."""
    room_runs = runs_budget - runs_in_flight
    if room_runs <= 0 or room_runs < math.ceil(limit / 2):
        return 0
    size = min(
        room_runs * settings.episodes_per_run,
        settings.wave_size,
        settings.max_live_partitions - campaign_live_partitions,
        claimable,
    )
    if canary_size is not None:
        size = min(size, canary_size)
    return max(0, size)


def batches(size: int, per_run: int) -> list[int]:
    """Episodes per run for a wave of `size`: K each, the last one the remainder."""
    return [min(per_run, size - start) for start in range(0, size, per_run)]


# Documented defaults when no episode has a measured record yet (docs/operations.md).
DEFAULT_RUN_SECONDS = 90.0  # one short episode's run, cold start included (docs/scale.md)
DEFAULT_COLD_START_SECONDS = 60.0  # a Fargate task's start (AWS's figure)
DEFAULT_S3_REQUESTS = 40.0  # GET archive + PUT per extracted file, HLS segments and playlists


@dataclass(frozen=True)
class Estimate:
    episodes: int
    waves: int
    runs: int
    task_hours: float
    s3_requests: int
    hours_to_finish: float
    seconds_per_episode: float
    measured_from: int  # episodes the per-episode figures come from (0: the defaults)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate(
    *,
    episodes: int,
    settings: WaveSettings,
    concurrency: int,
    measured_run_seconds: float | None,
    measured_from: int,
    s3_requests_per_episode: float = DEFAULT_S3_REQUESTS,
    canary_size: int = 0,
) -> Estimate:
    """Task-hours, S3 requests and time to finish at `concurrency` runs at once.

    A measured run's wall time includes its cold start; K episodes in one run pay it once.
    """
    run_seconds = measured_run_seconds or DEFAULT_RUN_SECONDS
    work = max(1.0, run_seconds - DEFAULT_COLD_START_SECONDS)
    per_run = settings.episodes_per_run
    runs = math.ceil(episodes / per_run) if episodes else 0
    task_seconds_per_run = DEFAULT_COLD_START_SECONDS + work * per_run
    rest = max(0, episodes - canary_size)
    waves = (1 if canary_size and episodes else 0) + math.ceil(rest / settings.wave_size)
    task_hours = runs * task_seconds_per_run / 3600
    return Estimate(
        episodes=episodes,
        waves=waves,
        runs=runs,
        task_hours=round(task_hours, 2),
        s3_requests=round(episodes * s3_requests_per_episode),
        hours_to_finish=round(task_hours / max(1, concurrency), 2),
        seconds_per_episode=round(task_seconds_per_run / per_run, 1),
        measured_from=measured_from,
    )
