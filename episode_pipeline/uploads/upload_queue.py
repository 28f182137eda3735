"""The upload queue (SQS): receive, delete, keep in flight — a plain class.

The bucket notification puts one message per uploaded archive here. The sensors receive them,
hand them to runs and delete them only after the run succeeds (docs/contract.md#upload-queue), so
the few operations they need live in one place. Dagster's `UploadQueueResource`
(defs/resources/sqs.py) hands one out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from botocore.exceptions import ClientError

from episode_pipeline.config.settings import AwsSettings, QueueSettings
from episode_pipeline.storage.aws import LazyClient
from episode_pipeline.uploads.events import RECEIVE_COUNT_ATTRIBUTE

MAX_BATCH = 10  # SQS's limit per ReceiveMessage / *Batch call

# What SQS answers when a receipt handle no longer names an in-flight message: it expired, the
# message was received again (new handle) or it is already deleted.
GONE_ERROR_CODES = frozenset(
    {
        "ReceiptHandleIsInvalid",
        "InvalidParameterValue",
        "MessageNotInflight",
        "AWS.SimpleQueueService.MessageNotInflight",
    }
)


class QueueNotConfigured(RuntimeError):
    """SQS_QUEUE_URL is unset: there is no queue to read."""


def is_gone_error(error: ClientError) -> bool:
    """The receipt handle is stale (expired, superseded, or the message is gone)."""
    return str(error.response.get("Error", {}).get("Code", "")) in GONE_ERROR_CODES


class UploadQueue:
    """The SQS queue the data bucket notifies about uploaded archives (SQS_QUEUE_URL)."""

    def __init__(
        self,
        queue_url: str | None,
        aws: AwsSettings,
        visibility_timeout_seconds: int = QueueSettings.visibility_timeout_seconds,
    ) -> None:
        self.queue_url = queue_url
        self.aws = aws
        self.visibility_timeout_seconds = visibility_timeout_seconds
        # Short timeouts: a sensor tick must finish well inside Dagster's 60 s gRPC limit.
        self._client = LazyClient(
            "sqs",
            aws,
            retries={"mode": "standard", "max_attempts": 3},
            connect_timeout=5,
            read_timeout=30,
        )

    @property
    def configured(self) -> bool:
        return bool(self.queue_url)

    @property
    def client(self) -> Any:
        return self._client.get()

    def _url(self) -> str:
        if not self.queue_url:
            raise QueueNotConfigured("SQS_QUEUE_URL is not set: no upload queue to use")
        return self.queue_url

    # -- operations -----------------------------------------------------------------------------

    def depth(self) -> tuple[int, int] | None:
        """(waiting, in flight) messages as SQS approximates them; None when not configured."""
        if not self.configured:
            return None
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        attributes = self.client.get_queue_attributes(QueueUrl=self._url(), AttributeNames=names)[
            "Attributes"
        ]
        waiting, in_flight = (int(attributes.get(name, 0)) for name in names)
        return waiting, in_flight

    def receive(
        self,
        max_messages: int = MAX_BATCH,
        wait_seconds: int = 0,
        *,
        visibility_seconds: int | None = None,
        attributes: Sequence[str] = (RECEIVE_COUNT_ATTRIBUTE,),
    ) -> list[dict[str, Any]]:
        """Up to `max_messages` (≤ 10) messages with `attributes`; [] when none came.

        `visibility_seconds` overrides the queue's visibility timeout for these messages.
        """
        extra = {} if visibility_seconds is None else {"VisibilityTimeout": visibility_seconds}
        response = self.client.receive_message(
            QueueUrl=self._url(),
            MaxNumberOfMessages=max(1, min(MAX_BATCH, max_messages)),
            WaitTimeSeconds=max(0, min(20, wait_seconds)),
            # Both spellings: moto and older SQS read the first, current SQS the second.
            AttributeNames=list(attributes),
            MessageSystemAttributeNames=list(attributes),
            **extra,
        )
        return list(response.get("Messages", []))

    def send(self, body: str) -> str:
        """Put a message on the queue; returns its new message id."""
        return str(self.client.send_message(QueueUrl=self._url(), MessageBody=body)["MessageId"])

    def delete(self, receipt_handle: str) -> bool:
        """Delete one message; False when its handle is stale (expired or superseded)."""
        try:
            self.client.delete_message(QueueUrl=self._url(), ReceiptHandle=receipt_handle)
        except ClientError as error:
            if is_gone_error(error):
                return False
            raise
        return True

    def extend_visibility_many(
        self, receipt_handles: Sequence[str], seconds: int | None = None
    ) -> dict[str, str]:
        """ChangeMessageVisibilityBatch over many handles; returns handle → error for failures."""
        timeout = self.visibility_timeout_seconds if seconds is None else seconds
        handles = list(dict.fromkeys(receipt_handles))
        failed: dict[str, str] = {}
        for start in range(0, len(handles), MAX_BATCH):
            batch = handles[start : start + MAX_BATCH]
            response = self.client.change_message_visibility_batch(
                QueueUrl=self._url(),
                Entries=[
                    {"Id": str(index), "ReceiptHandle": handle, "VisibilityTimeout": timeout}
                    for index, handle in enumerate(batch)
                ],
            )
            for entry in response.get("Failed", []) or []:
                handle = batch[int(entry["Id"])]
                failed[handle] = f"{entry.get('Code')}: {entry.get('Message', '')}".strip()
        return failed
