"""A tick's intake from the upload queue (I/O, no Dagster): a bounded batch received, the new
uploads' objects read back from the data bucket side by side, and where each run transcodes
from the size S3 reports (never the event's)."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from botocore.exceptions import BotoCoreError, ClientError

from episode_pipeline.config.settings import TranscodeSettings
from episode_pipeline.runtime import metrics
from episode_pipeline.storage.bucket import Bucket, ObjectInfo
from episode_pipeline.transcode.placement import Placement, place
from episode_pipeline.uploads.events import QueueMessage, parse_message
from episode_pipeline.uploads.upload_queue import UploadQueue

# A tick stays far below the 60 s gRPC limit: ≤ 30 receives of ≤ 10 messages, 1 s long poll,
# and one query for the runs of all of them. 300 uploads a tick every 10 s: 1,000 queued at once
# become run requests within four ticks (benchmarks/sensor.py measures it).
RECEIVE_CALLS_PER_TICK = 30
RECEIVE_WAIT_SECONDS = 1
# The HEADs of a tick's new uploads go side by side: 300 in a burst cost about 20 of one.
HEAD_THREADS = 16


def receive_batch(
    queue: UploadQueue,
    calls: int = RECEIVE_CALLS_PER_TICK,
    wait_seconds: int = RECEIVE_WAIT_SECONDS,
) -> list[QueueMessage]:
    """Up to `calls` receives; stops at an empty answer or a message already seen this tick."""
    seen: dict[str, QueueMessage] = {}
    for call in range(calls):
        raw = queue.receive(wait_seconds=wait_seconds if call == 0 else 0)
        fresh = [parse_message(m) for m in raw if m.get("MessageId") not in seen]
        for message in fresh:
            seen[message.message_id] = message
        if not raw or len(fresh) < len(raw):
            break
    metrics.count(metrics.UPLOADS_RECEIVED, len(seen))
    return list(seen.values())


ObjectHead = ObjectInfo | None | Exception  # what HEAD said: the object, 404, or its error


def head_objects(bucket: Bucket, keys: Iterable[str]) -> dict[str, ObjectHead]:
    """HEAD each key once, side by side (one tick's new uploads): its ObjectInfo, None when it
    does not exist, or the error that kept S3 from saying."""
    unique = list(dict.fromkeys(keys))
    if not unique:
        return {}

    def head(key: str) -> ObjectHead:
        try:
            return bucket.head(key)
        except (BotoCoreError, ClientError) as error:
            return error

    with ThreadPoolExecutor(max_workers=min(HEAD_THREADS, len(unique))) as pool:
        return dict(zip(unique, pool.map(head, unique), strict=True))


def sized_placement(
    event_size: int | None, head: ObjectHead, transcode: TranscodeSettings
) -> tuple[Placement | None, str]:
    """Where the run transcodes and its task size, from S3's size of the object (the event's
    is never trusted), and what the tick log says about it; None (unplaced: the run
    coordinator sizes it from the episode's listing) when the HEAD failed."""
    if isinstance(head, Exception) or head is None:
        return None, (
            f"HEAD failed ({head}): requested unplaced, the run coordinator sizes it from the "
            "episode's listing"
        )
    placement = place(head.size, None, transcode)
    said = "" if event_size == head.size else f"; the event said {event_size} B"
    return placement, (
        f"transcode: {placement.mode} ({placement.reason}; S3 says {head.size} B{said})"
    )
