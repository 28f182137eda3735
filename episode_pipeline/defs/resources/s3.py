"""The data bucket as a Dagster resource: configuration in the UI, a core `Bucket` to work with."""

from __future__ import annotations

from episode_pipeline.config.settings import S3Deadlines, Settings
from episode_pipeline.defs.resources.aws import AwsResource, aws_fields
from episode_pipeline.defs.resources.settings_fields import SettingsFields, settings_resource
from episode_pipeline.storage.bucket import Bucket

# Of `Settings`' own settings (every service's), the two this resource uses.
_BUCKET = SettingsFields(Settings, only=("bucket", "viewer_url"))
_DEADLINES = SettingsFields(S3Deadlines)


class S3BucketResource(settings_resource(_BUCKET, _DEADLINES, base=AwsResource)):
    """The data bucket (DATA_BUCKET): uploads, processed files and the assets' stored outputs."""

    @classmethod
    def from_settings(cls, settings: Settings) -> S3BucketResource:
        return cls(
            **_BUCKET.values(settings),
            **_DEADLINES.values(settings.s3_deadlines),
            **aws_fields(settings.aws),
        )

    def deadlines(self) -> S3Deadlines:
        return _DEADLINES.read(self)

    def get_client(self) -> Bucket:
        return self._cached(lambda: Bucket(self.bucket, self.aws_settings(), self.deadlines()))
