"""What the S3 and SQS resources share: the connection fields, and `AwsSettings` from them.

The resources only carry configuration for the UI and hand out the core clients
(`episode_pipeline.storage.bucket.Bucket`, `episode_pipeline.uploads.upload_queue.UploadQueue`).
A secret key read from the environment stays an `EnvVar` (see `secret_config`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from dagster import ConfigurableResource
from pydantic import PrivateAttr

from episode_pipeline.config.settings import AwsSettings
from episode_pipeline.defs.resources.settings_fields import (
    resource_values,
    setting_field,
    settings_from,
)

Client = TypeVar("Client")


def aws_fields(aws: AwsSettings) -> dict[str, Any]:
    """The connection fields of an `AwsResource`, from `Settings.aws`."""
    return resource_values(aws)


class AwsResource(ConfigurableResource):
    """Base of the S3 and SQS resources: where the endpoint is and how to sign."""

    region: str = setting_field(AwsSettings, "region")
    endpoint_url: str | None = setting_field(AwsSettings, "endpoint_url")
    access_key_id: str | None = setting_field(AwsSettings, "access_key_id")
    secret_access_key: str | None = setting_field(AwsSettings, "secret_access_key")

    _client: Any = PrivateAttr(default=None)

    def _cached(self, make: Callable[[], Client]) -> Client:
        """The core client, made once per resource instance (its boto3 client is shared)."""
        if self._client is None:
            self._client = make()
        return self._client

    def aws_settings(self) -> AwsSettings:
        return settings_from(self, AwsSettings)
