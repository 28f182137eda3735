"""The upload queue as a Dagster resource: configuration in the UI, a core `UploadQueue` to use."""

from __future__ import annotations

from episode_pipeline.config.settings import QueueSettings, Settings
from episode_pipeline.defs.resources.aws import AwsResource, aws_fields
from episode_pipeline.defs.resources.settings_fields import setting_field
from episode_pipeline.uploads.upload_queue import UploadQueue


class UploadQueueResource(AwsResource):
    """The SQS queue the data bucket notifies about uploaded archives (SQS_QUEUE_URL)."""

    queue_url: str | None = setting_field(Settings, "sqs_queue_url")
    visibility_timeout_seconds: int = setting_field(QueueSettings, "visibility_timeout_seconds")

    @classmethod
    def from_settings(cls, settings: Settings) -> UploadQueueResource:
        return cls(
            queue_url=settings.sqs_queue_url,
            visibility_timeout_seconds=settings.queue.visibility_timeout_seconds,
            **aws_fields(settings.aws),
        )

    def get_client(self) -> UploadQueue:
        return self._cached(
            lambda: UploadQueue(
                self.queue_url, self.aws_settings(), self.visibility_timeout_seconds
            )
        )
