"""What a campaign asks of each limit at the rate it plans for, which one binds, how long it
takes and what it costs (pure; `campaign plan` prints it; the figures and their sources:
docs/scale.md#a-million-episodes-in-a-day).

A campaign runs `concurrency` batch tasks at once (the governor's limit, capped by the run
queue's campaign lane), each of K episodes (`episodes_per_run`). A task lives `cold start +
worker start + K * episode seconds`, so the campaign settles `concurrency * K / task seconds`
episodes a second. At that rate each limit has a demand:

| limit | demand | ceiling |
| --- | --- | --- |
| run queue | runs/s: episodes/s / K, plus the uploads' | `RUN_QUEUE_RUNS_PER_SECOND` |
| ECS `RunTask`, Fargate launches | one call, one task a run | `RUNTASK_CALLS_PER_SECOND` |
| campaign runs at once | the concurrency | `CAMPAIGN_CONCURRENCY_MAX` (the lane) |
| Fargate vCPU | concurrency * the task's vCPU | `CAMPAIGN_FARGATE_VCPU_QUOTA` |
| memory | concurrency * the task's GiB | none (billed, no quota) |
| database connections | concurrency * a worker's | `CAMPAIGN_DB_CONNECTIONS` |
| frame rows | episodes/s * rows an episode | `COPY_ROWS_PER_SECOND` |
| S3 PUT | episodes/s * objects an episode | `S3_PUTS_PER_PREFIX_PER_SECOND` |
| claims | episodes/s | a wave a driver tick: wave size / tick seconds |
| live partitions | episodes kept claimed | `CAMPAIGN_MAX_LIVE_PARTITIONS` |
| a batch's run time | the task's seconds | run monitoring's `max_runtime_seconds` |

A limit is within when its demand is at most `HEADROOM` of its ceiling: those ceilings are
published quotas or figures measured on other hardware, not promises (our own exact limits, the
lane and a run's deadline, are within up to their value). The binding limit is the one nearest
what it allows; past its ceiling, the campaign goes no faster than that limit lets it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from episode_pipeline.campaign.waves import WaveSettings, runs_to_keep_in_flight
from episode_pipeline.config.settings import CampaignSettings

HEADROOM = 0.8  # plan within 80 % of each ceiling (measured or published figures, not promises)
MAX_CONCURRENCY = 1 << 20  # where `--within` stops looking: no deployment runs more tasks

# -- ceilings that are constants, each with its source ------------------------------------------
# The run queue and backfill daemon: 0.79 runs/s measured on the local queue by the campaign
# stage (benchmarks/results/fleet-campaign/, `campaign_throughput@100,000` baseline 0.786, 1 s
# stand-in runs); upstream reports ~1 run/s for a backfill's runs (dagster-io/dagster#28998).
RUN_QUEUE_RUNS_PER_SECOND = 0.79
# ECS `RunTask` on Fargate: 20 calls/s, burst and sustained; Fargate launches 20 tasks/s after a
# burst of 100 (docs.aws.amazon.com/AmazonECS/latest/developerguide/throttling.html). The
# launcher makes one call per run, so both are one per run.
RUNTASK_CALLS_PER_SECOND = 20.0
# S3: at least 3,500 PUT/COPY/POST/DELETE a second per partitioned prefix, 503 SlowDown while
# S3 scales a prefix up (docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html).
# A campaign of one org writes under one prefix (`orgs/<org>/`) until S3 splits it.
S3_PUTS_PER_PREFIX_PER_SECOND = 3_500.0
# Frame rows: the COPY of `frames` measured at 43,394 rows/s against the server's own COPY FROM a
# file at 44,777 (benchmarks/results/latest.md, `frames_load`, 6-float rows, 2 cores).
COPY_ROWS_PER_SECOND = 43_000.0
# A batch run still going after this is terminated (dagster.yaml run_monitoring).
MAX_RUN_SECONDS = 7_200.0
# The fleet's own uploads share the run queue and RunTask: 10,000 a day (docs/scale.md).
UPLOAD_RUNS_PER_SECOND = 10_000 / 86_400
# A Fargate task's image pull and start (platform-notes.md: ~60 s, images never cached).
COLD_START_SECONDS = 60.0

# -- one short episode as the batch stage measured it (benchmarks/results/batch-2x30s/) ---------
# A 2-camera 30 s 320x240 episode (1.7 MB archive), `dagster api execute_run` from exec to exit on
# the shared 2-core machine at load 5-17: a batch of 10 took T_10 = 265.8 s, a batch of one
# T_1 = 52.4 s (medians of 2). One episode's own work is (T_10 - T_1) / 9 = 23.7 s (9.9 CPU s: the
# wall, not the CPU, so a 1-vCPU task is not flattered), the worker's start T_1 - 23.7 = 28.7 s
# (4.2 s on a quiet machine, the `startup` stage: the load's, kept as measured).
BENCHMARK = "batch stage, 2-camera 30 s episode (benchmarks/results/batch-2x30s/)"
EPISODE_SECONDS = 23.7
WORKER_START_SECONDS = 28.7
WORKER_DB_CONNECTIONS = 4  # the most a run worker held at once, every side (its 3 storages, ours)
FRAME_ROWS_PER_EPISODE = 900  # 30 s at 30 fps
S3_PUTS_PER_EPISODE = 29.0  # the keys one episode writes (extracted files, HLS, stored outputs)
S3_GETS_PER_EPISODE = 20.0  # not measured: the archive, stored inputs read back, HEADs
BATCH_TASK_VCPU = 1.0  # `place_batch`: a vCPU per 128 MiB of the largest archive, at least 1
BATCH_TASK_MEMORY_GIB = 2.0  # 2 GiB per vCPU (transcode/job.fargate_size)


@dataclass(frozen=True)
class Workload:
    """One episode's demands and its batch task's shape."""

    episode_seconds: float = EPISODE_SECONDS
    worker_start_seconds: float = WORKER_START_SECONDS
    cold_start_seconds: float = COLD_START_SECONDS
    db_connections_per_task: int = WORKER_DB_CONNECTIONS
    frame_rows: int = FRAME_ROWS_PER_EPISODE
    s3_puts: float = S3_PUTS_PER_EPISODE
    s3_gets: float = S3_GETS_PER_EPISODE
    task_vcpu: float = BATCH_TASK_VCPU
    task_memory_gib: float = BATCH_TASK_MEMORY_GIB
    source: str = BENCHMARK

    def task_seconds(self, k: int) -> float:
        """A batch task's life, billed from the image pull: one cold start and worker start."""
        return self.cold_start_seconds + self.worker_start_seconds + k * self.episode_seconds


@dataclass(frozen=True)
class Ceilings:
    """Every ceiling the plan holds a campaign to; the deployment's ones come from settings."""

    campaign_runs: int  # CAMPAIGN_CONCURRENCY_MAX: the governor's maximum and the lane
    fargate_vcpus: float  # CAMPAIGN_FARGATE_VCPU_QUOTA
    db_connections: int  # CAMPAIGN_DB_CONNECTIONS
    live_partitions: int  # CAMPAIGN_MAX_LIVE_PARTITIONS
    claims_per_second: float  # CAMPAIGN_WAVE_SIZE / CAMPAIGN_TICK_SECONDS
    lead_seconds: float  # a claim's way to the queue (CAMPAIGN_TICK_SECONDS, as the driver)
    run_queue_runs_per_second: float = RUN_QUEUE_RUNS_PER_SECOND
    runtask_calls_per_second: float = RUNTASK_CALLS_PER_SECOND
    frame_rows_per_second: float = COPY_ROWS_PER_SECOND
    s3_puts_per_second: float = S3_PUTS_PER_PREFIX_PER_SECOND
    max_run_seconds: float = MAX_RUN_SECONDS
    other_runs_per_second: float = UPLOAD_RUNS_PER_SECOND

    @classmethod
    def of(
        cls, settings: CampaignSettings, waves: WaveSettings, lane: int, lead_seconds: float
    ) -> Ceilings:
        """The deployment's ceilings: the settings, the campaign's waves and its lane."""
        return cls(
            campaign_runs=lane,
            fargate_vcpus=settings.fargate_vcpu_quota,
            db_connections=settings.db_connections,
            live_partitions=waves.max_live_partitions,
            claims_per_second=waves.wave_size / settings.tick_seconds,
            lead_seconds=lead_seconds,
        )


@dataclass(frozen=True)
class Prices:
    """List prices in USD (settings, with today's as defaults)."""

    vcpu_hour: float
    gb_hour: float
    s3_put_per_1000: float
    s3_get_per_1000: float

    @classmethod
    def of(cls, settings: CampaignSettings) -> Prices:
        return cls(
            vcpu_hour=settings.fargate_vcpu_hour_usd,
            gb_hour=settings.fargate_gb_hour_usd,
            s3_put_per_1000=settings.s3_put_per_1000_usd,
            s3_get_per_1000=settings.s3_get_per_1000_usd,
        )


@dataclass(frozen=True)
class PlanBasis:
    """What a plan is figured on at any K and concurrency: one episode's demands, the ceilings,
    the prices, and the governor's climb (its first limit, and the successes after which it
    adds one run)."""

    workload: Workload
    ceilings: Ceilings
    prices: Prices
    start: int
    increase_after: int


@dataclass(frozen=True)
class Limit:
    name: str
    demand: float
    ceiling: float | None  # None: reported, no ceiling
    unit: str
    source: str
    scales_with_rate: bool = True  # False: the batch's run time, set by K alone
    headroom: float = HEADROOM  # 1.0 for our own exact limits

    @property
    def share(self) -> float:
        """Demand over ceiling (0 when there is none)."""
        return self.demand / self.ceiling if self.ceiling else 0.0

    @property
    def pressure(self) -> float:
        """Share over the share allowed: above 1 the limit is not within."""
        return self.share / self.headroom

    @property
    def within(self) -> bool:
        return self.share <= self.headroom

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "share": round(self.share, 3), "within": self.within}


@dataclass(frozen=True)
class Cost:
    fargate_usd: float
    s3_usd: float

    @property
    def total_usd(self) -> float:
        return self.fargate_usd + self.s3_usd


@dataclass(frozen=True)
class Capacity:
    episodes: int
    episodes_per_run: int
    concurrency: int
    episodes_per_second: float  # what the plan's concurrency and K settle
    limits: tuple[Limit, ...]
    hours_to_finish: float  # at the rate the binding limit lets, with the governor's climb
    ramp_hours: float  # the governor's climb from its start to `concurrency`
    task_hours: float
    cost: Cost
    basis: PlanBasis  # its climb is counted in the time

    @property
    def binding(self) -> Limit:
        return max(self.limits, key=lambda limit: limit.pressure)

    @property
    def fits(self) -> bool:
        return all(limit.within for limit in self.limits)

    def as_dict(self) -> dict[str, Any]:
        return {
            "episodes": self.episodes,
            "episodes_per_run": self.episodes_per_run,
            "concurrency": self.concurrency,
            "episodes_per_second": round(self.episodes_per_second, 3),
            "fits": self.fits,
            "binding": self.binding.name,
            "headroom": HEADROOM,
            "limits": [limit.as_dict() for limit in self.limits],
            "hours_to_finish": round(self.hours_to_finish, 2),
            "ramp_hours": round(self.ramp_hours, 2),
            "task_hours": round(self.task_hours, 1),
            "cost_usd": {
                "fargate": round(self.cost.fargate_usd, 2),
                "s3": round(self.cost.s3_usd, 2),
                "total": round(self.cost.total_usd, 2),
            },
            "workload": asdict(self.basis.workload),
        }


def limits_at(
    *, k: int, concurrency: int, rate: float, workload: Workload, ceilings: Ceilings
) -> tuple[Limit, ...]:
    """Each limit's demand with `concurrency` tasks of K episodes settling `rate` episodes/s."""
    runs = rate / k
    launches = runs + ceilings.other_runs_per_second
    kept = runs_to_keep_in_flight(concurrency, runs, ceilings.lead_seconds) * k
    return (
        Limit("run queue", launches, ceilings.run_queue_runs_per_second, "runs/s",
              "measured local queue 0.79 runs/s (fleet-campaign); ~1/s upstream, dagster#28998; "
              "uploads' runs included"),
        Limit("ECS RunTask / Fargate launches", launches, ceilings.runtask_calls_per_second,
              "calls/s", "AWS: RunTask 20 calls/s; Fargate 20 launches/s after a burst of 100"),
        Limit("campaign runs at once", concurrency, ceilings.campaign_runs, "tasks",
              "CAMPAIGN_CONCURRENCY_MAX (governor maximum; dagster.yaml's campaign lane)",
              headroom=1.0),
        Limit("Fargate vCPU", concurrency * workload.task_vcpu, ceilings.fargate_vcpus, "vCPU",
              "CAMPAIGN_FARGATE_VCPU_QUOTA (the account's Fargate On-Demand vCPU quota)"),
        Limit("Fargate memory", concurrency * workload.task_memory_gib, None, "GiB",
              "no quota: billed per GB-hour"),
        Limit("database connections", concurrency * workload.db_connections_per_task,
              ceilings.db_connections, "connections",
              "CAMPAIGN_DB_CONNECTIONS (Aurora max_connections less the services')"),
        Limit("frame rows (COPY)", rate * workload.frame_rows, ceilings.frame_rows_per_second,
              "rows/s", "frames_load: COPY 43,394 rows/s measured, 2 cores"),
        Limit("S3 PUT", rate * workload.s3_puts, ceilings.s3_puts_per_second, "PUT/s",
              "AWS: 3,500 PUT/s per partitioned prefix"),
        Limit("claims", rate, ceilings.claims_per_second, "episodes/s",
              "a wave per driver tick: CAMPAIGN_WAVE_SIZE / CAMPAIGN_TICK_SECONDS"),
        Limit("live partitions", kept, ceilings.live_partitions, "partitions",
              "CAMPAIGN_MAX_LIVE_PARTITIONS (episodes kept claimed: waves.runs_to_keep_in_flight)"),
        Limit("batch run time", workload.task_seconds(k), ceilings.max_run_seconds, "s",
              "dagster.yaml run_monitoring max_runtime_seconds", scales_with_rate=False,
              headroom=1.0),
    )  # fmt: skip


def ramp_seconds(start: int, concurrency: int, increase_after: int, task_episode_s: float) -> float:
    """The governor's climb from `start` to `concurrency`: one more run after `increase_after`
    successes, which at limit L arrive every `task_episode_s / L` seconds. The sum of 1/L over
    start..concurrency-1 is ln((concurrency - ½) / (start - ½)) within 1 % (a harmonic sum)."""
    if concurrency <= start:
        return 0.0
    return increase_after * task_episode_s * math.log((concurrency - 0.5) / (start - 0.5))


def finish_seconds(
    *, episodes: int, k: int, concurrency: int, basis: PlanBasis
) -> tuple[float, float]:
    """(seconds to finish, seconds of the climb) at K and `concurrency` tasks once climbed to,
    no ceiling in the way: the climb, the rest at full pace, the last batch's life."""
    if not episodes:
        return 0.0, 0.0
    start, increase_after = basis.start, basis.increase_after
    task_s = basis.workload.task_seconds(k)
    per_episode = task_s / k  # task seconds each episode costs, its share of the fixed ones
    climb = max(start, concurrency)
    ramp = ramp_seconds(start, climb, increase_after, per_episode)
    rest = max(0, episodes - (climb - start) * increase_after)
    return ramp + rest * per_episode / climb + task_s, ramp


def capacity(*, episodes: int, k: int, concurrency: int, basis: PlanBasis) -> Capacity:
    """The plan at K and `concurrency` (the governor's maximum, climbed to from its start)."""
    workload, prices = basis.workload, basis.prices
    task_s = workload.task_seconds(k)
    rate = concurrency * k / task_s
    limits = limits_at(
        k=k, concurrency=concurrency, rate=rate, workload=workload, ceilings=basis.ceilings
    )
    # Over a ceiling itself (not its headroom), the campaign is held to that ceiling's pace.
    over = max((limit.share for limit in limits if limit.scales_with_rate), default=0.0)
    # Past a ceiling the campaign goes at that ceiling's pace: as if that many fewer tasks ran.
    effective = max(1, min(concurrency, math.floor(concurrency / max(1.0, over))))
    seconds, ramp = finish_seconds(episodes=episodes, k=k, concurrency=effective, basis=basis)
    runs = math.ceil(episodes / k)
    task_hours = runs * task_s / 3600
    fargate = task_hours * (
        workload.task_vcpu * prices.vcpu_hour + workload.task_memory_gib * prices.gb_hour
    )
    s3 = (
        episodes
        * (workload.s3_puts * prices.s3_put_per_1000 + workload.s3_gets * prices.s3_get_per_1000)
        / 1000
    )
    return Capacity(
        episodes=episodes,
        episodes_per_run=k,
        concurrency=concurrency,
        episodes_per_second=rate,
        limits=limits,
        hours_to_finish=seconds / 3600,
        ramp_hours=ramp / 3600,
        task_hours=task_hours,
        cost=Cost(fargate_usd=fargate, s3_usd=s3),
        basis=basis,
    )


@dataclass(frozen=True)
class Choice:
    """`--within HOURS`: the K and concurrency that finish in time, or the limit that forbids it."""

    hours: float
    plan: Capacity | None  # None: nothing fits
    forbidding: Limit | None  # the binding limit of the nearest try when nothing fits
    nearest: Capacity | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "within_hours": self.hours,
            "fits": self.plan is not None,
            "plan": self.plan.as_dict() if self.plan else None,
            "forbidding": self.forbidding.as_dict() if self.forbidding else None,
            "nearest": self.nearest.as_dict() if self.nearest else None,
        }


def choose(*, episodes: int, hours: float, ks: Iterable[int], basis: PlanBasis) -> Choice:
    """The K whose least concurrency that finishes within `hours` leaves the most headroom (its
    binding limit the furthest below its ceiling; on a tie the smaller K: a shorter batch to
    retry, a finer pace). The concurrency is the least that finishes in time (fewer tasks,
    connections and live partitions). Nothing fitting, the nearest try (whose forbidding limit
    is least over) names the limit that forbids it."""
    if hours <= 0:
        raise ValueError(f"--within needs a positive number of hours, not {hours:g}")
    best: Capacity | None = None
    nearest: Capacity | None = None
    for k in sorted(set(ks)):
        plan = least_concurrency(episodes=episodes, hours=hours, k=k, basis=basis)
        if plan.fits and plan.hours_to_finish <= hours:
            if best is None or plan.binding.pressure < best.binding.pressure:
                best = plan
        elif (
            nearest is None
            or forbidding(plan, hours).pressure < forbidding(nearest, hours).pressure
        ):
            nearest = plan
    if best is not None:
        return Choice(hours, best, None, None)
    assert nearest is not None, "no K to try"
    return Choice(hours, None, forbidding(nearest, hours), nearest)


def forbidding(plan: Capacity, hours: float) -> Limit:
    """What keeps `plan` from finishing within `hours`: time itself when no concurrency would
    (the governor's climb and one batch's life), else its binding limit."""
    unhindered, _ = finish_seconds(
        episodes=plan.episodes,
        k=plan.episodes_per_run,
        concurrency=plan.concurrency,
        basis=plan.basis,
    )
    if unhindered <= hours * 3600:
        return plan.binding
    return Limit(
        "time to finish", unhindered / 3600, hours, "h",
        "the governor's climb and a batch's life, at any concurrency", headroom=1.0,
    )  # fmt: skip


def least_concurrency(*, episodes: int, hours: float, k: int, basis: PlanBasis) -> Capacity:
    """At K, the least concurrency that finishes within `hours` (the governor's climb counted)
    with no ceiling in the way, judged against the ceilings. Finishing time falls as the
    concurrency rises, so a bisection finds it."""

    def seconds(concurrency: int) -> float:
        return finish_seconds(episodes=episodes, k=k, concurrency=concurrency, basis=basis)[0]

    deadline = hours * 3600
    low = max(1, basis.start)
    high = max(low, math.ceil(episodes * basis.workload.task_seconds(k) / k / deadline))
    while seconds(high) > deadline and high < MAX_CONCURRENCY:
        high *= 2  # the climb and the last batch add to the steady pace's time
    while low < high:
        middle = (low + high) // 2
        if seconds(middle) <= deadline:
            high = middle
        else:
            low = middle + 1
    return capacity(episodes=episodes, k=k, concurrency=low, basis=basis)
