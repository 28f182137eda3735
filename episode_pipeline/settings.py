"""Where the pipeline's services are: read once from the environment.

Production sets the seed's variables (`DB_HOST`, `DB_PORT`, `DB_NAME`, `DB_USER`, `DB_PASSWORD`,
`DB_SSL`, `DB_IAM_AUTH`, `SQS_QUEUE_URL`, ...). On a laptop nobody exports anything: when `DB_HOST`
is unset, the embedded stack's `stack.json` (written by `episode-pipeline stack up`) supplies
the same variables, so `dagster dev`, `dagster asset materialize` and the CLI reach the same
services.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

HOME_ENV = "EPISODE_PIPELINE_HOME"
DEFAULT_HOME = ".episode_pipeline"
STACK_STATE_FILE = "stack.json"


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


def aws_region(env: Mapping[str, str]) -> str:
    """AWS_REGION, else AWS_DEFAULT_REGION, else the seed's us-west-2."""
    return env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-west-2"


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class DatabaseSettings:
    host: str
    port: int
    name: str
    user: str
    password: str | None
    ssl: bool
    iam_auth: bool
    region: str

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
            region=aws_region(env),
        )


@dataclass(frozen=True)
class Settings:
    bucket: str
    sqs_queue_url: str | None
    dlq_url: str | None
    aws_region: str
    aws_endpoint_url: str | None  # moto server locally; None on AWS
    aws_access_key_id: str | None  # set locally (moto); on AWS the task role supplies credentials
    aws_secret_access_key: str | None
    database: DatabaseSettings
    local: bool  # True when the values come from the embedded stack

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, local: bool = False) -> Settings:
        missing = [name for name in ("DB_HOST", "DATA_BUCKET") if not env.get(name)]
        if missing:
            raise RuntimeError(
                f"missing environment variable(s) {', '.join(missing)}: set them, or start the "
                "local stack with `episode-pipeline stack up`"
            )
        return cls(
            bucket=env["DATA_BUCKET"],
            sqs_queue_url=env.get("SQS_QUEUE_URL") or None,
            dlq_url=env.get("SQS_DLQ_URL") or None,
            aws_region=aws_region(env),
            aws_endpoint_url=env.get("AWS_ENDPOINT_URL") or None,
            aws_access_key_id=env.get("AWS_ACCESS_KEY_ID") or None,
            aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
            database=DatabaseSettings.from_env(env),
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

    Lets boto3, Dagster (`DAGSTER_HOME`) and child processes find the local services with nothing
    exported by hand. Variables already set win. Returns whether the local stack's values applied.
    """
    if os.environ.get("DB_HOST"):
        return False
    stack_env = local_stack_env()
    if stack_env is None:
        return False
    for name, value in stack_env.items():
        os.environ.setdefault(name, value)
    return True
