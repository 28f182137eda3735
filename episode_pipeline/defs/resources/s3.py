"""The data bucket as a Dagster resource: configuration in the UI, a core `Bucket` to work with."""

from __future__ import annotations

from pydantic import Field

from episode_pipeline.config.settings import S3Deadlines, Settings
from episode_pipeline.defs.resources.aws import AwsResource, aws_fields
from episode_pipeline.storage.bucket import Bucket

_DEADLINES = S3Deadlines()


class S3BucketResource(AwsResource):
    """The data bucket (DATA_BUCKET): uploads, processed files and the assets' stored outputs."""

    bucket: str = Field(description="The data bucket (DATA_BUCKET).")
    connect_timeout_seconds: float = Field(
        default=_DEADLINES.connect_timeout_seconds, description="S3_CONNECT_TIMEOUT_SECONDS"
    )
    read_timeout_seconds: float = Field(
        default=_DEADLINES.read_timeout_seconds,
        description="S3_READ_TIMEOUT_SECONDS: the longest wait for the next bytes of a response.",
    )
    max_attempts: int = Field(
        default=_DEADLINES.max_attempts,
        description="S3_MAX_ATTEMPTS: tries per call, backing off exponentially between them.",
    )

    @classmethod
    def from_settings(cls, settings: Settings) -> S3BucketResource:
        deadlines = settings.s3_deadlines
        return cls(
            bucket=settings.bucket,
            connect_timeout_seconds=deadlines.connect_timeout_seconds,
            read_timeout_seconds=deadlines.read_timeout_seconds,
            max_attempts=deadlines.max_attempts,
            **aws_fields(settings.aws),
        )

    def deadlines(self) -> S3Deadlines:
        return S3Deadlines(
            connect_timeout_seconds=self.connect_timeout_seconds,
            read_timeout_seconds=self.read_timeout_seconds,
            max_attempts=self.max_attempts,
        )

    def get_client(self) -> Bucket:
        return self._cached(lambda: Bucket(self.bucket, self.aws_settings(), self.deadlines()))
