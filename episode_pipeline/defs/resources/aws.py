"""What the S3 and SQS resources share: the connection fields, and `AwsSettings` from them.

The resources only carry configuration for the UI and hand out the core clients
(`episode_pipeline.storage.bucket.Bucket`, `episode_pipeline.uploads.upload_queue.UploadQueue`).
A secret key read from the environment stays an `EnvVar` (see `secret_config`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from dagster import ConfigurableResource
from pydantic import Field, PrivateAttr

from episode_pipeline.config.settings import DEFAULT_REGION, AwsSettings
from episode_pipeline.defs.resources.secret_config import resolved, secret_field

SECRET_KEY_ENV = "AWS_SECRET_ACCESS_KEY"
Client = TypeVar("Client")


def aws_fields(aws: AwsSettings) -> dict[str, Any]:
    """The connection fields of an `AwsResource`, from `Settings.aws`."""
    return {
        "region": aws.region,
        "endpoint_url": aws.endpoint_url,
        "access_key_id": aws.access_key_id,
        "secret_access_key": secret_field(aws.secret_access_key, SECRET_KEY_ENV),
    }


class AwsResource(ConfigurableResource):
    """Base of the S3 and SQS resources: where the endpoint is and how to sign."""

    region: str = Field(default=DEFAULT_REGION)
    endpoint_url: str | None = Field(
        default=None, description="Service endpoint; the moto server locally, None on AWS."
    )
    access_key_id: str | None = Field(
        default=None, description="Only for moto locally; on AWS the task role supplies keys."
    )
    secret_access_key: str | None = Field(default=None, description="Secret; moto locally only.")

    _client: Any = PrivateAttr(default=None)

    def _cached(self, make: Callable[[], Client]) -> Client:
        """The core client, made once per resource instance (its boto3 client is shared)."""
        if self._client is None:
            self._client = make()
        return self._client

    def aws_settings(self) -> AwsSettings:
        return AwsSettings(
            region=self.region,
            endpoint_url=self.endpoint_url,
            access_key_id=self.access_key_id,
            secret_access_key=resolved(self.secret_access_key),
        )
