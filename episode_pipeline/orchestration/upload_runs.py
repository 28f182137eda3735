"""Where an upload becomes a run: the upload queue drives processing (docs/contract.md#upload-queue)
through the three sensors of `defs/sensors/sqs.py`, each a call to one function here.

Every upload is handled exactly once: one successful run per object version, however often its
message is delivered and whatever crashes in between. The run key is the upload itself
(`ORG/EP@<object version>`, `instance/run_tags.upload_run_key`), never the receive count, and each
delivery is decided by the upload's latest run:

| Latest run of the upload | What the delivery does                                        |
| ------------------------ | ------------------------------------------------------------- |
| none                     | requests the run (key = the upload)                           |
| pruned after it succeeded| deletes the message, starts nothing (docs/retention.md)       |
| queued or running        | joins it: the message is added to the run's `sqs` tag         |
| crashed, Dagster retries | joins it (`run_retries`: the retry run inherits its tags)     |
| succeeded                | deletes the message, starts nothing                           |
| failed or canceled       | requests one retry (key derived from the failed run's id)     |

- `episode_uploads` receives a bounded batch per tick: an `s3:TestEvent` (or an event that asks
  for no work) is deleted; a malformed body is logged and left, so after 3 receives SQS moves it
  to the dead-letter queue; each upload is decided as above. Messages are *not* deleted when a
  run is requested: they travel with the run in one compact tag (`episode_pipeline/sqs`).
- Before a run is requested the object is read back (`HeadObject`, side by side for the batch):
  the run's task is sized from the size S3 reports, never from the event's `size` (a relay can
  lie). An event for an object that does not exist (HEAD 404: forged, or deleted since) gets no
  partition and no run, and its message is left like a malformed one: it comes back after its
  visibility timeout, is looked at again, and after 3 receives waits in the dead-letter queue
  (`episode-pipeline dlq list`, which says "no object at s3://…": the tick records why it left each
  message, `uploads/reasons.py`). Not deleting it keeps "no upload is lost" even where a 404
  could be transient (a store less consistent than S3, a relay that announces before the PUT
  lands): the next receive sees the object, and a redrive from the DLQ still works. Should the
  HEAD fail otherwise (S3 slow or refusing), the run is requested unplaced and the run
  coordinator sizes it from the episode's listing (`instance/run_coordinator.py`).
- `episode_upload_done` deletes a run's messages when it succeeds. A failed run deletes
  nothing: the message comes back after its visibility timeout and gets one retry.
- `episode_upload_heartbeat` renews the visibility of messages whose runs are queued or
  running, so a slow or queued run is not delivered again mid-flight (if it is, it joins).

Each tick logs which uploads it saw, what it decided for each (run key requested, run joined,
message deleted) and which messages it skipped and why. Every message it leaves on its way to the
dead-letter queue (malformed, a bad key, no object, a redelivery that finds no run, a failed run,
a lapsed in-flight run) is a warning naming the message and its reason, a `MessagesLeft` count
by `Reason`, and a record `dlq list` reads (`uploads/reasons.py`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    RunRequest,
    RunStatusSensorContext,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
)

from episode_pipeline.config.settings import TranscodeSettings
from episode_pipeline.episodes.keys import parse_partition_key
from episode_pipeline.instance.app_state import (
    pruned_successes,
    record_dead_letter_reasons,
    recorded_dead_letter_reasons,
)
from episode_pipeline.instance.run_tags import (
    EPISODE_JOB_NAME,
    IN_FLIGHT_STATUSES,
    PARTITION_TAG,
    SQS_TAG,
    UPLOAD_TAG,
    episode_tags,
    placement_tags,
    retry_run_key,
    upload_id,
    upload_run_key,
)
from episode_pipeline.orchestration.archive_versions import report_archive_version
from episode_pipeline.orchestration.runs import (
    known_partitions,
    latest_run_of_episode,
    latest_runs_of_uploads,
    new_partitions_request,
    runs_in_flight,
)
from episode_pipeline.runtime import metrics
from episode_pipeline.runtime.injection_points import reach
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.transcode.placement import Placement
from episode_pipeline.uploads import reasons
from episode_pipeline.uploads.deliveries import HeldMessage, held_by, merge_held, plan_batch
from episode_pipeline.uploads.events import Handoff
from episode_pipeline.uploads.intake import head_objects, receive_batch, sized_placement
from episode_pipeline.uploads.reasons import Reason, RecordedReason
from episode_pipeline.uploads.upload_queue import UploadQueue

NOT_CONFIGURED = "the upload queue is not configured (SQS_QUEUE_URL is unset)"

# Injection points (episode_pipeline.runtime.injection_points): where crash tests stop the daemon.
AFTER_RECEIVE = "uploads.after_receive"
BEFORE_DELETE_DONE = "upload_done.before_delete"
BEFORE_HEARTBEAT = "heartbeat.before_renew"


# -- the messages a run holds: its `sqs` tag ----------------------------------------------------


def held_messages(tags: Mapping[str, str]) -> list[HeldMessage]:
    """The messages in a run's `sqs` tag ([] for a run that holds none or an unreadable tag)."""
    try:
        items = json.loads(tags.get(SQS_TAG) or "[]")
    except ValueError:
        return []
    held = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and item.get("receipt"):
            held.append(
                HeldMessage(
                    message_id=str(item.get("id", "")),
                    receipt_handle=str(item["receipt"]),
                    receive_count=int(item.get("receives") or 1),
                    other_episodes=tuple(str(p) for p in item.get("also") or ()),
                )
            )
    return held


def sqs_tag(messages: Iterable[HeldMessage]) -> dict[str, str]:
    return {SQS_TAG: json.dumps([m.to_json() for m in messages], separators=(",", ":"))}


def upload_of(handoff: Handoff) -> str:
    return upload_id(handoff.upload.partition_key, handoff.upload.object_version)


def run_tags(
    handoff: Handoff, held: Iterable[HeldMessage], placement: Placement | None = None
) -> dict[str, str]:
    """Tags of a run started for an upload: the episode, the upload, the messages it holds, and
    where it transcodes with the size of its task (`transcode.placement`)."""
    return {
        **episode_tags(handoff.upload.partition_key),
        UPLOAD_TAG: upload_of(handoff),
        **sqs_tag(held),
        **(placement_tags(placement) if placement else {}),
    }


# -- why a message is left (Dagster's key-value table) ------------------------------------------


def latest_state(status: DagsterRunStatus | None) -> str | None:
    """An upload's latest run status as `uploads.reasons.UploadRuns` reads it."""
    if status is None:
        return None
    if status in IN_FLIGHT_STATUSES:
        return reasons.LATEST_IN_FLIGHT
    if status == DagsterRunStatus.SUCCESS:
        return reasons.LATEST_SUCCEEDED
    return reasons.LATEST_FAILED


# -- what one delivery does (pure) --------------------------------------------------------------


class Outcome(Enum):
    START = "start"
    JOIN = "join"
    DONE = "done"
    DONE_PRUNED = "done_pruned"  # succeeded; its runs were deleted by the retention policy
    RETRY = "retry"
    AWAIT_RETRY = "await_retry"  # failed, and Dagster's `run_retries` is about to re-run it


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    upload: str
    run_key: str | None = None  # START and RETRY
    run_id: str | None = None  # the latest run, when there is one

    def describe(self) -> str:
        if self.outcome is Outcome.START:
            return f"{self.upload}: no run yet: requested run key {self.run_key}"
        if self.outcome is Outcome.JOIN:
            return f"{self.upload}: joined in-flight run {self.run_id}"
        if self.outcome is Outcome.AWAIT_RETRY:
            return (
                f"{self.upload}: run {self.run_id} failed and Dagster retries it (run_retries): "
                "joined it, for its retry run"
            )
        if self.outcome is Outcome.DONE:
            return f"{self.upload}: run {self.run_id} already succeeded: message deleted"
        if self.outcome is Outcome.DONE_PRUNED:
            return (
                f"{self.upload}: run {self.run_id} succeeded and was pruned since "
                "(docs/retention.md): message deleted"
            )
        return f"{self.upload}: run {self.run_id} did not succeed: requested retry {self.run_key}"


def decide(upload: str, latest: DagsterRun | None, pruned_success: str | None = None) -> Decision:
    """The table in the module docstring; `pruned_success` is the id of the upload's successful
    run whose runs the retention policy deleted (`app_state.pruned_successes`)."""
    if latest is None and pruned_success is not None:
        return Decision(Outcome.DONE_PRUNED, upload, run_id=pruned_success)
    if latest is None:
        return Decision(Outcome.START, upload, run_key=upload_run_key(upload))
    if latest.status == DagsterRunStatus.SUCCESS:
        return Decision(Outcome.DONE, upload, run_id=latest.run_id)
    if latest.status in IN_FLIGHT_STATUSES:
        return Decision(Outcome.JOIN, upload, run_id=latest.run_id)
    # A crashed run Dagster will re-run (`dagster/will_retry`, no retry run yet): a retry of our
    # own would process the upload a second time beside Dagster's.
    if latest.is_complete_and_waiting_to_retry:
        return Decision(Outcome.AWAIT_RETRY, upload, run_id=latest.run_id)
    return Decision(
        Outcome.RETRY,
        upload,
        run_key=retry_run_key(upload, latest.run_id),
        run_id=latest.run_id,
    )


# -- the sensors' ticks -------------------------------------------------------------------------


def evaluate_uploads(
    context: SensorEvaluationContext,
    queue: UploadQueue,
    bucket: Bucket,
    transcode: TranscodeSettings | None = None,
) -> SensorResult | SkipReason:
    """One tick of the uploads sensor (see the module docstring); each new upload's object is
    read back from `bucket` (the data bucket), and `transcode` decides from its size where the
    run transcodes and how big its task is."""
    transcode = transcode or TranscodeSettings()
    if not queue.configured:
        return SkipReason(NOT_CONFIGURED)
    messages = receive_batch(queue)
    if not messages:
        return SkipReason("no messages on the upload queue")
    log = context.log
    log.info(
        f"received {len(messages)} message(s): "
        + ", ".join(f"{m.message_id} (receive {m.receive_count})" for m in messages)
    )
    plan = plan_batch(messages)
    reach(AFTER_RECEIVE, about=" ".join(h.upload.partition_key for h in plan.handoffs))
    for receipt_handle, reason in zip(plan.delete, plan.deleted_reasons, strict=True):
        queue.delete(receipt_handle)
        log.info(f"skipped and deleted message {reason}")
    for message_id, malformed in plan.malformed:
        metrics.count_reason(metrics.MESSAGES_LEFT, malformed.kind)
        log.warning(
            f"skipped message {message_id}, left on the queue (it reaches the dead-letter "
            f"queue after 3 receives): {malformed.kind}: {malformed.reason}"
        )

    instance = context.instance
    run_requests: list[RunRequest] = []
    latest_runs = latest_runs_of_uploads(instance, [upload_of(h) for h in plan.handoffs])
    pruned = pruned_successes(
        instance, [u for u in map(upload_of, plan.handoffs) if u not in latest_runs]
    )
    known = known_partitions(instance, [h.upload.partition_key for h in plan.handoffs])
    decisions = [
        decide(u, latest_runs.get(u), pruned.get(u)) for u in map(upload_of, plan.handoffs)
    ]
    wanted = (Outcome.START, Outcome.RETRY)
    heads = head_objects(
        bucket,
        [
            h.upload.key
            for h, d in zip(plan.handoffs, decisions, strict=True)
            if d.outcome in wanted
        ],
    )
    held_of = [held_by(h, messages) for h in plan.handoffs]
    # Only a redelivery of an upload with no run yet needs what an earlier receive recorded.
    earlier = recorded_dead_letter_reasons(
        instance,
        [
            m.message_id
            for held, d in zip(held_of, decisions, strict=True)
            if d.outcome is Outcome.START
            for m in held
            if m.receive_count > 1
        ],
    )
    left: dict[str, RecordedReason] = {}  # message id → why: recorded for `dlq list`

    def leave(held: Sequence[HeldMessage], why: Reason) -> None:
        for message in held:
            metrics.count_reason(metrics.MESSAGES_LEFT, why.kind)
            left[message.message_id] = RecordedReason(
                why.kind, why.text, message.receive_count, time.time()
            )

    missing: list[str] = []
    for handoff, decision, held in zip(plan.handoffs, decisions, held_of, strict=True):
        upload = upload_of(handoff)
        log.info(
            f"saw upload {upload} (s3 key {handoff.upload.key}) in message(s) "
            + ", ".join(f"{m.message_id} (receive {m.receive_count})" for m in held)
        )
        latest = latest_runs.get(upload)
        where = ""
        if decision.outcome in wanted:
            head = heads[handoff.upload.key]
            receive = max(m.receive_count for m in held)
            if head is None:
                missing.append(upload)
                leave(held, reasons.no_object(f"s3://{bucket.name}/{handoff.upload.key}", receive))
                log.warning(
                    f"{upload}: s3://{bucket.name}/{handoff.upload.key} does not exist (HEAD "
                    "404: a forged event, or deleted since): no partition, no run; message(s) "
                    f"{', '.join(m.message_id for m in held)} left on the queue (back after "
                    f"the visibility timeout, in the dead-letter queue after 3 receives): "
                    f"{reasons.NO_OBJECT}"
                )
                continue
            if decision.outcome is Outcome.RETRY:
                assert latest is not None
                why = reasons.run_failed(upload, latest.run_id, receive)
                leave(held, why)
                log.warning(f"message(s) {', '.join(m.message_id for m in held)}: {why}")
            else:
                again = [
                    m
                    for m in held
                    if reasons.redelivered_without_run(m.receive_count, earlier.get(m.message_id))
                ]
                if again:
                    why = reasons.no_run(upload, max(m.receive_count for m in again))
                    leave(again, why)
                    log.warning(f"message(s) {', '.join(m.message_id for m in again)}: {why}")
            # A re-upload of a known episode shows stale while its run waits in the queue (a new
            # episode has nothing to be stale; one event per upload would halve the tick rate).
            if handoff.upload.etag and handoff.upload.partition_key in known:
                report_archive_version(instance, handoff.upload.partition_key, handoff.upload.etag)
            placement, sizing = sized_placement(handoff.upload.size, head, transcode)
            where = f"; {sizing}"
            run_requests.append(
                RunRequest(
                    run_key=decision.run_key,
                    partition_key=handoff.upload.partition_key,
                    tags=run_tags(handoff, held, placement),
                )
            )
        elif decision.outcome in (Outcome.DONE, Outcome.DONE_PRUNED):
            for message in held:
                if not _not_yet_succeeded(instance, message):
                    queue.delete(message.receipt_handle)
        else:
            assert latest is not None
            merged = merge_held(held_messages(latest.tags), held)
            instance.add_run_tags(latest.run_id, sqs_tag(merged))
            again = [m for m in held if m.receive_count > 1]
            if again:
                why = reasons.in_flight(upload, latest.run_id, max(m.receive_count for m in again))
                leave(again, why)
                log.warning(f"message(s) {', '.join(m.message_id for m in again)}: {why}")
        log.info(decision.describe() + where)

    # Kept before the runs are requested: a tick that fails after this still leaves its reasons.
    record_dead_letter_reasons(instance, left)
    requested = [r.run_key for r in run_requests]
    log.info(
        f"tick done: requested {len(requested)} run(s): {', '.join(map(str, requested))}"
        + (f"; {len(missing)} upload(s) of no object: {', '.join(missing)}" if missing else "")
    )
    return SensorResult(
        run_requests=run_requests,
        dynamic_partitions_requests=new_partitions_request(
            [r.partition_key for r in run_requests if r.partition_key], known
        ),
    )


def _not_yet_succeeded(instance: DagsterInstance, message: HeldMessage) -> list[str]:
    """The other episodes of a message whose latest run has not succeeded (yet)."""
    pending = []
    for partition_key in message.other_episodes:
        latest = latest_run_of_episode(instance, parse_partition_key(partition_key))
        if latest is None or latest.status != DagsterRunStatus.SUCCESS:
            pending.append(partition_key)
    return pending


def delete_messages_of_run(
    instance: DagsterInstance, run: DagsterRun, queue: UploadQueue, log: Any
) -> int:
    """Delete the messages a succeeded run holds; returns how many were deleted.

    A stale receipt handle (expired or superseded by a redelivery) is logged and ignored: the
    redelivered message finds this run succeeded and is deleted then.
    """
    deleted = 0
    for message in held_messages(run.tags):
        pending = _not_yet_succeeded(instance, message)
        if pending:
            log.info(
                f"run {run.run_id}: message {message.message_id} kept until the runs of "
                f"{', '.join(pending)} succeed"
            )
            continue
        reach(BEFORE_DELETE_DONE, about=run.tags.get(PARTITION_TAG, ""))
        if queue.delete(message.receipt_handle):
            deleted += 1
        else:
            log.info(
                f"run {run.run_id}: message {message.message_id}: receipt handle expired or "
                "superseded; its next delivery finds this run succeeded and is deleted then"
            )
    metrics.count(metrics.MESSAGES_DELETED, deleted)
    return deleted


def keep_in_flight(instance: DagsterInstance, queue: UploadQueue, log: Any) -> int:
    """Renew the visibility of every message whose run is queued or running; returns how many."""
    owner: dict[str, str] = {}
    episodes = []
    for run in runs_in_flight(instance, EPISODE_JOB_NAME):
        for message in held_messages(run.tags):
            owner[message.receipt_handle] = run.run_id
        episodes.append(f"{run.tags.get(PARTITION_TAG, '')}:{run.status.value}")
    if not owner:
        return 0
    reach(BEFORE_HEARTBEAT, about=" ".join(episodes))
    failed = queue.extend_visibility_many(list(owner))
    for handle, error in failed.items():
        log.warning(
            f"run {owner[handle]}: could not keep its upload message in flight ({error}); if it "
            "is delivered again it joins the run"
        )
    return len(owner) - len(failed)


def evaluate_upload_done(context: RunStatusSensorContext, queue: UploadQueue) -> None:
    """One succeeded run (the upload-done sensor): delete the upload messages it holds."""
    run = context.dagster_run
    if run.job_name != EPISODE_JOB_NAME or not held_messages(run.tags):
        context.log.debug(f"run {run.run_id} holds no upload message")
        return
    if not queue.configured:
        context.log.warning(f"run {run.run_id}: {NOT_CONFIGURED}")
        return
    deleted = delete_messages_of_run(context.instance, run, queue, context.log)
    context.log.info(f"run {run.run_id} succeeded: deleted {deleted} upload message(s)")


def evaluate_heartbeat(context: SensorEvaluationContext, queue: UploadQueue) -> SkipReason:
    """One heartbeat tick: keep the messages of queued and running runs in flight."""
    if not queue.configured:
        return SkipReason(NOT_CONFIGURED)
    renewed = keep_in_flight(context.instance, queue, context.log)
    return SkipReason(f"renewed the visibility of {renewed} in-flight upload message(s)")
