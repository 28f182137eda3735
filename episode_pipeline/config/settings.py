"""Where the pipeline's services are: one `Settings`, built once from the environment.

Production sets the replaced worker's variables (`DB_HOST`, `DB_PORT`, `DB_NAME`, `DB_USER`,
`DB_PASSWORD`, `DB_SSL`, `DB_IAM_AUTH`, `SQS_QUEUE_URL`, ...) plus `DATA_BUCKET` and, for the ECS
transcode, `TRANSCODE_TASK_DEFINITION`, `ECS_CLUSTER`, `ECS_SUBNETS`. The code location reads
them from its environment only (`settings_from_environment`): on a laptop the local stack
supplies that environment (`episode-pipeline dev`, `process`, `status` … export its
`stack.json` first; `eval "$(episode-pipeline stack env)"` does it for a shell), so production
never loads the local-stack package. Every entry point loads the settings once and hands them
down; nothing below reads the environment itself.

Each field declares its variable, default and meaning once (`setting`); docs/configuration.md
lists them all (`python -m episode_pipeline.config` writes the table).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from episode_pipeline.config.env import EnvSettings, setting

DEFAULT_REGION = "us-west-2"  # the replaced worker's region
MiB = 1 << 20
GiB = 1 << 30


def _region() -> str:
    # One declaration for the two groups that need the region (the RDS IAM token signs with it).
    return setting(
        ("AWS_REGION", "AWS_DEFAULT_REGION"),
        "AWS region; AWS_REGION wins over AWS_DEFAULT_REGION.",
        DEFAULT_REGION,
        infra=True,
        stack=True,
    )


@dataclass(frozen=True)
class AwsSettings(EnvSettings):
    """How to reach AWS: the moto server and its keys locally; on AWS the task role signs."""

    region: str = _region()
    endpoint_url: str | None = setting(
        "AWS_ENDPOINT_URL",
        "Service endpoint: the moto server locally, unset on AWS.",
        None,
        stack=True,
    )
    access_key_id: str | None = setting(
        "AWS_ACCESS_KEY_ID", "Only for moto locally; on AWS the task role signs.", None, stack=True
    )
    secret_access_key: str | None = setting(
        "AWS_SECRET_ACCESS_KEY", "Only for moto locally.", None, secret=True, stack=True
    )


@dataclass(frozen=True)
class DatabaseSettings(EnvSettings):
    """The pipeline's PostgreSQL (Aurora on AWS, pgserver locally), and its deadlines.

    Deadlines (docs/faults.md): a dead server, a stuck statement, a lock held by a stuck session,
    or a session left idle inside a transaction ends with a named error. TCP keepalives both
    ways: a vanished peer is noticed within about idle + 30 s.
    """

    host: str = setting(
        "DB_HOST", "Host name, or the Unix socket directory locally.", infra=True, stack=True
    )
    port: int = setting("DB_PORT", "Port.", 5432, infra=True, stack=True)
    name: str = setting("DB_NAME", "Database name.", "postgres", infra=True, stack=True)
    user: str = setting("DB_USER", "User name.", "postgres", infra=True, stack=True)
    password: str | None = setting(
        "DB_PASSWORD", "Password; ignored with DB_IAM_AUTH.", None, secret=True, stack=True
    )
    ssl: bool = setting("DB_SSL", "Require TLS.", False, infra=True, stack=True)
    iam_auth: bool = setting(
        "DB_IAM_AUTH", "Connect with an RDS IAM token instead of a password.", False, infra=True
    )
    region: str = _region()
    connect_timeout_seconds: int = setting(
        "DB_CONNECT_TIMEOUT_SECONDS", "How long opening a connection may take.", 10
    )
    statement_timeout_seconds: int = setting(
        "DB_STATEMENT_TIMEOUT_SECONDS", "Longest statement (a long frames COPY fits).", 900
    )
    lock_timeout_seconds: int = setting(
        "DB_LOCK_TIMEOUT_SECONDS", "Longest wait for a lock held by another session.", 60
    )
    idle_in_transaction_timeout_seconds: int = setting(
        "DB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS",
        "A session idle this long inside a transaction is ended.",
        600,
    )
    keepalive_idle_seconds: int = setting(
        "DB_KEEPALIVE_IDLE_SECONDS", "Idle seconds before TCP keepalives probe the peer.", 30
    )


SUBPROCESS = "subprocess"
ECS = "ecs"
TranscodeMode = Literal["subprocess", "ecs"]


SOURCE_RUNG = "source"  # a ladder rung at the source's own height


class LadderError(ValueError):
    """A ladder setting that names no rung."""


def parse_ladder(text: str) -> tuple[str, ...]:
    """`source,720,480,240` → ("source", "720", "480", "240"); empty or `none`: no ladder."""
    rungs: list[str] = []
    for item in (part.strip().lower().removesuffix("p") for part in text.split(",")):
        if not item or item == "none":
            continue
        if item != SOURCE_RUNG and not (item.isdigit() and int(item) >= 16):
            raise LadderError(
                f"ladder rung {item!r} must be a height in pixels (>= 16) or {SOURCE_RUNG!r}"
            )
        rungs.append(item)
    return tuple(rungs)


def _ladder(text: str) -> tuple[str, ...]:
    try:
        return parse_ladder(text)
    except LadderError as error:
        raise RuntimeError(f"TRANSCODE_LADDER: {error}") from None


# x264 preset of both the baseline and the ladder: timings in docs/platform-notes.md#ffmpeg.
_PRESET = "veryfast"


@dataclass(frozen=True)
class VideoSettings(EnvSettings):
    """What the transcode program makes of each camera, and how long FFmpeg may take for it.

    Sent to the transcode process with its job (docs/contract.md#hls-renditions).
    """

    preset: str = setting(
        "TRANSCODE_PRESET", "x264 preset of the baseline `playlist.m3u8`.", _PRESET
    )
    ladder: tuple[str, ...] = setting(
        "TRANSCODE_LADDER",
        "The adaptive ladder's rung heights, `source` for the source's own; rungs above the "
        "source are dropped; empty or `none`: baseline only. Its cost on a 640x480 camera is in "
        "benchmarks/README.md.",
        ("source", "720", "480", "240"),
        parse=_ladder,
    )
    ladder_preset: str = setting(
        "TRANSCODE_LADDER_PRESET", "x264 preset of the ladder's rungs.", _PRESET
    )
    ffmpeg: str | None = setting(
        "TRANSCODE_FFMPEG", "The FFmpeg binary (unset: imageio-ffmpeg's bundled one).", None
    )
    ffmpeg_deadline_base_seconds: float = setting(
        "TRANSCODE_FFMPEG_DEADLINE_BASE_SECONDS",
        "One FFmpeg invocation may run this long plus the per-source-second allowance.",
        120.0,
    )
    ffmpeg_deadline_per_source_second: float = setting(
        "TRANSCODE_FFMPEG_DEADLINE_PER_SOURCE_SECOND",
        "Seconds one FFmpeg invocation may add per second of the camera's source.",
        10.0,
    )
    probe_deadline_seconds: float = setting(
        "TRANSCODE_PROBE_DEADLINE_SECONDS", "How long probing one source may take.", 60.0
    )
    camera_workers: int | None = setting(
        "TRANSCODE_CAMERA_WORKERS", "Cameras transcoded at once (unset: the process's CPUs).", None
    )

    def ffmpeg_deadline(self, source_seconds: float) -> float:
        """Seconds one FFmpeg invocation may run for `source_seconds` of a camera's video."""
        return self.ffmpeg_deadline_base_seconds + (
            self.ffmpeg_deadline_per_source_second * max(0.0, source_seconds)
        )


@dataclass(frozen=True)
class TranscodeSettings(EnvSettings):
    """Where FFmpeg runs: a subprocess of the run (by default, here and on AWS: one cold start
    per episode) or an ECS task of its own (`ecs`, for archives over a size threshold).

    `TRANSCODE_TASK_DEFINITION` (infra/ecs.tf sets it) makes the ECS task available; the uploads
    sensor sends an episode there when its archive is larger than TRANSCODE_TASK_ABOVE_BYTES
    and says so in the run's tags (`transcode.placement`). All cameras of an episode go to one
    transcode process.
    """

    task_definition: str | None = setting(
        "TRANSCODE_TASK_DEFINITION",
        "The ECS task definition of the transcode task, for runs tagged "
        "`episode_pipeline/transcoder=ecs`; unset: every run transcodes in a subprocess.",
        None,
        infra=True,
    )
    ecs_cluster: str | None = setting(
        "ECS_CLUSTER", "The ECS cluster (needed with TRANSCODE_TASK_DEFINITION).", None, infra=True
    )
    ecs_subnets: tuple[str, ...] = setting(
        "ECS_SUBNETS",
        "The task's private subnets, comma-separated (needed with TRANSCODE_TASK_DEFINITION).",
        (),
        infra=True,
    )
    ecs_security_groups: tuple[str, ...] = setting(
        "ECS_SECURITY_GROUPS", "The task's security groups, comma-separated.", (), infra=True
    )
    container_name: str = setting(
        "TRANSCODE_CONTAINER_NAME",
        "The container of the task definition.",
        "transcode",
        infra=True,
    )
    video: VideoSettings = field(default_factory=VideoSettings)
    deadline_seconds: float | None = setting(
        "TRANSCODE_DEADLINE_SECONDS",
        "How long the whole transcode (one subprocess or ECS task) may run before it is killed "
        "or stopped; unset: 600 s for the task to start and move files, plus every camera's "
        "FFmpeg deadline one after another.",
        None,
    )
    max_vcpu: int = setting(
        "TRANSCODE_MAX_VCPU",
        "The largest ECS task an episode gets, run or transcode task (1 vCPU per camera or per "
        "128 MiB of archive, a Fargate size of 1, 2, 4, 8 or 16 vCPU with 2 GiB per vCPU).",
        4,
    )
    step_retries: int = setting(
        "TRANSCODE_STEP_RETRIES",
        "How many more times `hls_renditions` is tried after an infrastructure error (S3 failing "
        "once botocore's retries ran out, the transcode process dying, stopped or past its "
        "deadline); after the last the run fails naming the cause. A video's own bad content "
        "is not retried.",
        3,
    )
    step_retry_seconds: float = setting(
        "TRANSCODE_STEP_RETRY_SECONDS",
        "The wait before the first of those retries, doubled for each next one; a Retry-After "
        "S3 (or ECS) sent is waited instead; either at most 300 s.",
        30.0,
    )
    task_above_bytes: int | None = setting(
        "TRANSCODE_TASK_ABOVE_BYTES",
        "Archives larger than this many bytes transcode in an ECS task of their own (a second "
        "cold start; docs/deploy-aws.md#cold-starts); unset: every run transcodes in its own task.",
        None,
        infra=True,
    )

    def __post_init__(self) -> None:
        if self.task_definition and not (self.ecs_cluster and self.ecs_subnets):
            raise RuntimeError(
                "missing environment variable(s) ECS_CLUSTER, ECS_SUBNETS: "
                "TRANSCODE_TASK_DEFINITION is set, and the ECS transcode needs them"
            )

    @property
    def preset(self) -> str:
        return self.video.preset


@dataclass(frozen=True)
class S3Deadlines(EnvSettings):
    """How long one S3 call may wait and how often it is tried.

    botocore's standard retry mode retries throttling, 5xx and connection errors with exponential
    backoff and jitter.
    """

    connect_timeout_seconds: float = setting(
        "S3_CONNECT_TIMEOUT_SECONDS", "How long opening a connection to S3 may take.", 10.0
    )
    read_timeout_seconds: float = setting(
        "S3_READ_TIMEOUT_SECONDS", "The longest wait for the next bytes of a response.", 60.0
    )
    max_attempts: int = setting(
        "S3_MAX_ATTEMPTS", "Tries per call (the first included), backing off between them.", 5
    )


@dataclass(frozen=True)
class QueueSettings(EnvSettings):
    """How long an upload message stays hidden while its run works, and how often it is renewed."""

    visibility_timeout_seconds: int = setting(
        "SQS_VISIBILITY_TIMEOUT_SECONDS",
        "The queue's own visibility timeout (infra/queue.tf); the heartbeat sets a message's back "
        "to it.",
        900,
    )
    heartbeat_seconds: int = setting(
        "SQS_HEARTBEAT_SECONDS",
        "How often a running upload's message is hidden again; well below the timeout.",
        240,
    )

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_seconds < self.visibility_timeout_seconds:
            raise RuntimeError(
                f"SQS_HEARTBEAT_SECONDS={self.heartbeat_seconds} must be below "
                f"SQS_VISIBILITY_TIMEOUT_SECONDS={self.visibility_timeout_seconds}"
            )


@dataclass(frozen=True)
class ReconcileSettings(EnvSettings):
    """What the reconciliation sensors consider lost (docs/contract.md#reconciliation)."""

    lost_upload_after_seconds: int = setting(
        "RECONCILE_LOST_UPLOAD_AFTER_SECONDS",
        "An archive with no run since it was written is lost once it is this old: past the "
        "queue's 15-minute visibility timeout plus a queued run's wait.",
        45 * 60,
    )
    episodes_per_tick: int = setting(
        "RECONCILE_EPISODES_PER_TICK",
        "The fewest episodes the walk of every episode visits per tick; the next tick goes on "
        "after the last one.",
        200,
    )
    stale_processing_after_seconds: int = setting(
        "RECONCILE_STALE_PROCESSING_AFTER_SECONDS",
        "An episode `processing` this long after its last change with no run alive becomes "
        "`failed`.",
        10 * 60,
    )
    walk_cycle_seconds: int = setting(
        "RECONCILE_WALK_CYCLE_SECONDS",
        "The walk of every episode is sized so the whole table is visited once in this time "
        "(a lost re-upload of a processed episode).",
        24 * 3600,
    )
    pending_per_tick: int = setting(
        "RECONCILE_PENDING_PER_TICK",
        "Never-processed episodes (status `uploaded`) one tick visits, by a cursor of their own.",
        1_000,
    )
    pending_lookback_seconds: int = setting(
        "RECONCILE_PENDING_LOOKBACK_SECONDS",
        "Never-processed episodes changed longer ago than this are left to the full walk.",
        2 * 24 * 3600,
    )
    s3_requests_per_hour: int = setting(
        "RECONCILE_S3_REQUESTS_PER_HOUR",
        "The most S3 requests reconciliation makes in an hour; the walk's page shrinks to fit.",
        120_000,
    )
    interval_seconds: int = setting(
        "RECONCILE_INTERVAL_SECONDS", "Between two ticks of the `waiting_uploads` sensor.", 300
    )


@dataclass(frozen=True)
class RetentionSettings(EnvSettings):
    """How long Dagster keeps an episode's runs, events and partition (docs/retention.md)."""

    episode_days: float = setting(
        "RETENTION_EPISODE_DAYS",
        "An episode whose latest run succeeded this long ago, with no run in flight and no newer "
        "upload waiting, loses its runs, event logs, check results and dynamic partition "
        "(~10,000 live partitions at 10,000 uploads a day: the UI's pages within 3 s during a "
        "campaign, docs/retention.md).",
        1.0,
    )
    failed_episode_days: float = setting(
        "RETENTION_FAILED_EPISODE_DAYS",
        "The same for an episode whose latest run failed: its message can sit 4 days on the "
        "queue and 14 in the dead-letter queue.",
        19.0,
    )
    upload_record_days: float = setting(
        "RETENTION_UPLOAD_RECORD_DAYS",
        "How long the record of a pruned upload's success is kept, so a redelivery or a redrive "
        "of its message is deleted, not run again.",
        21.0,
    )
    episodes_per_tick: int = setting(
        "RETENTION_EPISODES_PER_TICK",
        "The most episodes one retention tick prunes, in batched statements of 500.",
        5_000,
    )

    def __post_init__(self) -> None:
        if not self.episode_days <= self.failed_episode_days <= self.upload_record_days:
            raise RuntimeError(
                f"RETENTION_EPISODE_DAYS={self.episode_days} <= RETENTION_FAILED_EPISODE_DAYS="
                f"{self.failed_episode_days} <= RETENTION_UPLOAD_RECORD_DAYS="
                f"{self.upload_record_days} must hold"
            )


@dataclass(frozen=True)
class CampaignSettings(EnvSettings):
    """How a reprocessing campaign is paced (docs/operations.md#reprocess-the-fleet). `campaign
    start` copies them onto the campaign; the driver's tick interval is read where it runs."""

    tick_seconds: int = setting(
        "CAMPAIGN_TICK_SECONDS", "Between two ticks of the `campaign_driver` sensor.", 30
    )
    wave_size: int = setting(
        "CAMPAIGN_WAVE_SIZE",
        "The most episodes one wave (one backfill) claims: the driver claims at most a wave a "
        "tick, 33 episodes/s at 1,000 every 30 s (a million a day needs ~12).",
        1_000,
    )
    max_live_partitions: int = setting(
        "CAMPAIGN_MAX_LIVE_PARTITIONS",
        "The most partitions a campaign has added and not yet pruned, its claimed episodes "
        "included (about twice its runs at once times K): the live count stays within the "
        "retention window plus this (docs/scale.md#a-million-episodes-in-a-day).",
        25_000,
    )
    episodes_per_run: int = setting(
        "CAMPAIGN_EPISODES_PER_RUN",
        "K: episodes one campaign run processes, one cold start and one run-queue launch for "
        "them all: 25 keeps a million a day at 0.62 runs/s, within the run queue's ~0.79 "
        "(docs/scale.md#a-million-episodes-in-a-day).",
        25,
    )
    concurrency_start: int = setting(
        "CAMPAIGN_CONCURRENCY_START",
        "Campaign runs launched at once at the start (the governor's).",
        4,
    )
    concurrency_min: int = setting(
        "CAMPAIGN_CONCURRENCY_MIN", "The fewest the governor halves down to.", 1
    )
    concurrency_max: int = setting(
        "CAMPAIGN_CONCURRENCY_MAX",
        "The most the governor adds up to; the run queue's `episode_pipeline/campaign` limit "
        "caps it too (dagster.yaml): 340 batch tasks of K=25 settle a million short episodes in "
        "a day (docs/scale.md#a-million-episodes-in-a-day).",
        340,
    )
    increase_after: int = setting(
        "CAMPAIGN_INCREASE_AFTER", "Successes in a row before the governor adds one run.", 20
    )
    pause_seconds: float = setting(
        "CAMPAIGN_PAUSE_SECONDS", "The pause after backpressure that gave no Retry-After.", 60.0
    )
    max_pause_seconds: float = setting(
        "CAMPAIGN_MAX_PAUSE_SECONDS",
        "The longest pause a throttle's Retry-After may ask of the governor (it is capped here).",
        900.0,
    )
    failure_window: int = setting(
        "CAMPAIGN_FAILURE_WINDOW", "Finished runs the failure rate is measured over.", 20
    )
    max_failure_rate: float = setting(
        "CAMPAIGN_MAX_FAILURE_RATE", "A failure rate above this halves and pauses.", 0.5
    )
    max_attempts: int = setting(
        "CAMPAIGN_MAX_ATTEMPTS", "Runs of one episode before it is `rejected`.", 3
    )
    retry_base_seconds: float = setting(
        "CAMPAIGN_RETRY_BASE_SECONDS",
        "A failed episode waits this, doubled per attempt (with jitter), before a retry.",
        60.0,
    )
    stale_claim_seconds: float = setting(
        "CAMPAIGN_STALE_CLAIM_SECONDS",
        "A claimed episode with no run of its wave after this long: the wave's backfill, if"
        " still requested, is canceled, and the claim goes back to `pending` (an attempt) once"
        " it has ended.",
        1800.0,
    )
    canary_episodes: int = setting(
        "CAMPAIGN_CANARY_EPISODES", "The first (canary) wave's size at most.", 50
    )
    canary_fraction: float = setting(
        "CAMPAIGN_CANARY_FRACTION", "... or this share of the selection, the smaller.", 0.01
    )
    canary_seconds_tolerance: float = setting(
        "CAMPAIGN_CANARY_SECONDS_TOLERANCE",
        "A camera's duration may move this much before the canary stops the campaign.",
        0.5,
    )
    canary_frame_rows_tolerance: int = setting(
        "CAMPAIGN_CANARY_FRAME_ROWS_TOLERANCE", "Frame rows may differ by this much.", 0
    )
    # What `campaign plan` holds a campaign to and prices it at (campaign/capacity.py,
    # docs/scale.md#a-million-episodes-in-a-day).
    fargate_vcpu_quota: int = setting(
        "CAMPAIGN_FARGATE_VCPU_QUOTA",
        "`campaign plan`: the vCPUs campaign tasks may run at once, within the account's Fargate "
        "On-Demand vCPU quota in the region (Service Quotas, `Fargate On-Demand vCPU resource "
        "count`, shared with the uploads' runs and the services). 1,000 is this plan's "
        "assumption, not AWS's default (new accounts start lower): read yours.",
        1_000,
    )
    db_connections: int = setting(
        "CAMPAIGN_DB_CONNECTIONS",
        "`campaign plan`: the database connections campaign run tasks may hold together, 4 each "
        "(measured: three Dagster storages and the pipeline's). Aurora PostgreSQL's "
        "max_connections is LEAST(memory / 9,531,392, 5,000): ~3,600 on a 32 GiB db.r6g.xlarge, "
        "less ~600 for the daemon, webserver, code server and uploads' runs; on a 16 GiB "
        "db.r6g.large (~1,800) set 1,200.",
        2_000,
    )
    fargate_vcpu_hour_usd: float = setting(
        "CAMPAIGN_FARGATE_VCPU_HOUR_USD",
        "`campaign plan`'s price of a Fargate vCPU-hour, USD: AWS's list price for Linux/x86 "
        "On-Demand in us-east-1 and us-west-2 as of December 2026 (aws.amazon.com/fargate/"
        "pricing); set your region's or your discounted one.",
        0.04048,
    )
    fargate_gb_hour_usd: float = setting(
        "CAMPAIGN_FARGATE_GB_HOUR_USD",
        "`campaign plan`'s price of a Fargate GB-hour of memory, USD: the same list price (Linux/"
        "x86, December 2026).",
        0.004445,
    )
    s3_put_per_1000_usd: float = setting(
        "CAMPAIGN_S3_PUT_PER_1000_USD",
        "`campaign plan`'s price of 1,000 S3 PUT/COPY/POST/LIST requests, USD: S3 Standard's list "
        "price as of December 2026 (aws.amazon.com/s3/pricing).",
        0.005,
    )
    s3_get_per_1000_usd: float = setting(
        "CAMPAIGN_S3_GET_PER_1000_USD",
        "`campaign plan`'s price of 1,000 S3 GET/HEAD requests, USD: S3 Standard's list price as "
        "of December 2026.",
        0.0004,
    )


@dataclass(frozen=True)
class MetricsSettings(EnvSettings):
    """The CloudWatch metrics every process writes to stdout (runtime/metrics.py)."""

    deployment: str = setting(
        "METRICS_DEPLOYMENT",
        "The `Deployment` dimension of every metric: the deployment's name prefix (Terraform's "
        "`local.prefix`).",
        "local",
        infra=True,
    )
    output: str = setting(
        "METRICS_OUTPUT",
        "`stdout`: the metric lines go to standard output (the awslogs driver ships them); "
        "`off`: nowhere (`process` and `check` default to it: a terminal is no log stream); "
        "an absolute path: appended to that file (`dev` and `demo`: `<stack>/metrics.jsonl`).",
        "stdout",
    )

    def __post_init__(self) -> None:
        if self.output not in METRICS_OUTPUTS and not self.metrics_file:
            raise RuntimeError(
                f"METRICS_OUTPUT={self.output!r} is not one of {', '.join(METRICS_OUTPUTS)}, "
                "nor an absolute file path"
            )

    @property
    def metrics_file(self) -> str | None:
        """The file the lines are appended to, when the output names one."""
        return self.output if os.path.isabs(self.output) else None


METRICS_OUTPUTS = ("stdout", "off")
# What the interactive commands set unless the variable is exported (commands/process.py).
METRICS_OUTPUT_ENV = "METRICS_OUTPUT"


@dataclass(frozen=True)
class HealthSettings(EnvSettings):
    """When `episode-pipeline health` says unhealthy (docs/operations.md#is-it-healthy)."""

    window_seconds: int = setting(
        "HEALTH_WINDOW_SECONDS",
        "The recent past health reports on: throughput, latency, failures.",
        3600,
    )
    failure_rate: float = setting(
        "HEALTH_MAX_FAILURE_RATE",
        "Unhealthy above this share of failed episode runs in the window.",
        0.2,
    )
    failure_rate_min_failed: int = setting(
        "HEALTH_FAILURE_RATE_MIN_FAILED",
        "The failure rate counts only from this many failed runs in the window (one bad upload "
        "of two is not an outage).",
        3,
    )
    sensor_failure_streak: int = setting(
        "HEALTH_SENSOR_FAILURE_STREAK",
        "Unhealthy when a sensor's latest ticks failed this many times in a row.",
        3,
    )
    daemon_heartbeat_seconds: int = setting(
        "HEALTH_DAEMON_HEARTBEAT_SECONDS",
        "The sensor daemon counts as stopped once its heartbeat is this old: unhealthy while "
        "uploads wait.",
        120,
    )
    oldest_upload_seconds: int = setting(
        "HEALTH_OLDEST_UPLOAD_SECONDS",
        "Unhealthy when the oldest upload waiting (a message or a queued run) is this old.",
        1800,
    )


@dataclass(frozen=True)
class ArchiveLimits(EnvSettings):
    """Per-episode ceilings that stop a hostile or broken upload early, with a named error.

    Defaults are generous for robot episodes (a long multi-camera episode is a few GB; its
    videos barely compress, its parquets 3-10x).
    """

    max_member_bytes: int = setting(
        "ARCHIVE_MAX_MEMBER_BYTES", "Largest member of the archive (20 GiB).", 20 * GiB
    )
    max_total_bytes: int = setting(
        "ARCHIVE_MAX_TOTAL_BYTES", "Largest decompressed tar stream (100 GiB).", 100 * GiB
    )
    max_members: int = setting("ARCHIVE_MAX_MEMBERS", "Most entries in the archive.", 100_000)
    max_ratio: float = setting(
        "ARCHIVE_MAX_RATIO", "Largest decompressed / compressed bytes.", 200.0
    )
    ratio_grace_bytes: int = setting(
        "ARCHIVE_RATIO_GRACE_BYTES",
        "Decompressed bytes before the ratio is checked (64 MiB).",
        64 * MiB,
    )
    max_path_depth: int = setting("ARCHIVE_MAX_PATH_DEPTH", "Deepest member path (folders).", 32)
    max_path_bytes: int = setting(
        "ARCHIVE_MAX_PATH_BYTES",
        "Longest member path, so the processed key stays under S3's 1,024 bytes.",
        512,
    )
    max_metadata_bytes: int = setting(
        "ARCHIVE_MAX_METADATA_BYTES",
        "Largest file read into memory: `meta/info.json` and the other metadata (16 MiB).",
        16 * MiB,
    )


@dataclass(frozen=True)
class Settings(EnvSettings):
    """Everything the pipeline reads from its environment, group by group."""

    bucket: str = setting(
        "DATA_BUCKET",
        "The data bucket: uploads, processed files and the assets' stored outputs.",
        infra=True,
        stack=True,
    )
    aws: AwsSettings
    database: DatabaseSettings
    sqs_queue_url: str | None = setting(
        "SQS_QUEUE_URL",
        "The queue the data bucket notifies of uploads; unset leaves the upload sensors idle.",
        None,
        infra=True,
        stack=True,
    )
    dlq_url: str | None = setting(
        "SQS_DLQ_URL", "The upload queue's dead-letter queue.", None, infra=True, stack=True
    )
    transcode: TranscodeSettings = field(default_factory=TranscodeSettings)
    s3_deadlines: S3Deadlines = field(default_factory=S3Deadlines)
    queue: QueueSettings = field(default_factory=QueueSettings)
    reconcile: ReconcileSettings = field(default_factory=ReconcileSettings)
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    campaign: CampaignSettings = field(default_factory=CampaignSettings)
    archive_limits: ArchiveLimits = field(default_factory=ArchiveLimits)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    health: HealthSettings = field(default_factory=HealthSettings)
    sync_check_blocking: bool = setting(
        "SYNC_CHECK_BLOCKING",
        "`video_frames_in_sync` fails as ERROR and blocks the episode row (docs/sync.md); "
        "unset, it only warns.",
        False,
    )
    ui_url: str = setting(
        "DAGSTER_UI_URL",
        "Where the Dagster UI is, for the run links `episode-pipeline status` prints.",
        "http://127.0.0.1:3000",
    )
    viewer_url: str | None = setting(
        "VIEWER_URL",
        "Where an episode viewer serves every episode (`episode-pipeline dev` runs one at "
        "http://127.0.0.1:3001): the `episode` asset and `status` link to the episode's page "
        "there. Unset, they give the `episode-pipeline view ORG/EP` command instead.",
        None,
    )


def settings_from_environment(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings from this process's environment (or `environ`): production's variables, or
    the local stack's that a command exported. A missing variable is a named error."""
    return Settings.from_env(os.environ if environ is None else environ)
