"""The data bucket as a Dagster resource: configuration in the UI, a core `Bucket` to work with."""

from __future__ import annotations

from pydantic import Field

from episode_pipeline.bucket import Bucket
from episode_pipeline.defs.resources.aws import AwsResource, aws_fields
from episode_pipeline.settings import Settings


class S3BucketResource(AwsResource):
    """The data bucket (DATA_BUCKET): uploads, processed files and the assets' stored outputs."""

    bucket: str = Field(description="The data bucket (DATA_BUCKET).")

    @classmethod
    def from_settings(cls, settings: Settings) -> S3BucketResource:
        return cls(bucket=settings.bucket, **aws_fields(settings.aws))

    def get_client(self) -> Bucket:
        return self._cached(lambda: Bucket(self.bucket, self.aws_settings()))
