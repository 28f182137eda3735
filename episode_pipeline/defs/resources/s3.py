"""The data bucket as a Dagster resource: configuration in the UI, a core `Bucket` to work with."""

from __future__ import annotations

from episode_pipeline.config.settings import S3Deadlines, Settings
from episode_pipeline.defs.resources.aws import AwsResource, aws_fields
from episode_pipeline.defs.resources.settings_fields import (
    resource_values,
    setting_field,
    settings_from,
)
from episode_pipeline.storage.bucket import Bucket


class S3BucketResource(AwsResource):
    """The data bucket (DATA_BUCKET): uploads, processed files and the assets' stored outputs."""

    bucket: str = setting_field(Settings, "bucket")
    connect_timeout_seconds: float = setting_field(S3Deadlines, "connect_timeout_seconds")
    read_timeout_seconds: float = setting_field(S3Deadlines, "read_timeout_seconds")
    max_attempts: int = setting_field(S3Deadlines, "max_attempts")
    viewer_url: str | None = setting_field(Settings, "viewer_url")

    @classmethod
    def from_settings(cls, settings: Settings) -> S3BucketResource:
        return cls(
            bucket=settings.bucket,
            viewer_url=settings.viewer_url,
            **resource_values(settings.s3_deadlines),
            **aws_fields(settings.aws),
        )

    def deadlines(self) -> S3Deadlines:
        return settings_from(self, S3Deadlines)

    def get_client(self) -> Bucket:
        return self._cached(lambda: Bucket(self.bucket, self.aws_settings(), self.deadlines()))
