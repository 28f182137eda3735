"""What every AWS-backed resource shares: where the endpoint is, how to sign, one cached client.

Locally the endpoint is the moto server and the keys are moto's; on AWS the endpoint is None and
the task role signs. A secret key read from the environment stays an `EnvVar`, so Dagster never
shows or stores its value.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import boto3
from botocore.config import Config
from dagster import ConfigurableResource, EnvVar
from pydantic import Field, PrivateAttr

from episode_pipeline.settings import Settings

SECRET_KEY_ENV = "AWS_SECRET_ACCESS_KEY"


def aws_fields(settings: Settings) -> dict[str, Any]:
    """The connection fields of an `AwsClientResource`, from `load_settings()`."""
    secret: str | None = settings.aws_secret_access_key
    if secret is not None and os.environ.get(SECRET_KEY_ENV) == secret:
        secret = EnvVar(SECRET_KEY_ENV)
    return {
        "region": settings.aws_region,
        "endpoint_url": settings.aws_endpoint_url,
        "access_key_id": settings.aws_access_key_id,
        "secret_access_key": secret,
    }


class AwsClientResource(ConfigurableResource):
    """Base of the S3 and SQS resources: connection fields and one boto3 client per instance."""

    region: str = Field(default="us-west-2")
    endpoint_url: str | None = Field(
        default=None, description="Service endpoint; the moto server locally, None on AWS."
    )
    access_key_id: str | None = Field(
        default=None, description="Only for moto locally; on AWS the task role supplies keys."
    )
    secret_access_key: str | None = Field(default=None, description="Secret; moto locally only.")

    _client: Any = PrivateAttr(default=None)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def _service_name(self) -> str:
        raise NotImplementedError

    def _client_config(self) -> dict[str, Any]:
        """botocore Config arguments beyond the region (retries, pools, timeouts)."""
        return {}

    @property
    def client(self) -> Any:
        """The cached boto3 client (created once, on first use, under a lock)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._make_client()
        return self._client

    def _make_client(self) -> Any:
        secret = self.secret_access_key
        if isinstance(secret, EnvVar):  # read outside a Dagster run: resolve it ourselves
            secret = secret.get_value()
        session = boto3.session.Session(
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=secret,
            region_name=self.region,
        )
        config = Config(region_name=self.region, **self._client_config())
        return session.client(self._service_name(), endpoint_url=self.endpoint_url, config=config)
