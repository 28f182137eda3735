"""S3 event notifications as they arrive on the upload queue, parsed without any I/O.

The contract (docs/contract.md#upload-queue): an `s3:TestEvent` is deleted and ignored; any other
body is an S3 event whose object key must be `orgs/<org>/episodes/<ep>/…`; a body or key that is
not is logged and left on the queue, so after 3 receives SQS moves it to the dead-letter queue.
Only `.zst` archives outside `processed/` start processing.

S3 reaches the queue in three shapes (docs/deploy-aws.md#upload-routes), all read here:

- an S3 event notification (`Records`), sent by S3 straight to SQS; its keys are URL-encoded,
  `+` for a space;
- the same notification wrapped by SNS (raw message delivery off): an envelope of `Type`
  `Notification` whose `Message` is the notification's JSON as a string;
- an EventBridge `Object Created` event delivered to SQS as it is (`source` `aws.s3`,
  `detail`); its keys are not URL-encoded.

Each upload becomes a `Handoff`: the upload, the messages that announced it and their receive
count, from which `defs.runs.upload_run_key` builds the run key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote_plus

from episode_pipeline.episodes.keys import (
    ARCHIVE_SUFFIX,
    EpisodeRef,
    InvalidEpisodeKey,
    is_raw_archive_key,
    parse_s3_key,
)
from episode_pipeline.uploads.reasons import BAD_KEY, MALFORMED

TEST_EVENT = "s3:TestEvent"
OBJECT_CREATED_PREFIX = "ObjectCreated:"
# EventBridge's `source` of S3 events. A Records body whose record says eventSource "aws.s3" (an
# S3 notification says "aws:s3") was reshaped from such an event: its key is not URL-encoded.
EVENTBRIDGE_SOURCE = "aws.s3"
EVENTBRIDGE_OBJECT_CREATED = "Object Created"
SNS_NOTIFICATION = "Notification"
RECEIVE_COUNT_ATTRIBUTE = "ApproximateReceiveCount"
BAD_KEY_MARK = "bad-key:"  # `_upload_of`'s answer for a key that names no episode


@dataclass(frozen=True)
class TestEvent:
    """The message S3 sends when a bucket notification is configured: delete it, nothing else."""

    __test__ = False  # not a pytest class, despite the name

    bucket: str | None = None


@dataclass(frozen=True)
class Upload:
    """One `ObjectCreated` record for a raw episode archive."""

    ref: EpisodeRef
    bucket: str
    key: str  # decoded: the object's real key
    etag: str | None
    version_id: str | None
    sequencer: str | None  # absent from moto's records
    size: int | None
    event_time: str | None = None

    @property
    def partition_key(self) -> str:
        return self.ref.partition_key

    @property
    def object_version(self) -> str:
        """What distinguishes this upload of the key from another one of the same key."""
        return self.version_id or self.etag or self.sequencer or self.event_time or "unversioned"


@dataclass(frozen=True)
class Uploads:
    """An S3 event: the raw archives it announces (maybe none) and why other records were skipped.

    A valid event with no uploads (a non-`.zst` key, our own `processed/` output, a delete) asks
    for no work: the sensor deletes it rather than send it to the dead-letter queue.
    """

    uploads: tuple[Upload, ...]
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True)
class Malformed:
    """A body that is not an S3 event or names no episode: logged and left on the queue."""

    reason: str
    kind: str = MALFORMED  # or BAD_KEY: the key names no episode (uploads.reasons)


ParsedBody = TestEvent | Uploads | Malformed


@dataclass(frozen=True)
class QueueMessage:
    """One received SQS message with its parsed body."""

    message_id: str
    receipt_handle: str
    receive_count: int
    body: ParsedBody


@dataclass(frozen=True)
class _ObjectEvent:
    """What one notification record or one EventBridge event says about one object."""

    where: str  # the field path of the record or event, for messages
    key_field: str  # the field path of its key
    created: bool
    event_name: str
    bucket: str
    key: str  # decoded: the object's real key
    etag: str | None
    version_id: str | None
    sequencer: str | None
    size: Any
    event_time: str | None


def _upload_of(event: _ObjectEvent) -> Upload | str:
    """An Upload, or a string saying why not: `skip:` + reason for an event that asks for no
    work, `bad-key:` + reason for a key that names no episode (naming the field)."""
    key = event.key
    if not event.created:
        return f"skip:{event.where}: {event.event_name} of {key!r} is not an upload"
    if not key.endswith(ARCHIVE_SUFFIX):
        return f"skip:{event.where}: {key!r} is not a {ARCHIVE_SUFFIX} archive"
    try:
        ref = parse_s3_key(key)
    except InvalidEpisodeKey as error:
        return f"{BAD_KEY_MARK}{event.key_field}: {error}"
    if not is_raw_archive_key(key):
        return f"skip:{event.where}: {key!r} is pipeline output, not an upload"
    return Upload(
        ref=ref,
        bucket=event.bucket,
        key=key,
        etag=event.etag,
        version_id=event.version_id,
        sequencer=event.sequencer,
        size=int(event.size) if isinstance(event.size, int | float) else None,
        event_time=event.event_time,
    )


def _object_and_bucket(
    parent: Mapping[str, Any], field: str
) -> tuple[Mapping[str, Any], str] | str:
    """`parent.object` (with a key) and `parent.bucket.name`, or which is missing."""
    obj = parent.get("object")
    bucket = parent.get("bucket")
    if not isinstance(obj, Mapping) or not isinstance(obj.get("key"), str) or not obj["key"]:
        return f"{field}object.key is missing"
    bucket_name = bucket.get("name") if isinstance(bucket, Mapping) else None
    if not isinstance(bucket_name, str) or not bucket_name:
        return f"{field}bucket.name is missing"
    return obj, bucket_name


def _record_event(where: str, record: Any) -> _ObjectEvent | str:
    """One `Records[i]` of an S3 event notification, or why it is malformed."""
    if not isinstance(record, Mapping):
        return f"{where} is not an object"
    event_name = record.get("eventName")
    if not isinstance(event_name, str):
        return f"{where}.eventName is missing"
    s3 = record.get("s3")
    if not isinstance(s3, Mapping):
        return f"{where}.s3 is missing"
    located = _object_and_bucket(s3, f"{where}.s3.")
    if isinstance(located, str):
        return located
    obj, bucket_name = located
    encoded = record.get("eventSource") != EVENTBRIDGE_SOURCE
    return _ObjectEvent(
        where=where,
        key_field=f"{where}.s3.object.key",
        created=event_name.startswith(OBJECT_CREATED_PREFIX),
        event_name=event_name,
        bucket=bucket_name,
        key=unquote_plus(obj["key"]) if encoded else obj["key"],
        etag=_optional_str(obj.get("eTag")),
        version_id=_optional_str(obj.get("versionId")),
        sequencer=_optional_str(obj.get("sequencer")),
        size=obj.get("size"),
        event_time=_optional_str(record.get("eventTime")),
    )


def _eventbridge_event(where: str, data: Mapping[str, Any]) -> _ObjectEvent | str:
    """An S3 event as EventBridge delivers it (S3 User Guide, "EventBridge event message
    structure"), or why it is malformed. Its key is the real key: EventBridge does not encode."""
    detail = data.get("detail")
    if not isinstance(detail, Mapping):
        return f"{where}detail is missing"
    located = _object_and_bucket(detail, f"{where}detail.")
    if isinstance(located, str):
        return located
    obj, bucket_name = located
    detail_type = str(data.get("detail-type"))
    return _ObjectEvent(
        where=where or "event",
        key_field=f"{where}detail.object.key",
        created=detail_type == EVENTBRIDGE_OBJECT_CREATED,
        event_name=detail_type,
        bucket=bucket_name,
        key=obj["key"],
        etag=_optional_str(obj.get("etag")),
        version_id=_optional_str(obj.get("version-id")),
        sequencer=_optional_str(obj.get("sequencer")),
        size=obj.get("size"),
        event_time=_optional_str(data.get("time")),
    )


def _optional_str(value: Any) -> str | None:
    if value is None or value == "":
        return None
    return str(value).strip('"')


def _uploads(outcomes: Sequence[_ObjectEvent | str]) -> Uploads | Malformed:
    uploads: list[Upload] = []
    skipped: list[str] = []
    for outcome in outcomes:
        if isinstance(outcome, _ObjectEvent):
            outcome = _upload_of(outcome)
        if isinstance(outcome, Upload):
            uploads.append(outcome)
        elif outcome.startswith("skip:"):
            skipped.append(outcome.removeprefix("skip:"))
        elif outcome.startswith(BAD_KEY_MARK):
            # A key that names no episode is logged and left, so it reaches the DLQ.
            return Malformed(outcome.removeprefix(BAD_KEY_MARK), kind=BAD_KEY)
        else:
            return Malformed(outcome)
    return Uploads(uploads=tuple(uploads), skipped=tuple(skipped))


def _parse_event(data: Any, where: str = "") -> ParsedBody:
    """A decoded body (or an SNS envelope's decoded `Message`, `where` = "Message: ")."""
    if not isinstance(data, Mapping):
        return Malformed(f"{where}body is JSON {type(data).__name__}, not an object")
    if data.get("Event") == TEST_EVENT:
        bucket = data.get("Bucket")
        return TestEvent(bucket=bucket if isinstance(bucket, str) else None)
    if "TopicArn" in data and "Type" in data:
        return _parse_sns(data, where)
    if data.get("source") == EVENTBRIDGE_SOURCE and "detail-type" in data:
        return _uploads([_eventbridge_event(where, data)])
    records = data.get("Records")
    if not isinstance(records, list) or not records:
        return Malformed(f"{where}body is not an S3 event: no Records list")
    return _uploads(
        [_record_event(f"{where}Records[{index}]", record) for index, record in enumerate(records)]
    )


def _parse_sns(envelope: Mapping[str, Any], where: str) -> ParsedBody:
    """An SNS notification (raw message delivery off): the S3 event is its `Message` string."""
    kind = envelope.get("Type")
    if where:
        return Malformed(f"{where}an SNS envelope inside an SNS envelope")
    if kind != SNS_NOTIFICATION:
        return Malformed(f"SNS {kind} message from {envelope.get('TopicArn')}, not an S3 event")
    message = envelope.get("Message")
    if not isinstance(message, str):
        return Malformed("SNS notification has no Message string")
    try:
        inner = json.loads(message)
    except ValueError as error:
        return Malformed(f"SNS Message is not JSON: {error}")
    return _parse_event(inner, where="Message: ")


def parse_body(body: str) -> ParsedBody:
    """One SQS message body → TestEvent, Uploads or Malformed (with a reason naming the field)."""
    try:
        data = json.loads(body)
    except (TypeError, ValueError) as error:
        return Malformed(f"body is not JSON: {error}")
    return _parse_event(data)


def receive_count_of(message: Mapping[str, Any]) -> int:
    """`Attributes.ApproximateReceiveCount` (1 when not requested or unreadable)."""
    raw = (message.get("Attributes") or {}).get(RECEIVE_COUNT_ATTRIBUTE)
    try:
        return max(1, int(raw))
    except (TypeError, ValueError):
        return 1


def parse_message(message: Mapping[str, Any]) -> QueueMessage:
    """A message as boto3's `receive_message` returns it → QueueMessage."""
    body = message.get("Body")
    return QueueMessage(
        message_id=str(message.get("MessageId", "")),
        receipt_handle=str(message.get("ReceiptHandle", "")),
        receive_count=receive_count_of(message),
        body=parse_body(body) if isinstance(body, str) else Malformed("message has no Body"),
    )


@dataclass(frozen=True)
class Handoff:
    """One run to request: an upload and every message that announced it in this batch."""

    upload: Upload
    message_id: str
    receive_count: int
    receipt_handles: tuple[str, ...]


def handoffs(messages: Sequence[QueueMessage]) -> list[Handoff]:
    """One Handoff per partition: moto's two multipart events (or S3's duplicate
    deliveries) become one run holding both receipt handles, and a partition key appears once.

    When one batch holds two different versions of the same episode, the later event wins (the
    run processes whatever the key holds now) and keeps the other message's handle too, so both
    messages are deleted when that run succeeds. It takes the highest receive count.
    """
    by_partition: dict[str, Handoff] = {}
    for message in messages:
        if not isinstance(message.body, Uploads):
            continue
        for upload in message.body.uploads:
            handoff = Handoff(
                upload=upload,
                message_id=message.message_id,
                receive_count=message.receive_count,
                receipt_handles=(message.receipt_handle,),
            )
            previous = by_partition.get(upload.partition_key)
            if previous is not None:
                newer, older = handoff, previous
                if (upload.event_time or "") < (previous.upload.event_time or ""):
                    newer, older = previous, handoff
                handles = dict.fromkeys((*newer.receipt_handles, *older.receipt_handles))
                # The highest receive count: a redelivery merged with a fresh event of the same
                # version must not reuse the run key of the attempt that failed.
                handoff = replace(
                    newer,
                    receive_count=max(newer.receive_count, older.receive_count),
                    receipt_handles=tuple(handles),
                )
            by_partition[upload.partition_key] = handoff
    return list(by_partition.values())
