"""The upload queue as a Dagster resource: configuration in the UI, a core `UploadQueue` to use."""

from __future__ import annotations

from episode_pipeline.config.settings import QueueSettings, Settings
from episode_pipeline.defs.resources.aws import AwsResource, aws_fields
from episode_pipeline.defs.resources.settings_fields import SettingsFields, settings_resource
from episode_pipeline.uploads.upload_queue import UploadQueue

# The settings this resource uses: the queue (its field `queue_url`) and its visibility timeout
# (the heartbeat is the sensors' business).
_QUEUE_URL = SettingsFields(
    Settings, only=("sqs_queue_url",), rename={"sqs_queue_url": "queue_url"}
)
_VISIBILITY = SettingsFields(QueueSettings, only=("visibility_timeout_seconds",))


class UploadQueueResource(settings_resource(_QUEUE_URL, _VISIBILITY, base=AwsResource)):
    """The SQS queue the data bucket notifies about uploaded archives (SQS_QUEUE_URL)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> UploadQueueResource:
        return cls(
            **_QUEUE_URL.values(settings),
            **_VISIBILITY.values(settings.queue),
            **aws_fields(settings.aws),
        )

    def get_client(self) -> UploadQueue:
        return self._cached(
            lambda: UploadQueue(
                self.queue_url, self.aws_settings(), self.visibility_timeout_seconds
            )
        )
