"""What the S3, SQS and transcode resources share: the AWS fields and the `AwsSettings` they hold.

The resources only carry configuration for the UI and hand out the core clients
(`episode_pipeline.storage.bucket.Bucket`, `episode_pipeline.uploads.upload_queue.UploadQueue`).
A secret key read from the environment stays an `EnvVar` (see `settings_fields`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import PrivateAttr

from episode_pipeline.config.settings import AwsSettings
from episode_pipeline.defs.resources.settings_fields import SettingsFields, settings_resource

Client = TypeVar("Client")

_AWS = SettingsFields(AwsSettings)


def aws_fields(aws: AwsSettings) -> dict[str, Any]:
    """The connection fields of an `AwsResource`, from `Settings.aws`."""
    return _AWS.values(aws)


class AwsResource(settings_resource(_AWS)):
    """Base of the S3, SQS and transcode resources: where the endpoint is and how to sign (a
    field for each `AwsSettings` setting)."""

    _client: Any = PrivateAttr(default=None)

    def _cached(self, make: Callable[[], Client]) -> Client:
        """The core client, made once per resource instance (its boto3 client is shared)."""
        if self._client is None:
            self._client = make()
        return self._client

    def aws_settings(self) -> AwsSettings:
        return _AWS.read(self)
