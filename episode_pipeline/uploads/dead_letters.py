"""The dead-letter queue, for operators: see what failed three times, and send it back.

An upload message whose runs failed on 3 receives is moved by SQS to the dead-letter queue
(infra/queue.tf; the local stack does the same). `peek` lists those messages without consuming
them; `redrive` puts chosen ones back on the upload queue, where the sensor picks them up and —
their upload's latest run having failed — starts one retry (docs/contract.md#upload-queue).
The same code runs against the local stack and, with the production settings, against AWS;
`episode-pipeline dlq list|redrive` is the command.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from episode_pipeline.uploads.events import (
    Malformed,
    ParsedBody,
    TestEvent,
    Upload,
    Uploads,
    parse_body,
)
from episode_pipeline.uploads.reasons import NO_WORK, Reason
from episode_pipeline.uploads.upload_queue import MAX_BATCH, UploadQueue

SENT_ATTRIBUTE = "SentTimestamp"
FIRST_RECEIVE_ATTRIBUTE = "ApproximateFirstReceiveTimestamp"
RECEIVE_COUNT = "ApproximateReceiveCount"
# While listing, each message is hidden this long so the next receive returns the others; all
# are made visible again at the end.
PEEK_HIDE_SECONDS = 30
MAX_PEEK = 10_000


@dataclass(frozen=True)
class DeadLetter:
    """One message on the dead-letter queue and what it announced."""

    message_id: str
    receipt_handle: str
    body: str
    receive_count: int
    sent_at: datetime | None  # when S3 sent the event, i.e. about when the upload finished
    uploads: tuple[Upload, ...]
    body_reason: Reason | None  # why the body announces no upload (malformed, a bad key, …)

    @property
    def problem(self) -> str | None:
        return self.body_reason.text if self.body_reason else None

    @property
    def episodes(self) -> list[str]:
        return list(dict.fromkeys(u.partition_key for u in self.uploads))


def _when(milliseconds: str | None) -> datetime | None:
    try:
        return datetime.fromtimestamp(int(milliseconds or "") / 1000, UTC)
    except ValueError:
        return None


def body_reason(parsed: ParsedBody) -> Reason | None:
    """Why a body announces no upload (the same parse as the sensor's), None when it does: a
    malformed body or a key naming no episode is left by the sensor until dead-lettered; a body
    asking for no work is deleted by the sensor, so it is here only if the sensor never saw it."""
    if isinstance(parsed, Malformed):
        return Reason(parsed.kind, parsed.reason)
    if isinstance(parsed, TestEvent):
        return Reason(NO_WORK, "s3:TestEvent")
    if not parsed.uploads:
        return Reason(NO_WORK, "; ".join(parsed.skipped) or "no upload records")
    return None


def as_dead_letter(message: dict) -> DeadLetter:
    """A received SQS message (with its attributes) → DeadLetter."""
    attributes = message.get("Attributes") or {}
    body = str(message.get("Body", ""))
    parsed = parse_body(body)
    return DeadLetter(
        message_id=str(message.get("MessageId", "")),
        receipt_handle=str(message.get("ReceiptHandle", "")),
        body=body,
        receive_count=int(attributes.get(RECEIVE_COUNT) or 0),
        sent_at=_when(attributes.get(SENT_ATTRIBUTE)),
        uploads=parsed.uploads if isinstance(parsed, Uploads) else (),
        body_reason=body_reason(parsed),
    )


def peek(dlq: UploadQueue, limit: int = MAX_PEEK) -> list[DeadLetter]:
    """Every message on the dead-letter queue (up to `limit`), left on it.

    Each is received once, hidden for `PEEK_HIDE_SECONDS` so the next receive returns others,
    then made visible again. Messages another reader holds are not seen.
    """
    seen: dict[str, DeadLetter] = {}
    while len(seen) < limit:
        batch = dlq.receive(
            MAX_BATCH,
            visibility_seconds=PEEK_HIDE_SECONDS,
            attributes=(RECEIVE_COUNT, SENT_ATTRIBUTE, FIRST_RECEIVE_ATTRIBUTE),
        )
        fresh = [as_dead_letter(m) for m in batch if m.get("MessageId") not in seen]
        if not fresh:
            break
        seen.update((letter.message_id, letter) for letter in fresh)
    letters = list(seen.values())
    if letters:
        dlq.extend_visibility_many([letter.receipt_handle for letter in letters], 0)
    return sorted(letters, key=lambda letter: letter.sent_at or datetime.min.replace(tzinfo=UTC))


def select(letters: Iterable[DeadLetter], episode: str | None) -> list[DeadLetter]:
    """The letters announcing `episode` (ORG/EP), or all of them when it is None."""
    return [letter for letter in letters if episode is None or episode in letter.episodes]


def redrive(dlq: UploadQueue, queue: UploadQueue, letters: Iterable[DeadLetter]) -> list[str]:
    """Move `letters` back to the upload queue: sent first, then deleted from the dead-letter
    queue, so a crash in between duplicates a message (harmless: the sensor decides by the
    upload's runs) rather than losing one. Returns the new message ids."""
    moved = []
    for letter in letters:
        moved.append(queue.send(letter.body))
        dlq.delete(letter.receipt_handle)
    return moved
