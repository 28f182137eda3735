"""Each setting declared once: the loader, the docs table and the resources read the declaration."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import ConfigurableResource, EnvVar

from episode_pipeline.config.__main__ import DOC, with_table
from episode_pipeline.config.env import (
    EnvSettings,
    MissingSettings,
    declaration,
    field_default,
    setting,
    variables,
)
from episode_pipeline.config.settings import (
    SUBPROCESS,
    ArchiveLimits,
    AwsSettings,
    DatabaseSettings,
    QueueSettings,
    S3Deadlines,
    Settings,
    TranscodeSettings,
    VideoSettings,
)
from episode_pipeline.defs.resources.archive_limits import ArchiveLimitsResource
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.defs.resources.settings_fields import SettingsFields, settings_resource
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


def test_every_field_is_a_declared_declaredor_a_group() -> None:
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


# Each resource, each group it carries, the settings it shows of it (None: all) and their names.
CARRIED: list[tuple[type[ConfigurableResource], type[EnvSettings], set[str] | None, dict]] = [
    (PostgresResource, DatabaseSettings, None, {"name": "database"}),
    (ArchiveLimitsResource, ArchiveLimits, None, {}),
    (S3BucketResource, AwsSettings, None, {}),
    (S3BucketResource, S3Deadlines, None, {}),
    (S3BucketResource, Settings, {"bucket", "viewer_url"}, {}),
    (UploadQueueResource, AwsSettings, None, {}),
    (UploadQueueResource, QueueSettings, {"visibility_timeout_seconds"}, {}),
    (UploadQueueResource, Settings, {"sqs_queue_url"}, {"sqs_queue_url": "queue_url"}),
    (HlsTranscoder, AwsSettings, None, {}),
    (HlsTranscoder, TranscodeSettings, None, {}),
    (HlsTranscoder, VideoSettings, None, {}),
]


@pytest.mark.parametrize(
    ("resource", "group", "shown", "rename"),
    CARRIED,
    ids=[f"{resource.__name__}-{group.__name__}" for resource, group, *_ in CARRIED],
)
def test_each_setting_is_a_field_with_its_declared_default_and_meaning(
    resource: type[ConfigurableResource],
    group: type[EnvSettings],
    shown: set[str] | None,
    rename: dict[str, str],
) -> None:
    for declared in dataclasses.fields(group):  # type: ignore[arg-type]
        about = declaration(declared)
        if about is None or (shown is not None and declared.name not in shown):
            continue
        field = resource.model_fields[rename.get(declared.name, declared.name)]
        assert field.description == f"{about.about} ({', '.join(about.env)})"
        default = field_default(declared)
        if default is dataclasses.MISSING:
            assert field.is_required()
        else:  # Dagster config has lists where the settings have tuples
            expected = list(default) if isinstance(default, tuple) else default
            assert field.get_default(call_default_factory=True) == expected


@pytest.mark.parametrize(
    "resource", sorted({resource for resource, *_ in CARRIED}, key=lambda r: r.__name__)
)
def test_the_launchpad_shows_each_field_with_its_default_and_meaning(
    resource: type[ConfigurableResource],
) -> None:
    """Dagster's config schema, which the launchpad shows, has every field's default (a list
    too: a default factory would leave it blank) and description."""
    schema = resource.to_config_schema().as_field().config_type.fields  # type: ignore[attr-defined]
    for name, field in resource.model_fields.items():
        shown = schema[name]
        assert shown.description == field.description
        if field.is_required():
            assert shown.is_required
        else:
            assert shown.default_provided, f"{resource.__name__}.{name} shows no default"
            assert shown.default_value == field.get_default(call_default_factory=True)


def _is_env_var(value: object, name: str) -> bool:
    """Shown and stored as the variable's name only (an `EnvVar` is also a `str`)."""
    return isinstance(value, EnvVar) and value.env_var_name == name


def _settings() -> Settings:
    return Settings(
        bucket="data",
        aws=AwsSettings(access_key_id="testing", secret_access_key="testing-secret"),
        database=DatabaseSettings(host="db", password="s3cret"),
    )


def test_a_secret_from_its_variable_is_an_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret")
    monkeypatch.setenv("DB_PASSWORD", "s3cret")
    settings = _settings()
    for resource in (
        S3BucketResource.from_settings(settings),
        UploadQueueResource.from_settings(settings),
        HlsTranscoder.from_settings(settings),
    ):
        assert _is_env_var(resource.secret_access_key, "AWS_SECRET_ACCESS_KEY")
        assert resource.aws_settings() == settings.aws
    database = PostgresResource.from_settings(settings.database)
    assert _is_env_var(database.password, "DB_PASSWORD")
    assert database.database_settings() == settings.database


def test_a_setting_added_to_a_group_is_a_field_of_its_resource(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    @dataclasses.dataclass(frozen=True)
    class Grown(EnvSettings):
        size: int = setting("GROWN_SIZE", "How big.", 3)
        names: tuple[str, ...] = setting("GROWN_NAMES", "Which.", ("a",))
        token: str | None = setting("GROWN_TOKEN", "The key.", None, secret=True)

    fields = SettingsFields(Grown, rename={"size": "grown_size"})

    class GrownResource(settings_resource(fields)):
        pass

    assert set(GrownResource.model_fields) == {"grown_size", "names", "token"}
    assert GrownResource().names == ["a"]
    monkeypatch.setenv("GROWN_TOKEN", "t0ken")
    grown = Grown(size=5, names=("b", "c"), token="t0ken")
    resource = GrownResource(**fields.values(grown))
    assert (resource.grown_size, resource.names) == (5, ["b", "c"])
    assert _is_env_var(resource.token, "GROWN_TOKEN")
    assert fields.read(resource) == grown
