"""`campaign plan`'s arithmetic (campaign/capacity.py): each limit's demand at the planned rate,
the one that binds, the time to finish, the cost, and what `--within` chooses (pure)."""

from __future__ import annotations

import math

import pytest

from episode_pipeline.campaign.capacity import (
    HEADROOM,
    UPLOAD_RUNS_PER_SECOND,
    Ceilings,
    PlanBasis,
    Prices,
    Workload,
    capacity,
    choose,
    ramp_seconds,
)
from episode_pipeline.campaign.waves import WaveSettings, runs_to_keep_in_flight
from episode_pipeline.config.settings import CampaignSettings

# Fixed figures, not the module's defaults: the tests hold the arithmetic, not today's benchmark.
WORK = Workload(
    episode_seconds=30.0,
    worker_start_seconds=8.0,
    cold_start_seconds=60.0,
    db_connections_per_task=4,
    frame_rows=900,
    s3_puts=60.0,
    s3_gets=10.0,
    task_vcpu=1.0,
    task_memory_gib=2.0,
    source="test",
)
PRICES = Prices(vcpu_hour=0.04, gb_hour=0.004, s3_put_per_1000=0.005, s3_get_per_1000=0.0004)
ROOMY = Ceilings(
    campaign_runs=10_000,
    fargate_vcpus=100_000,
    db_connections=100_000,
    live_partitions=10_000_000,
    claims_per_second=1_000.0,
    lead_seconds=95.0,
)
RAMP = {"start": 4, "increase_after": 20}


def basis(ceilings: Ceilings = ROOMY) -> PlanBasis:
    return PlanBasis(WORK, ceilings, PRICES, **RAMP)


def plan(k: int, concurrency: int, ceilings: Ceilings = ROOMY, episodes: int = 1_000_000):
    return capacity(episodes=episodes, k=k, concurrency=concurrency, basis=basis(ceilings))


def limit(planned, name: str):
    return next(limit for limit in planned.limits if limit.name == name)


def test_each_demand_follows_from_the_rate_k_and_concurrency() -> None:
    planned = plan(k=10, concurrency=100)
    task_s = 60 + 8 + 10 * 30  # one cold start and worker start a batch of 10
    rate = 100 * 10 / task_s
    assert planned.episodes_per_second == pytest.approx(rate)
    runs = rate / 10
    assert limit(planned, "run queue").demand == pytest.approx(runs + UPLOAD_RUNS_PER_SECOND)
    assert limit(planned, "ECS RunTask / Fargate launches").demand == pytest.approx(
        runs + UPLOAD_RUNS_PER_SECOND
    )
    assert limit(planned, "Fargate vCPU").demand == 100
    assert limit(planned, "Fargate memory").demand == 200
    assert limit(planned, "database connections").demand == 400
    assert limit(planned, "frame rows (COPY)").demand == pytest.approx(rate * 900)
    assert limit(planned, "S3 PUT").demand == pytest.approx(rate * 60)
    assert limit(planned, "claims").demand == pytest.approx(rate)
    kept = runs_to_keep_in_flight(100, runs, 95.0) * 10
    assert limit(planned, "live partitions").demand == kept == 2_000
    assert limit(planned, "batch run time").demand == task_s


def test_todays_k1_and_eight_runs_take_months_and_the_lane_binds() -> None:
    """Issue 33's starting point: K = 1 and 8 at once is ~0.08 episodes/s, months a million."""
    ceilings = Ceilings.of(
        CampaignSettings(),
        WaveSettings(wave_size=500, episodes_per_run=1, max_live_partitions=500),
        lane=8,
        lead_seconds=95.0,
    )
    planned = plan(k=1, concurrency=8, ceilings=ceilings)
    assert planned.episodes_per_second == pytest.approx(8 / 98)
    assert planned.binding.name == "campaign runs at once"
    assert planned.hours_to_finish / 24 > 100
    assert planned.fits  # slow, not over a ceiling


def test_past_a_ceiling_the_campaign_goes_at_that_ceilings_pace() -> None:
    free = plan(k=10, concurrency=100)
    demand = limit(free, "database connections").demand
    tight = plan(k=10, concurrency=100, ceilings=_with(db_connections=demand / 2))
    assert tight.binding.name == "database connections" and not tight.fits
    assert limit(tight, "database connections").share == pytest.approx(2.0)
    # Half the connections: as if 50 ran, so the steady part takes twice as long.
    half = plan(k=10, concurrency=50)
    assert tight.hours_to_finish == pytest.approx(half.hours_to_finish)
    assert tight.hours_to_finish > 1.9 * free.hours_to_finish - free.ramp_hours * 2


def test_a_limit_near_its_ceiling_is_not_within_the_headroom() -> None:
    free = plan(k=10, concurrency=100)
    demand = limit(free, "Fargate vCPU").demand
    near = plan(k=10, concurrency=100, ceilings=_with(fargate_vcpus=demand / (HEADROOM + 0.05)))
    assert not near.fits and near.binding.name == "Fargate vCPU"
    within = plan(k=10, concurrency=100, ceilings=_with(fargate_vcpus=demand / HEADROOM))
    assert within.fits
    exact = plan(k=10, concurrency=100, ceilings=_with(campaign_runs=100))
    assert exact.fits  # our own lane is within up to its value


def test_the_cost_is_task_hours_at_the_task_size_and_the_s3_requests() -> None:
    planned = plan(k=10, concurrency=100, episodes=1_000)
    task_hours = 100 * (60 + 8 + 300) / 3600
    assert planned.task_hours == pytest.approx(task_hours)
    assert planned.cost.fargate_usd == pytest.approx(task_hours * (1 * 0.04 + 2 * 0.004))
    assert planned.cost.s3_usd == pytest.approx(1_000 * (60 * 0.005 + 10 * 0.0004) / 1000)
    assert planned.cost.total_usd == planned.cost.fargate_usd + planned.cost.s3_usd


def test_the_governors_climb_is_a_harmonic_sum() -> None:
    exact = sum(20 * 36.8 / limit for limit in range(4, 400))
    assert ramp_seconds(4, 400, 20, 36.8) == pytest.approx(exact, rel=0.01)
    assert ramp_seconds(8, 8, 20, 36.8) == 0.0
    # The plan adds the climb, the rest at full pace and the last batch's life.
    planned = plan(k=10, concurrency=100)
    climb = ramp_seconds(4, 100, 20, 36.8)
    steady = (1_000_000 - 96 * 20) * 36.8 / 100
    assert planned.hours_to_finish * 3600 == pytest.approx(climb + steady + 368)


def test_within_chooses_the_k_that_leaves_the_most_headroom() -> None:
    ceilings = _with(db_connections=2_500, live_partitions=25_000)
    choice = choose(episodes=1_000_000, hours=24, ks=range(1, 101), basis=basis(ceilings))
    chosen = choice.plan
    assert chosen is not None and chosen.fits and chosen.hours_to_finish <= 24
    k, concurrency = chosen.episodes_per_run, chosen.concurrency
    # One fewer run at once misses the deadline.
    assert plan(k, concurrency - 1, ceilings).hours_to_finish > 24
    # A smaller K sends the run queue nearer its ceiling, a larger one the live partitions.
    smaller = plan(k - 1, math.ceil(concurrency * 1.01), ceilings)
    larger = plan(k + 1, concurrency, ceilings)
    assert limit(smaller, "run queue").share > limit(chosen, "run queue").share
    assert limit(larger, "live partitions").share > limit(chosen, "live partitions").share
    assert chosen.binding.share <= max(smaller.binding.share, larger.binding.share)
    assert 1 < k < 100


def test_within_names_the_limit_that_forbids_it() -> None:
    choice = choose(
        episodes=1_000_000, hours=24, ks=range(1, 101), basis=basis(_with(fargate_vcpus=100))
    )
    assert choice.plan is None and choice.forbidding is not None
    assert choice.forbidding.name == "Fargate vCPU" and choice.forbidding.ceiling == 100
    assert choice.as_dict()["fits"] is False
    # No concurrency finishes before the first batch ends: time itself forbids it.
    too_soon = choose(episodes=1_000, hours=0.01, ks=range(1, 5), basis=basis())
    assert too_soon.forbidding is not None and too_soon.forbidding.name == "time to finish"
    with pytest.raises(ValueError, match="positive"):
        choose(episodes=1, hours=0, ks=[1], basis=basis())


def test_the_plan_prints_every_limit_and_the_one_that_binds() -> None:
    from episode_pipeline.cli import build_parser
    from episode_pipeline.commands.campaign import capacity_lines, within_lines

    planned = plan(k=25, concurrency=400, ceilings=_with(db_connections=1_000)).as_dict()
    text = "\n".join(capacity_lines(planned))
    assert "binding: database connections" in text and "does not fit" in text
    assert text.count("\n| ") == len(planned["limits"]) + 2  # the header, its rule, a row each
    assert "| Fargate memory | 800 GiB | - | - | - |" in text
    forbidden = choose(episodes=1_000_000, hours=24, ks=[25], basis=basis(_with(fargate_vcpus=100)))
    (line,) = within_lines(forbidden.as_dict())
    assert "Fargate vCPU forbids it" in line and math.isfinite(planned["hours_to_finish"])
    args = build_parser().parse_args(["campaign", "plan", "--stale", "--within", "24"])
    assert args.within == 24.0


def _with(**ceilings: float) -> Ceilings:
    from dataclasses import replace

    return replace(ROOMY, **ceilings)
