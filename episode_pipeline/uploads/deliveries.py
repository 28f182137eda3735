"""A batch of upload-queue deliveries, before any run is looked at (pure): which messages a run
holds (`HeldMessage`; the run keeps them in its `sqs` tag, `orchestration/upload_runs.py`), and
what the batch asks for (`plan_batch`: delete, leave, or hand an upload to a run)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from episode_pipeline.uploads.events import (
    Handoff,
    Malformed,
    QueueMessage,
    TestEvent,
    Uploads,
    handoffs,
)

# -- the messages a run holds -------------------------------------------------------------------


@dataclass(frozen=True)
class HeldMessage:
    """One queue message a run holds: deleted when the run succeeds, renewed while it works.

    `other_episodes` are the partitions the same message also announced (S3 sends one record per
    message, but the format allows more): it is deleted only once their runs succeeded too.
    """

    message_id: str
    receipt_handle: str
    receive_count: int
    other_episodes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        item: dict[str, Any] = {
            "id": self.message_id,
            "receipt": self.receipt_handle,
            "receives": self.receive_count,
        }
        if self.other_episodes:
            item["also"] = list(self.other_episodes)
        return item


def merge_held(held: Iterable[HeldMessage], delivered: Iterable[HeldMessage]) -> list[HeldMessage]:
    """One entry per message id; a later delivery's receipt handle replaces the stale one."""
    by_id: dict[str, HeldMessage] = {}
    for message in [*held, *delivered]:
        known = by_id.get(message.message_id)
        if known is None or message.receive_count >= known.receive_count:
            by_id[message.message_id] = message
    return list(by_id.values())


def held_by(handoff: Handoff, batch: Sequence[QueueMessage]) -> list[HeldMessage]:
    """The messages of this batch that announced the handoff's upload."""
    own = handoff.upload.partition_key
    held = []
    for message in batch:
        if message.receipt_handle not in handoff.receipt_handles:
            continue
        announced = message.body.uploads if isinstance(message.body, Uploads) else ()
        others = sorted({u.partition_key for u in announced} - {own})
        held.append(
            HeldMessage(
                message.message_id, message.receipt_handle, message.receive_count, tuple(others)
            )
        )
    return held


# -- what one batch asks for --------------------------------------------------------------------


@dataclass
class TickPlan:
    """What one batch of messages asks for, before looking at existing runs."""

    delete: list[str] = field(default_factory=list)  # receipt handles
    deleted_reasons: list[str] = field(default_factory=list)
    malformed: list[tuple[str, Malformed]] = field(default_factory=list)  # (message id, why)
    handoffs: list[Handoff] = field(default_factory=list)


def plan_batch(messages: Sequence[QueueMessage]) -> TickPlan:
    """Sort a batch: test events and no-work events to delete, malformed to leave, uploads."""
    plan = TickPlan()
    for message in messages:
        body = message.body
        if isinstance(body, TestEvent):
            plan.delete.append(message.receipt_handle)
            plan.deleted_reasons.append(f"{message.message_id}: s3:TestEvent")
        elif isinstance(body, Malformed):
            plan.malformed.append((message.message_id, body))
        elif isinstance(body, Uploads) and not body.uploads:
            plan.delete.append(message.receipt_handle)
            why = "; ".join(body.skipped) or "no records"
            plan.deleted_reasons.append(f"{message.message_id}: no raw archive ({why})")
    plan.handoffs = handoffs(messages)
    return plan
