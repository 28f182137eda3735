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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

HOME_ENV = "EPISODE_PIPELINE_HOME"
DEFAULT_HOME = ".episode_pipeline"
STACK_STATE_FILE = "stack.json"
DEFAULT_REGION = "us-west-2"  # the replaced worker's region
DEFAULT_PRESET = "veryfast"  # x264 preset: timings in docs/platform-notes.md#ffmpeg


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
        )


SUBPROCESS = "subprocess"
ECS = "ecs"
TranscodeMode = Literal["subprocess", "ecs"]


@dataclass(frozen=True)
class TranscodeSettings:
    """Where FFmpeg runs: a subprocess of the run (laptop, tests) or an ECS task (production).

    ECS mode is chosen by `TRANSCODE_TASK_DEFINITION` (infra/ecs.tf sets it on the run task).
    """

    mode: TranscodeMode = SUBPROCESS
    preset: str = DEFAULT_PRESET
    ecs_cluster: str | None = None
    ecs_subnets: tuple[str, ...] = field(default_factory=tuple)
    ecs_security_groups: tuple[str, ...] = field(default_factory=tuple)
    task_definition: str | None = None
    container_name: str = "transcode"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TranscodeSettings:
        preset = env.get("TRANSCODE_PRESET") or DEFAULT_PRESET
        if not env.get("TRANSCODE_TASK_DEFINITION"):
            return cls(mode=SUBPROCESS, preset=preset)
        _require(
            env,
            ("ECS_CLUSTER", "ECS_SUBNETS"),
            "TRANSCODE_TASK_DEFINITION is set, and the ECS transcode needs a cluster and subnets",
        )
        return cls(
            mode=ECS,
            preset=preset,
            ecs_cluster=env["ECS_CLUSTER"],
            ecs_subnets=_list(env.get("ECS_SUBNETS")),
            ecs_security_groups=_list(env.get("ECS_SECURITY_GROUPS")),
            task_definition=env["TRANSCODE_TASK_DEFINITION"],
            container_name=env.get("TRANSCODE_CONTAINER_NAME") or "transcode",
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
