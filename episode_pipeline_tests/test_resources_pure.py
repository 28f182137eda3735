"""Resource construction and the pure helpers behind them (no services needed)."""

from __future__ import annotations

import io

import pytest
from dagster import EnvVar

from episode_pipeline.config.settings import AwsSettings, DatabaseSettings, Settings
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.storage.bucket import (
    MAX_PARTS,
    MiB,
    _HashingReader,
    content_type_for,
    transfer_config,
)

DB = DatabaseSettings(
    host="db.example",
    port=5433,
    name="episodes",
    user="worker",
    password="s3cret",
    ssl=True,
    iam_auth=False,
    region="eu-west-1",
)


def test_postgres_from_settings_round_trips_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DB_PASSWORD", raising=False)
    resource = PostgresResource.from_settings(DB)
    assert resource.database_settings() == DB


def test_postgres_password_from_the_environment_stays_an_env_var(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DB_PASSWORD", "s3cret")
    resource = PostgresResource.from_settings(DB)
    assert isinstance(resource.password, EnvVar)
    assert resource.password.env_var_name == "DB_PASSWORD"  # what Dagster shows
    assert resource.database_settings().password == "s3cret"


def test_storage_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    settings = Settings(
        bucket="data",
        sqs_queue_url=None,
        dlq_url=None,
        aws=AwsSettings(
            region="us-west-2",
            endpoint_url="http://127.0.0.1:5000",
            access_key_id="testing",
            secret_access_key="testing-secret",
        ),
        database=DB,
    )
    resource = S3BucketResource.from_settings(settings)
    assert (resource.bucket, resource.region, resource.endpoint_url) == (
        "data",
        "us-west-2",
        "http://127.0.0.1:5000",
    )
    storage = resource.get_client()
    assert resource.get_client() is storage  # one client per resource instance
    assert storage.uri("a/b.json") == "s3://data/a/b.json"
    config = storage.client.meta.config
    assert config.retries["mode"] == "standard"
    assert config.max_pool_connections >= 16
    assert storage.client is storage.client  # cached


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("x/hls/cam/playlist.m3u8", "application/vnd.apple.mpegurl"),
        ("x/hls/cam/segment_00001.ts", "video/mp2t"),
        ("x/videos/cam/episode_000000.MP4", "video/mp4"),
        ("x/data/chunk-000/file-000.parquet", "application/vnd.apache.parquet"),
        ("x/meta/info.json", "application/json"),
        ("x/README", "application/octet-stream"),
    ],
)
def test_content_type_for(key: str, expected: str) -> None:
    assert content_type_for(key) == expected


def test_transfer_config_keeps_parts_under_the_s3_limit() -> None:
    assert transfer_config().multipart_chunksize == 8 * MiB
    huge = 500 * 1024 * MiB  # 500 GiB
    part = transfer_config(huge).multipart_chunksize
    assert part % MiB == 0
    assert huge / part <= MAX_PARTS


def test_hashing_reader_is_not_seekable_and_counts() -> None:
    reader = _HashingReader(io.BytesIO(b"abc" * 10))
    assert not reader.seekable()
    assert reader.read(4) + reader.read() == b"abc" * 10
    assert reader.size == 30
