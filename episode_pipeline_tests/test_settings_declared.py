"""Each setting declared once: the loader, the docs table and the resources read the declaration."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest

from episode_pipeline.config.__main__ import DOC, with_table
from episode_pipeline.config.env import EnvSettings, MissingSettings, declaration, variables
from episode_pipeline.config.settings import (
    SUBPROCESS,
    ArchiveLimits,
    AwsSettings,
    DatabaseSettings,
    QueueSettings,
    S3Deadlines,
    Settings,
    VideoSettings,
)
from episode_pipeline.defs.resources.archive_limits import ArchiveLimitsResource
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.defs.resources.sqs import UploadQueueResource
from episode_pipeline.defs.resources.transcoder import HlsTranscoder

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = {"DB_HOST": "db", "DATA_BUCKET": "data"}


def test_the_docs_table_is_current() -> None:
    text = (ROOT / DOC).read_text()
    assert with_table(text) == text, "run `python -m episode_pipeline.config` and commit it"


def _group(hint: object) -> bool:
    return isinstance(hint, type) and issubclass(hint, EnvSettings)


def _groups(cls: type) -> Iterator[type]:
    yield cls
    for hint in typing.get_type_hints(cls).values():
        if _group(hint):
            yield from _groups(hint)


def test_every_field_is_a_declared_setting_or_a_group() -> None:
    undeclared = [
        f"{group.__name__}.{field.name}"
        for group in _groups(Settings)
        for field in dataclasses.fields(group)
        if declaration(field) is None and not _group(typing.get_type_hints(group)[field.name])
    ]
    assert undeclared == []


def test_a_variable_is_declared_by_one_field_only() -> None:
    names = [v.name for v in variables(Settings)]
    assert len(names) == len(set(names))
    # The region is the one variable two groups read: the same declaration (`_region`).
    region = {
        (f.metadata["setting"], f.default)
        for group in (AwsSettings, DatabaseSettings)
        for f in dataclasses.fields(group)
        if f.name == "region"
    }
    assert len(region) == 1


def test_required_variables_are_named_together() -> None:
    with pytest.raises(MissingSettings) as error:
        Settings.from_env({"DB_PORT": "5433"})
    assert error.value.names == ["DATA_BUCKET", "DB_HOST"]


def test_values_are_parsed_by_the_field_type_and_name_the_variable() -> None:
    settings = Settings.from_env(
        {
            **REQUIRED,
            "DB_SSL": "yes",
            "DB_PORT": "6432",
            "S3_READ_TIMEOUT_SECONDS": "2.5",
            "ECS_SUBNETS": " subnet-1, ,subnet-2 ",
            "TRANSCODE_TASK_DEFINITION": "td",
            "ECS_CLUSTER": "c",
            "TRANSCODE_LADDER": "",
            "AWS_DEFAULT_REGION": "eu-west-1",
        }
    )
    assert (settings.database.ssl, settings.database.port) == (True, 6432)
    assert settings.s3_deadlines.read_timeout_seconds == 2.5
    assert settings.transcode.ecs_subnets == ("subnet-1", "subnet-2")
    # A transcode task is configured, yet an untagged run still transcodes in its own task.
    transcoder = HlsTranscoder.from_settings(settings)
    assert (settings.transcode.task_definition, transcoder.mode) == ("td", SUBPROCESS)
    assert settings.transcode.video.ladder == ()  # set but empty: baseline only
    assert settings.aws.region == settings.database.region == "eu-west-1"
    with pytest.raises(RuntimeError, match="S3_MAX_ATTEMPTS='0' must be greater than 0"):
        Settings.from_env({**REQUIRED, "S3_MAX_ATTEMPTS": "0"})
    with pytest.raises(RuntimeError, match="TRANSCODE_LADDER: ladder rung 'tall'"):
        Settings.from_env({**REQUIRED, "TRANSCODE_LADDER": "tall"})


def test_to_env_is_read_back_by_from_env() -> None:
    aws = AwsSettings("eu-west-1", "http://127.0.0.1:5000", "testing", "secret")
    assert aws.to_env()["AWS_DEFAULT_REGION"] == "eu-west-1"
    assert AwsSettings.from_env(aws.to_env()) == aws


def test_resources_default_to_the_declarations() -> None:
    assert ArchiveLimitsResource().get_limits() == ArchiveLimits()
    assert HlsTranscoder().video() == VideoSettings()
    assert PostgresResource(host="db").database_settings() == DatabaseSettings(host="db")
    assert S3BucketResource(bucket="data").deadlines() == S3Deadlines()
    assert (
        UploadQueueResource().visibility_timeout_seconds
        == QueueSettings().visibility_timeout_seconds
    )
    description = HlsTranscoder.model_fields["ladder"].description
    assert description and description.endswith("(TRANSCODE_LADDER)")
