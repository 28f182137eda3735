"""The upload queue drives processing (docs/contract.md#upload-queue), in three small sensors.

- `episode_uploads` receives a bounded batch per tick: an `s3:TestEvent` (or an event
  that asks for no work) is deleted; a malformed body is logged and left, so after 3 receives
  SQS moves it to the dead-letter queue; each uploaded archive becomes a run request for its
  episode partition (added when new). Upload messages are *not* deleted here: the receipt
  handle travels with the run as a tag.
- `episode_upload_done` deletes the message when its run succeeds (the message is deleted only
  after a successful run). A failed run deletes nothing; the
  run-failure sensor marks the episode failed and the message comes back after its visibility
  timeout with a higher receive count, hence a new run key and a retry.
- `episode_upload_heartbeat` renews the visibility of messages whose runs are queued or
  running, so a slow or queued run is not redelivered mid-flight.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    RunStatusSensorContext,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    run_status_sensor,
    sensor,
)
from dagster._core.storage.tags import RUN_KEY_TAG, SENSOR_NAME_TAG

from episode_pipeline.defs.jobs import EPISODE_JOB_NAME
from episode_pipeline.defs.resources.sqs import UploadQueueResource
from episode_pipeline.defs.runs import (
    IN_FLIGHT_STATUSES,
    ORG_TAG,
    new_partitions_request,
    retry_run_key,
    runs_in_flight,
    upload_run_key,
)
from episode_pipeline.events import (
    Handoff,
    Malformed,
    QueueMessage,
    TestEvent,
    Uploads,
    handoffs,
    parse_message,
)
from episode_pipeline.upload_queue import UploadQueue

UPLOADS_SENSOR_NAME = "episode_uploads"

RECEIPT_HANDLE_TAG = "episode_pipeline/sqs_receipt_handle"
EXTRA_RECEIPT_HANDLES_TAG = "episode_pipeline/sqs_extra_receipt_handles"  # JSON list
MESSAGE_ID_TAG = "episode_pipeline/sqs_message_id"
RECEIVE_COUNT_TAG = "episode_pipeline/receive_count"
ARCHIVE_KEY_TAG = "episode_pipeline/archive_key"
ARCHIVE_VERSION_TAG = "episode_pipeline/archive_version"

# A tick stays far below the 60 s gRPC limit: ≤ 5 receives of ≤ 10 messages, 1 s long poll.
RECEIVE_CALLS_PER_TICK = 5
RECEIVE_WAIT_SECONDS = 1
NOT_CONFIGURED = "the upload queue is not configured (SQS_QUEUE_URL is unset)"


# -- pure helpers -------------------------------------------------------------------------------


def run_tags(handoff: Handoff) -> dict[str, str]:
    """What a run needs to find its messages again (delete on success, heartbeat meanwhile)."""
    tags = {
        ORG_TAG: handoff.upload.ref.org_id,
        RECEIPT_HANDLE_TAG: handoff.receipt_handles[0],
        MESSAGE_ID_TAG: handoff.message_id,
        RECEIVE_COUNT_TAG: str(handoff.receive_count),
        ARCHIVE_KEY_TAG: handoff.upload.key,
        ARCHIVE_VERSION_TAG: handoff.upload.object_version,
    }
    if len(handoff.receipt_handles) > 1:
        tags[EXTRA_RECEIPT_HANDLES_TAG] = json.dumps(list(handoff.receipt_handles[1:]))
    return tags


def run_key_of(handoff: Handoff) -> str:
    upload = handoff.upload
    return upload_run_key(upload.partition_key, upload.object_version, handoff.receive_count)


def run_request_for(handoff: Handoff, run_key: str | None = None) -> RunRequest:
    return RunRequest(
        run_key=run_key or run_key_of(handoff),
        partition_key=handoff.upload.partition_key,
        tags=run_tags(handoff),
    )


def receipt_handles_of(tags: Mapping[str, str]) -> list[str]:
    """Every receipt handle a run holds (its own and duplicates merged into it)."""
    handles = [tags[RECEIPT_HANDLE_TAG]] if tags.get(RECEIPT_HANDLE_TAG) else []
    try:
        extra = json.loads(tags.get(EXTRA_RECEIPT_HANDLES_TAG) or "[]")
    except ValueError:
        extra = []
    handles.extend(str(handle) for handle in extra if handle)
    return list(dict.fromkeys(handles))


def with_extra_handles(tags: Mapping[str, str], handles: Iterable[str]) -> dict[str, str]:
    """The tag update that adds `handles` to a run's extra receipt handles."""
    known = receipt_handles_of(tags)
    extra = [h for h in dict.fromkeys([*known[1:], *handles]) if h not in known[:1]]
    return {EXTRA_RECEIPT_HANDLES_TAG: json.dumps(extra)}


@dataclass
class TickPlan:
    """What one batch of messages asks for, before looking at existing runs."""

    delete: list[str] = field(default_factory=list)  # receipt handles
    deleted_reasons: list[str] = field(default_factory=list)
    malformed: list[tuple[str, str]] = field(default_factory=list)  # (message id, reason)
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
            plan.malformed.append((message.message_id, body.reason))
        elif isinstance(body, Uploads) and not body.uploads:
            plan.delete.append(message.receipt_handle)
            why = "; ".join(body.skipped) or "no records"
            plan.deleted_reasons.append(f"{message.message_id}: no raw archive ({why})")
    plan.handoffs = handoffs(messages)
    return plan


# -- I/O ----------------------------------------------------------------------------------------


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
    return list(seen.values())


def _existing_run(instance: DagsterInstance, run_key: str) -> DagsterRun | None:
    runs = instance.get_runs(
        RunsFilter(tags={RUN_KEY_TAG: run_key, SENSOR_NAME_TAG: UPLOADS_SENSOR_NAME}), limit=1
    )
    return runs[0] if runs else None


def evaluate_uploads(
    context: SensorEvaluationContext, queue: UploadQueue
) -> SensorResult | SkipReason:
    """One tick of the uploads sensor (see the module docstring)."""
    if not queue.configured:
        return SkipReason(NOT_CONFIGURED)
    messages = receive_batch(queue)
    if not messages:
        return SkipReason("no messages on the upload queue")
    plan = plan_batch(messages)
    for receipt_handle, reason in zip(plan.delete, plan.deleted_reasons, strict=True):
        queue.delete(receipt_handle)
        context.log.info(f"deleted message {reason}")
    for message_id, reason in plan.malformed:
        context.log.warning(
            f"upload queue message {message_id} left on the queue (it reaches the dead-letter "
            f"queue after 3 receives): {reason}"
        )

    instance = context.instance
    run_requests: list[RunRequest] = []
    for handoff in plan.handoffs:
        run_key = run_key_of(handoff)
        existing = _existing_run(instance, run_key)
        if existing is None:
            run_requests.append(run_request_for(handoff))
        elif existing.status == DagsterRunStatus.SUCCESS:
            # A second event for an object version already processed (moto multipart, S3's
            # at-least-once delivery): the work is done, so the message can go.
            for handle in handoff.receipt_handles:
                queue.delete(handle)
            context.log.info(f"{run_key}: run {existing.run_id} already succeeded")
        elif existing.status in IN_FLIGHT_STATUSES:
            instance.add_run_tags(
                existing.run_id, with_extra_handles(existing.tags, handoff.receipt_handles)
            )
            context.log.info(f"{run_key}: handed to in-flight run {existing.run_id}")
        else:
            # Failed or canceled, and this is a fresh event for the same object version (the
            # robot uploaded the same bytes again, or a late duplicate): a new attempt now.
            retry_key = retry_run_key(run_key, existing.run_id)
            run_requests.append(run_request_for(handoff, retry_key))
            context.log.info(
                f"{run_key}: run {existing.run_id} is {existing.status.value}; "
                f"requesting {retry_key}"
            )

    return SensorResult(
        run_requests=run_requests,
        dynamic_partitions_requests=new_partitions_request(
            instance, [r.partition_key for r in run_requests if r.partition_key]
        ),
    )


def _message_runs_all_succeeded(instance: DagsterInstance, run: DagsterRun) -> bool:
    """A message announcing several archives is done only when every one of its runs is."""
    message_id = run.tags.get(MESSAGE_ID_TAG)
    if not message_id:
        return run.status == DagsterRunStatus.SUCCESS
    siblings = instance.get_runs(
        RunsFilter(
            job_name=run.job_name,
            tags={
                MESSAGE_ID_TAG: message_id,
                RECEIVE_COUNT_TAG: run.tags.get(RECEIVE_COUNT_TAG, ""),
            },
        )
    )
    return all(
        sibling.status == DagsterRunStatus.SUCCESS
        for sibling in siblings
        if sibling.run_id != run.run_id
    )


def delete_messages_of_run(
    instance: DagsterInstance, run: DagsterRun, queue: UploadQueue, log: Any
) -> int:
    """Delete the messages a succeeded run was handed; returns how many were deleted.

    A stale receipt handle (expired or superseded by a redelivery) is logged and ignored: the
    next delivery finds the episode processed and re-runs it idempotently.
    """
    handles = receipt_handles_of(run.tags)
    if not handles or not queue.configured:
        return 0
    if not _message_runs_all_succeeded(instance, run):
        log.info(f"run {run.run_id}: other runs for its message are not done; message kept")
        return 0
    deleted = 0
    for handle in handles:
        if queue.delete(handle):
            deleted += 1
        else:
            log.info(
                f"run {run.run_id}: receipt handle expired or superseded, message not deleted "
                "(a redelivery will re-run the episode idempotently)"
            )
    return deleted


def keep_in_flight(instance: DagsterInstance, queue: UploadQueue, log: Any) -> int:
    """Renew the visibility of every message whose run is queued or running; returns how many."""
    runs = runs_in_flight(instance, EPISODE_JOB_NAME)
    owner: dict[str, str] = {}
    for run in runs:
        for handle in receipt_handles_of(run.tags):
            owner[handle] = run.run_id
    if not owner:
        return 0
    failed = queue.extend_visibility_many(list(owner))
    for handle, error in failed.items():
        log.warning(
            f"run {owner[handle]}: could not keep its upload message in flight ({error}); it "
            "may be delivered again while the run works"
        )
    return len(owner) - len(failed)


# -- sensors ------------------------------------------------------------------------------------


@sensor(
    job_name=EPISODE_JOB_NAME,
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=10,
    description="Receives upload notifications from SQS and requests one run per uploaded "
    "archive (adding its episode partition). Messages are deleted when their run succeeds.",
)
def episode_uploads(context: SensorEvaluationContext, upload_queue: UploadQueueResource):
    return evaluate_uploads(context, upload_queue.get_client())


@run_status_sensor(
    run_status=DagsterRunStatus.SUCCESS,
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=10,
    description="Deletes a run's upload message from SQS once the run succeeded.",
)
def episode_upload_done(context: RunStatusSensorContext, upload_queue: UploadQueueResource):
    run = context.dagster_run
    queue = upload_queue.get_client()
    if run.job_name != EPISODE_JOB_NAME or not receipt_handles_of(run.tags):
        return SkipReason(f"run {run.run_id} holds no upload message")
    if not queue.configured:
        return SkipReason(NOT_CONFIGURED)
    deleted = delete_messages_of_run(context.instance, run, queue, context.log)
    context.log.info(f"run {run.run_id} succeeded: deleted {deleted} upload message(s)")
    return None


@sensor(
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=240,
    description="Renews the SQS visibility of upload messages whose runs are queued or running, "
    "so they are not delivered again mid-run (15-minute visibility, renewed every 4 minutes).",
)
def episode_upload_heartbeat(context: SensorEvaluationContext, upload_queue: UploadQueueResource):
    queue = upload_queue.get_client()
    if not queue.configured:
        return SkipReason(NOT_CONFIGURED)
    renewed = keep_in_flight(context.instance, queue, context.log)
    return SkipReason(f"renewed the visibility of {renewed} in-flight upload message(s)")


UPLOAD_QUEUE_SENSORS = [episode_uploads, episode_upload_done, episode_upload_heartbeat]
