"""Where the pipeline's services are: one `Settings`, built once from the environment.

Production sets the replaced worker's variables (`DB_HOST`, `DB_PORT`, `DB_NAME`, `DB_USER`,
`DB_PASSWORD`, `DB_SSL`, `DB_IAM_AUTH`, `SQS_QUEUE_URL`, ...) plus `DATA_BUCKET` and, for the ECS
transcode, `TRANSCODE_TASK_DEFINITION`, `ECS_CLUSTER`, `ECS_SUBNETS`. On a laptop nobody exports
anything: when `DB_HOST` is unset, the embedded stack's `stack.json` (written by
`episode-pipeline stack up`) supplies the same variables, so `dagster dev`, `dagster asset
materialize` and the CLI reach the same services. Every entry point calls `load_settings()` once
and hands the result down; nothing below reads the environment itself.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

HOME_ENV = "EPISODE_PIPELINE_HOME"
DEFAULT_HOME = ".episode_pipeline"
STACK_STATE_FILE = "stack.json"
DEFAULT_REGION = "us-west-2"  # the replaced worker's region
DEFAULT_PRESET = "veryfast"  # x264 preset: timings in docs/platform-notes.md#ffmpeg
# Rung heights of the adaptive ladder: its cost on a 640x480 camera is in benchmarks/README.md.
DEFAULT_LADDER = ("source", "720", "480", "240")


def pipeline_home() -> Path:
    """The one directory holding all local state (database, moto state, Dagster instance).

    `EPISODE_PIPELINE_HOME`, else the home whose Dagster instance `DAGSTER_HOME` names (so
    `dagster asset materialize` with the local DAGSTER_HOME works from any directory), else
    `.episode_pipeline` in the working directory.
    """
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).resolve()
    dagster_home = os.environ.get("DAGSTER_HOME")
    if dagster_home and (Path(dagster_home).parent / STACK_STATE_FILE).exists():
        return Path(dagster_home).parent.resolve()
    return Path(DEFAULT_HOME).resolve()


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def _require(env: Mapping[str, str], names: tuple[str, ...], why: str) -> None:
    missing = [name for name in names if not env.get(name)]
    if missing:
        raise RuntimeError(f"missing environment variable(s) {', '.join(missing)}: {why}")


def _list(value: str | None) -> tuple[str, ...]:
    return tuple(item.strip() for item in (value or "").split(",") if item.strip())


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    """A positive number from the environment, else `default`; a bad value names the variable."""
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise RuntimeError(f"{name}={raw!r} is not a number") from None
    if value <= 0:
        raise RuntimeError(f"{name}={raw!r} must be greater than 0")
    return value


def _whole(env: Mapping[str, str], name: str, default: int) -> int:
    return int(_number(env, name, default))


@dataclass(frozen=True)
class AwsSettings:
    """How to reach AWS: the moto server and its keys locally; on AWS the task role signs."""

    region: str = DEFAULT_REGION
    endpoint_url: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AwsSettings:
        return cls(
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or DEFAULT_REGION,
            endpoint_url=env.get("AWS_ENDPOINT_URL") or None,
            access_key_id=env.get("AWS_ACCESS_KEY_ID") or None,
            secret_access_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
        )

    def to_env(self) -> dict[str, str]:
        """The variables `from_env` reads: what a child process needs to reach the same AWS."""
        env = {"AWS_REGION": self.region, "AWS_DEFAULT_REGION": self.region}
        if self.endpoint_url:
            env["AWS_ENDPOINT_URL"] = self.endpoint_url
        if self.access_key_id:
            env["AWS_ACCESS_KEY_ID"] = self.access_key_id
        if self.secret_access_key:
            env["AWS_SECRET_ACCESS_KEY"] = self.secret_access_key
        return env


@dataclass(frozen=True)
class DatabaseSettings:
    host: str
    port: int = 5432
    name: str = "postgres"
    user: str = "postgres"
    password: str | None = None
    ssl: bool = False
    iam_auth: bool = False
    region: str = DEFAULT_REGION  # for the RDS IAM token
    # Deadlines (docs/faults.md): a dead server, a stuck statement, a lock held by a stuck
    # session, or a session left idle inside a transaction ends with a named error.
    connect_timeout_seconds: int = 10  # DB_CONNECT_TIMEOUT_SECONDS
    statement_timeout_seconds: int = 900  # DB_STATEMENT_TIMEOUT_SECONDS: a long frames COPY fits
    lock_timeout_seconds: int = 60  # DB_LOCK_TIMEOUT_SECONDS
    idle_in_transaction_timeout_seconds: int = 600  # DB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS
    # TCP keepalives both ways: a vanished peer is noticed within about idle + 30 s (a killed
    # worker's locks are released, a run does not wait forever on a server that is gone).
    keepalive_idle_seconds: int = 30  # DB_KEEPALIVE_IDLE_SECONDS

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> DatabaseSettings:
        return cls(
            host=env["DB_HOST"],
            port=int(env.get("DB_PORT", "5432")),
            name=env.get("DB_NAME", "postgres"),
            user=env.get("DB_USER", "postgres"),
            password=env.get("DB_PASSWORD") or None,
            ssl=_flag(env.get("DB_SSL")),
            iam_auth=_flag(env.get("DB_IAM_AUTH")),
            region=AwsSettings.from_env(env).region,
            connect_timeout_seconds=_whole(env, "DB_CONNECT_TIMEOUT_SECONDS", 10),
            statement_timeout_seconds=_whole(env, "DB_STATEMENT_TIMEOUT_SECONDS", 900),
            lock_timeout_seconds=_whole(env, "DB_LOCK_TIMEOUT_SECONDS", 60),
            idle_in_transaction_timeout_seconds=_whole(
                env, "DB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS", 600
            ),
            keepalive_idle_seconds=_whole(env, "DB_KEEPALIVE_IDLE_SECONDS", 30),
        )


SUBPROCESS = "subprocess"
ECS = "ecs"
TranscodeMode = Literal["subprocess", "ecs"]


@dataclass(frozen=True)
class VideoSettings:
    """What the transcode program makes of each camera, and how long FFmpeg may take for it.

    Sent to the transcode process with its job (docs/contract.md#hls-renditions). Env:

    - TRANSCODE_PRESET (`veryfast`): x264 preset of the baseline `playlist.m3u8`;
    - TRANSCODE_LADDER (`source,720,480,240`): the adaptive ladder's rung heights, `source` for
      the source's own; rungs above the source are dropped; empty or `none`: baseline only;
    - TRANSCODE_LADDER_PRESET (`veryfast`): x264 preset of the ladder's rungs;
    - TRANSCODE_FFMPEG: the FFmpeg binary (default: imageio-ffmpeg's bundled one);
    - TRANSCODE_FFMPEG_DEADLINE_BASE_SECONDS (120) + TRANSCODE_FFMPEG_DEADLINE_PER_SOURCE_SECOND
      (10) x the camera's source seconds: how long one FFmpeg invocation may run;
    - TRANSCODE_PROBE_DEADLINE_SECONDS (60): how long probing one source may take;
    - TRANSCODE_CAMERA_WORKERS: cameras transcoded at once (default: the process's CPUs).
    """

    preset: str = DEFAULT_PRESET
    ladder: tuple[str, ...] = DEFAULT_LADDER
    ladder_preset: str = DEFAULT_PRESET
    ffmpeg: str | None = None
    ffmpeg_deadline_base_seconds: float = 120.0
    ffmpeg_deadline_per_source_second: float = 10.0
    probe_deadline_seconds: float = 60.0
    camera_workers: int | None = None

    def ffmpeg_deadline(self, source_seconds: float) -> float:
        """Seconds one FFmpeg invocation may run for `source_seconds` of a camera's video."""
        return self.ffmpeg_deadline_base_seconds + (
            self.ffmpeg_deadline_per_source_second * max(0.0, source_seconds)
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> VideoSettings:
        from episode_pipeline.video.ladder import LadderError, parse_ladder

        defaults = cls()
        try:
            ladder = parse_ladder(env.get("TRANSCODE_LADDER", ",".join(DEFAULT_LADDER)))
        except LadderError as error:
            raise RuntimeError(f"TRANSCODE_LADDER: {error}") from None
        workers = env.get("TRANSCODE_CAMERA_WORKERS")
        return cls(
            preset=env.get("TRANSCODE_PRESET") or DEFAULT_PRESET,
            ladder=ladder,
            ladder_preset=env.get("TRANSCODE_LADDER_PRESET") or DEFAULT_PRESET,
            ffmpeg=env.get("TRANSCODE_FFMPEG") or None,
            ffmpeg_deadline_base_seconds=_number(
                env,
                "TRANSCODE_FFMPEG_DEADLINE_BASE_SECONDS",
                defaults.ffmpeg_deadline_base_seconds,
            ),
            ffmpeg_deadline_per_source_second=_number(
                env,
                "TRANSCODE_FFMPEG_DEADLINE_PER_SOURCE_SECOND",
                defaults.ffmpeg_deadline_per_source_second,
            ),
            probe_deadline_seconds=_number(
                env, "TRANSCODE_PROBE_DEADLINE_SECONDS", defaults.probe_deadline_seconds
            ),
            camera_workers=_whole(env, "TRANSCODE_CAMERA_WORKERS", 1) if workers else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, for the transcode job."""
        return {**asdict(self), "ladder": list(self.ladder)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VideoSettings:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        return cls(**{**values, "ladder": tuple(values.get("ladder", DEFAULT_LADDER))})


@dataclass(frozen=True)
class TranscodeSettings:
    """Where FFmpeg runs: a subprocess of the run (laptop, tests) or an ECS task (production).

    ECS mode is chosen by `TRANSCODE_TASK_DEFINITION` (infra/ecs.tf sets it on the run task).
    All cameras of an episode go to one transcode process. Env:

    - TRANSCODE_DEADLINE_SECONDS: how long the whole transcode (one subprocess or ECS task) may
      run before it is killed (subprocess) or stopped (ECS); default: 600 s for the task to
      start and move files, plus every camera's FFmpeg deadline one after another;
    - TRANSCODE_MAX_VCPU (4): the largest ECS task an episode gets (1 vCPU per camera, a
      Fargate size of 1, 2, 4, 8 or 16 vCPU with 2 GiB per vCPU).
    """

    mode: TranscodeMode = SUBPROCESS
    ecs_cluster: str | None = None
    ecs_subnets: tuple[str, ...] = field(default_factory=tuple)
    ecs_security_groups: tuple[str, ...] = field(default_factory=tuple)
    task_definition: str | None = None
    container_name: str = "transcode"
    video: VideoSettings = field(default_factory=VideoSettings)
    deadline_seconds: float | None = None
    max_vcpu: int = 4

    @property
    def preset(self) -> str:
        return self.video.preset

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TranscodeSettings:
        common: dict[str, Any] = {
            "video": VideoSettings.from_env(env),
            "deadline_seconds": (
                _number(env, "TRANSCODE_DEADLINE_SECONDS", 1.0)
                if env.get("TRANSCODE_DEADLINE_SECONDS")
                else None
            ),
            "max_vcpu": _whole(env, "TRANSCODE_MAX_VCPU", 4),
        }
        if not env.get("TRANSCODE_TASK_DEFINITION"):
            return cls(mode=SUBPROCESS, **common)
        _require(
            env,
            ("ECS_CLUSTER", "ECS_SUBNETS"),
            "TRANSCODE_TASK_DEFINITION is set, and the ECS transcode needs a cluster and subnets",
        )
        return cls(
            mode=ECS,
            ecs_cluster=env["ECS_CLUSTER"],
            ecs_subnets=_list(env.get("ECS_SUBNETS")),
            ecs_security_groups=_list(env.get("ECS_SECURITY_GROUPS")),
            task_definition=env["TRANSCODE_TASK_DEFINITION"],
            container_name=env.get("TRANSCODE_CONTAINER_NAME") or "transcode",
            **common,
        )


@dataclass(frozen=True)
class S3Deadlines:
    """How long one S3 call may wait and how often it is tried.

    botocore's standard retry mode retries throttling, 5xx and connection errors with exponential
    backoff and jitter; `max_attempts` counts the first try. Env: S3_CONNECT_TIMEOUT_SECONDS,
    S3_READ_TIMEOUT_SECONDS (the longest wait for the next bytes of a response), S3_MAX_ATTEMPTS.
    """

    connect_timeout_seconds: float = 10.0
    read_timeout_seconds: float = 60.0
    max_attempts: int = 5

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> S3Deadlines:
        return cls(
            connect_timeout_seconds=_number(env, "S3_CONNECT_TIMEOUT_SECONDS", 10.0),
            read_timeout_seconds=_number(env, "S3_READ_TIMEOUT_SECONDS", 60.0),
            max_attempts=_whole(env, "S3_MAX_ATTEMPTS", 5),
        )


@dataclass(frozen=True)
class QueueSettings:
    """How long an upload message stays hidden while its run works, and how often that is renewed.

    `visibility_timeout_seconds` is the queue's own (infra/queue.tf: 900); the heartbeat sets it
    back to that value every `heartbeat_seconds`, which must be well below it. Env:
    SQS_VISIBILITY_TIMEOUT_SECONDS, SQS_HEARTBEAT_SECONDS.
    """

    visibility_timeout_seconds: int = 900
    heartbeat_seconds: int = 240

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_seconds < self.visibility_timeout_seconds:
            raise RuntimeError(
                f"SQS_HEARTBEAT_SECONDS={self.heartbeat_seconds} must be below "
                f"SQS_VISIBILITY_TIMEOUT_SECONDS={self.visibility_timeout_seconds}"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> QueueSettings:
        return cls(
            visibility_timeout_seconds=_whole(env, "SQS_VISIBILITY_TIMEOUT_SECONDS", 900),
            heartbeat_seconds=_whole(env, "SQS_HEARTBEAT_SECONDS", 240),
        )


@dataclass(frozen=True)
class ReconcileSettings:
    """What the reconciliation sensors consider lost (docs/contract.md#reconciliation).

    - `lost_upload_after_seconds` (RECONCILE_LOST_UPLOAD_AFTER_SECONDS, 45 min): an archive with
      no run since it was written is lost once it is this old — past the queue's 15-minute
      visibility timeout plus a queued run's wait.
    - `episodes_per_tick` (RECONCILE_EPISODES_PER_TICK): how many episodes one tick looks at;
      the next tick goes on after the last one, so every episode is visited in turn.
    - `stale_processing_after_seconds` (RECONCILE_STALE_PROCESSING_AFTER_SECONDS, 10 min): an
      episode `processing` this long after its last change with no run alive becomes `failed`.
    """

    lost_upload_after_seconds: int = 45 * 60
    episodes_per_tick: int = 200
    stale_processing_after_seconds: int = 10 * 60

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ReconcileSettings:
        return cls(
            lost_upload_after_seconds=_whole(env, "RECONCILE_LOST_UPLOAD_AFTER_SECONDS", 45 * 60),
            episodes_per_tick=_whole(env, "RECONCILE_EPISODES_PER_TICK", 200),
            stale_processing_after_seconds=_whole(
                env, "RECONCILE_STALE_PROCESSING_AFTER_SECONDS", 10 * 60
            ),
        )


MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class ArchiveLimits:
    """Per-episode ceilings that stop a hostile or broken upload early, with a named error.

    Defaults are generous for robot episodes (a long multi-camera episode is a few GB; its
    videos barely compress, its parquets 3-10x). Env: ARCHIVE_MAX_MEMBER_BYTES (20 GiB),
    ARCHIVE_MAX_TOTAL_BYTES (100 GiB, the decompressed tar stream), ARCHIVE_MAX_MEMBERS (100,000
    entries), ARCHIVE_MAX_RATIO (decompressed / compressed bytes, 200) checked once
    ARCHIVE_RATIO_GRACE_BYTES (64 MiB) are out, ARCHIVE_MAX_PATH_DEPTH (32 folders),
    ARCHIVE_MAX_PATH_BYTES (512, so the processed key stays under S3's 1,024), and
    ARCHIVE_MAX_METADATA_BYTES (16 MiB: `meta/info.json` and the other files read into memory).
    """

    max_member_bytes: int = 20 * GiB
    max_total_bytes: int = 100 * GiB
    max_members: int = 100_000
    max_ratio: float = 200.0
    ratio_grace_bytes: int = 64 * MiB
    max_path_depth: int = 32
    max_path_bytes: int = 512
    max_metadata_bytes: int = 16 * MiB

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ArchiveLimits:
        defaults = cls()
        return cls(
            max_member_bytes=_whole(env, "ARCHIVE_MAX_MEMBER_BYTES", defaults.max_member_bytes),
            max_total_bytes=_whole(env, "ARCHIVE_MAX_TOTAL_BYTES", defaults.max_total_bytes),
            max_members=_whole(env, "ARCHIVE_MAX_MEMBERS", defaults.max_members),
            max_ratio=_number(env, "ARCHIVE_MAX_RATIO", defaults.max_ratio),
            ratio_grace_bytes=_whole(env, "ARCHIVE_RATIO_GRACE_BYTES", defaults.ratio_grace_bytes),
            max_path_depth=_whole(env, "ARCHIVE_MAX_PATH_DEPTH", defaults.max_path_depth),
            max_path_bytes=_whole(env, "ARCHIVE_MAX_PATH_BYTES", defaults.max_path_bytes),
            max_metadata_bytes=_whole(
                env, "ARCHIVE_MAX_METADATA_BYTES", defaults.max_metadata_bytes
            ),
        )


@dataclass(frozen=True)
class Settings:
    bucket: str
    sqs_queue_url: str | None
    dlq_url: str | None
    aws: AwsSettings
    database: DatabaseSettings
    transcode: TranscodeSettings = field(default_factory=TranscodeSettings)
    local: bool = False  # True when the values come from the embedded stack
    s3_deadlines: S3Deadlines = field(default_factory=S3Deadlines)
    queue: QueueSettings = field(default_factory=QueueSettings)
    reconcile: ReconcileSettings = field(default_factory=ReconcileSettings)
    archive_limits: ArchiveLimits = field(default_factory=ArchiveLimits)

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, local: bool = False) -> Settings:
        _require(
            env,
            ("DB_HOST", "DATA_BUCKET"),
            "set them, or start the local stack with `episode-pipeline stack up`",
        )
        return cls(
            bucket=env["DATA_BUCKET"],
            sqs_queue_url=env.get("SQS_QUEUE_URL") or None,
            dlq_url=env.get("SQS_DLQ_URL") or None,
            aws=AwsSettings.from_env(env),
            database=DatabaseSettings.from_env(env),
            transcode=TranscodeSettings.from_env(env),
            local=local,
            s3_deadlines=S3Deadlines.from_env(env),
            queue=QueueSettings.from_env(env),
            reconcile=ReconcileSettings.from_env(env),
            archive_limits=ArchiveLimits.from_env(env),
        )


def local_stack_env(home: Path | None = None) -> dict[str, str] | None:
    """The variables the embedded stack publishes in its state file; None if never started."""
    state_file = (home or pipeline_home()) / STACK_STATE_FILE
    if not state_file.exists():
        return None
    return dict(json.loads(state_file.read_text())["env"])


def load_settings() -> Settings:
    """Production variables when `DB_HOST` is set, otherwise the embedded stack's."""
    if os.environ.get("DB_HOST"):
        return Settings.from_env(os.environ)
    stack_env = local_stack_env()
    if stack_env is None:
        raise RuntimeError(
            f"DB_HOST is not set and no local stack state was found in {pipeline_home()}: "
            "run `episode-pipeline stack up` (or set the production variables)"
        )
    return Settings.from_env({**stack_env, **os.environ}, local=True)


def apply_local_stack_env() -> bool:
    """Export the embedded stack's variables into this process when production's are absent.

    For command-line entry points only (never at import): lets Dagster find the local instance
    (`DAGSTER_HOME`) and child processes the local services. Variables already set win. Returns
    whether the local stack's values applied.
    """
    if os.environ.get("DB_HOST"):
        return False
    stack_env = local_stack_env()
    if stack_env is None:
        return False
    for name, value in stack_env.items():
        os.environ.setdefault(name, value)
    return True


INJECTION_POINT_ENV = "EPISODE_PIPELINE_INJECTION_POINT"


INJECTION_ABOUT_ENV = "EPISODE_PIPELINE_INJECTION_ABOUT"


@dataclass(frozen=True)
class InjectionPoint:
    """A test's request to stop this process at one named point (see `injection_points`)."""

    name: str
    marker: Path  # written when the point is reached, so the test knows when to strike
    about: str = ""  # only when the point is reached about this (an episode's partition key)
    hold_seconds: float = 120.0


def armed_injection_point() -> InjectionPoint | None:
    """`EPISODE_PIPELINE_INJECTION_POINT=<point name>:<marker file>`, optionally
    `EPISODE_PIPELINE_INJECTION_ABOUT=<text>`; never set in production.

    Read when a point is reached rather than once at start: the crash tests arm one daemon
    process at a time through its environment.
    """
    raw = os.environ.get(INJECTION_POINT_ENV, "")
    name, _, marker = raw.partition(":")
    if not name or not marker:
        return None
    return InjectionPoint(
        name=name, marker=Path(marker), about=os.environ.get(INJECTION_ABOUT_ENV, "")
    )
