"""The upload-queue sensors on the real stack: moto S3 notifications → SQS → sensor → run → delete.

Each test gets its own bucket and queue pair on the session's moto server (wired like the
stack's: `.zst` under `orgs/` → queue, DLQ after 3 receives), so no other test's uploads or
receives interfere, and an ephemeral Dagster instance, so run keys and partitions start empty.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from dagster import (
    AssetRecordsFilter,
    DagsterInstance,
    DagsterRunStatus,
    RunsFilter,
    SensorResult,
    SkipReason,
)

from episode_pipeline.config.settings import AwsSettings, Settings
from episode_pipeline.definitions import build_definitions
from episode_pipeline.defs.asset_keys import RAW_ARCHIVE_KEY
from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME
from episode_pipeline.defs.sensors import sqs
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_tags import EPISODE_JOB_NAME, UPLOAD_TAG, retry_run_key
from episode_pipeline.local.upload import upload_episode
from episode_pipeline.orchestration import upload_runs
from episode_pipeline.uploads.upload_queue import UploadQueue
from episode_pipeline_tests.support import new_ref
from episode_pipeline_tests.support.dagster_internals import (
    DATA_VERSION_TAG,
    RUN_KEY_TAG,
    SENSOR_NAME_TAG,
)
from episode_pipeline_tests.support.queues import (
    PrivateQueue,
    depth,
    execute,
    redeliver,
    report_done,
    tick,
)

pytestmark = pytest.mark.integration


def test_the_definitions_wire_the_sensor_to_the_episode_job(settings: Settings) -> None:
    repository = build_definitions(settings).get_repository_def()
    assert repository.get_sensor_def(sqs.UPLOADS_SENSOR_NAME).job_name == EPISODE_JOB_NAME
    assert repository.has_job(EPISODE_JOB_NAME)


def test_without_a_queue_url_the_sensors_skip(instance: DagsterInstance) -> None:
    result = tick(instance, UploadQueue(None, AwsSettings()))
    assert isinstance(result, SkipReason)
    assert "not configured" in (result.skip_message or "")


def test_upload_becomes_one_run_and_its_message_is_deleted_after_success(
    private_queue: Callable[..., PrivateQueue], instance: DagsterInstance, archive: Path
) -> None:
    private = private_queue()
    ref = new_ref()
    key = upload_episode(archive, ref, private.settings)
    etag = private.storage.head(key).etag
    assert depth(private.queue) == (2, 0)  # the bucket's s3:TestEvent and the upload

    result = tick(instance, private)

    assert isinstance(result, SensorResult)
    (request,) = result.run_requests
    assert request.partition_key == ref.partition_key
    assert request.run_key == f"{ref.partition_key}@{etag}"
    assert request.tags["org"] == ref.org_id
    assert request.tags["episode"] == ref.episode_id
    assert request.tags[UPLOAD_TAG] == request.run_key
    # A new episode has nothing to be stale: no archive version is recorded for it yet.
    assert observed_archive_version(instance, ref) is None
    (held,) = upload_runs.held_messages(request.tags)
    assert held.receive_count == 1 and held.message_id and held.receipt_handle
    (add,) = result.dynamic_partitions_requests
    assert add.partitions_def_name == EPISODES_PARTITION_NAME
    assert list(add.partition_keys) == [ref.partition_key]
    # The test event is gone; the upload stays in flight until its run succeeds.
    assert depth(private.queue) == (0, 1)

    # The heartbeat finds nothing in flight yet (no run exists in this instance).
    assert upload_runs.keep_in_flight(instance, private.queue, log=_Log()) == 0

    outcome = execute(instance, private, request)
    assert outcome.success
    assert depth(private.queue) == (0, 1)  # the run itself deletes nothing

    report_done(instance, private, outcome.dagster_run.run_id)

    assert depth(private.queue) == (0, 0)
    assert private.queue.receive(wait_seconds=0) == []
    assert isinstance(tick(instance, private), SkipReason)


def test_a_failed_run_leaves_its_message_for_a_retry_with_a_new_run_key(
    private_queue: Callable[..., PrivateQueue],
    instance: DagsterInstance,
    archive: Path,
    s3_client: Any,
) -> None:
    private = private_queue()
    ref = new_ref()
    key = upload_episode(archive, ref, private.settings)
    (first,) = tick(instance, private).run_requests
    (held,) = upload_runs.held_messages(first.tags)
    handle = held.receipt_handle

    s3_client.delete_object(Bucket=private.settings.bucket, Key=key)  # the run cannot find it
    outcome = execute(instance, private, first)
    assert not outcome.success

    # While the run was queued or running, the heartbeat kept the message in flight; now the
    # run has failed the heartbeat leaves it and nothing deleted it.
    assert upload_runs.keep_in_flight(instance, private.queue, log=_Log()) == 0
    assert depth(private.queue) == (0, 1)

    # Instead of waiting out the 15-minute visibility timeout, let it come back now.
    assert not private.queue.extend_visibility_many([handle], 0)
    assert depth(private.queue) == (1, 0)
    upload_episode(archive, ref, private.settings)  # the robot uploads again (same bytes)
    result = tick(instance, private)

    # One retry for the episode, keyed by the failed run; both messages (the redelivered one,
    # now on its second receive, and the new one) ride on it.
    (retry,) = result.run_requests
    assert retry.partition_key == ref.partition_key
    assert retry.run_key == retry_run_key(first.run_key, outcome.dagster_run.run_id)
    held = upload_runs.held_messages(retry.tags)
    assert sorted(m.receive_count for m in held) == [1, 2]
    assert result.dynamic_partitions_requests == []  # the partition exists already


def test_the_heartbeat_keeps_messages_of_queued_runs_in_flight(
    private_queue: Callable[..., PrivateQueue], instance: DagsterInstance, archive: Path
) -> None:
    private = private_queue()
    ref = new_ref()
    upload_episode(archive, ref, private.settings)
    (request,) = tick(instance, private).run_requests
    run = waiting_run(instance, private, request)
    (held,) = upload_runs.held_messages(request.tags)
    handle = held.receipt_handle
    private.queue.extend_visibility_many([handle], 0)  # as if the visibility were about to run out
    assert upload_runs.keep_in_flight(instance, private.queue, log=_Log()) == 1
    assert depth(private.queue) == (0, 1)
    assert private.queue.receive(wait_seconds=0) == []
    instance.delete_run(run.run_id)


def test_a_malformed_message_is_left_and_reaches_the_dead_letter_queue(
    private_queue: Callable[..., PrivateQueue], instance: DagsterInstance
) -> None:
    # Visibility 0: a message left on the queue is visible again at once, as it would be
    # after 15 minutes.
    private = private_queue(visibility_timeout=0)
    sqs_client = private.queue.client
    sqs_client.send_message(QueueUrl=private.queue.queue_url, MessageBody="not an S3 event")

    seen_ticks = 0
    for _ in range(4):
        result = tick(instance, private)
        assert not isinstance(result, SensorResult) or result.run_requests == []
        if isinstance(result, SensorResult):
            seen_ticks += 1
    assert seen_ticks >= 1
    dlq = sqs_client.get_queue_attributes(
        QueueUrl=private.dlq_url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    assert int(dlq["ApproximateNumberOfMessages"]) == 1
    assert depth(private.queue) == (0, 0)


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)

    def warning(self, message: str) -> None:
        self.lines.append(message)


def test_a_reupload_after_a_failed_run_is_retried_at_once(
    private_queue: Callable[..., PrivateQueue],
    instance: DagsterInstance,
    archive: Path,
    s3_client: Any,
) -> None:
    private = private_queue()
    ref = new_ref()
    key = upload_episode(archive, ref, private.settings)
    (first,) = tick(instance, private).run_requests
    s3_client.delete_object(Bucket=private.settings.bucket, Key=key)
    failed = execute(instance, private, first)
    assert not failed.success

    # Same bytes, same ETag, a fresh message (receive count 1): the run key of the failed
    # attempt would be skipped by Dagster's run-key dedup, so the sensor asks for a new one.
    upload_episode(archive, ref, private.settings)
    (retry,) = tick(instance, private).run_requests
    assert retry.run_key == retry_run_key(first.run_key, failed.dagster_run.run_id)
    # A re-upload of a known episode: its version is recorded before the run starts, so the
    # episode shows stale while the run waits in the queue.
    assert observed_archive_version(instance, ref) == private.storage.head(key).etag
    assert execute(instance, private, retry).success


def observed_archive_version(instance: DagsterInstance, ref: EpisodeRef) -> str | None:
    """The data version of the episode's newest `raw_archive` observation, if any."""
    records = instance.fetch_observations(
        AssetRecordsFilter(asset_key=RAW_ARCHIVE_KEY, asset_partitions=[ref.partition_key]), limit=1
    ).records
    if not records or records[0].asset_observation is None:
        return None
    return records[0].asset_observation.tags.get(DATA_VERSION_TAG)


def waiting_run(instance: DagsterInstance, private: PrivateQueue, run_request: Any) -> Any:
    """The run the daemon made from the request, not started yet (as a busy run queue leaves it)."""
    job = build_definitions(private.settings).resolve_job_def(EPISODE_JOB_NAME)
    instance.add_dynamic_partitions(EPISODES_PARTITION_NAME, [run_request.partition_key])
    return instance.create_run_for_job(
        job_def=job,
        tags={
            **run_request.tags,
            "dagster/partition": run_request.partition_key,
            RUN_KEY_TAG: run_request.run_key,
            SENSOR_NAME_TAG: sqs.UPLOADS_SENSOR_NAME,
        },
        status=DagsterRunStatus.NOT_STARTED,
    )


def test_a_redelivery_while_the_run_waits_joins_it_and_its_success_deletes_the_message(
    private_queue: Callable[..., PrivateQueue], instance: DagsterInstance, archive: Path
) -> None:
    private = private_queue()
    ref = new_ref()
    upload_episode(archive, ref, private.settings)
    (request,) = tick(instance, private).run_requests
    waiting = waiting_run(instance, private, request)

    redeliver(private, request.tags)
    assert isinstance(tick(instance, private), SensorResult)

    joined = upload_runs.held_messages(instance.get_run_by_id(waiting.run_id).tags)
    assert [m.receive_count for m in joined] == [2]  # the fresh receipt handle replaced the old
    assert depth(private.queue) == (0, 1)
    instance.delete_run(waiting.run_id)


def test_a_redelivery_after_the_run_succeeded_deletes_the_message_and_starts_nothing(
    private_queue: Callable[..., PrivateQueue], instance: DagsterInstance, archive: Path
) -> None:
    private = private_queue()
    ref = new_ref()
    upload_episode(archive, ref, private.settings)
    (request,) = tick(instance, private).run_requests
    outcome = execute(instance, private, request)
    assert outcome.success

    # The run succeeded but its message came back before it was deleted (a crash of the
    # daemon in between, or a slow run-status sensor): this delivery ends it.
    redeliver(private, request.tags)
    result = tick(instance, private)
    assert isinstance(result, SensorResult) and result.run_requests == []
    assert depth(private.queue) == (0, 0)
    # The run-status sensor comes late: its stale handle is logged, nothing fails.
    report_done(instance, private, outcome.dagster_run.run_id)
    succeeded = instance.get_runs(
        RunsFilter(tags={UPLOAD_TAG: request.run_key}, statuses=[DagsterRunStatus.SUCCESS])
    )
    assert len(succeeded) == 1


def test_an_upload_processed_by_hand_is_its_run_and_the_sensor_deletes_its_message(
    private_queue: Callable[..., PrivateQueue], archive: Path
) -> None:
    """`upload`, then `process`, then the daemon starts: one successful run of the upload, not
    two. On the stack's own instance (PostgreSQL), as `episode-pipeline dev` would see it."""
    from episode_pipeline.runner import process_episode

    instance = DagsterInstance.get()
    private = private_queue()
    ref = new_ref()
    key = upload_episode(archive, ref, private.settings)
    upload = f"{ref.partition_key}@{private.storage.head(key).etag}"

    outcome = process_episode(ref, instance=instance, settings=private.settings, quiet=True)
    assert outcome.success, outcome.errors
    # The run read that object version: it carries the upload, as a sensor's run does.
    assert instance.get_run_by_id(outcome.run_id).tags[UPLOAD_TAG] == upload

    result = tick(instance, private.queue)  # the daemon's first tick: the upload's message

    assert isinstance(result, SensorResult) and result.run_requests == []
    assert depth(private.queue) == (0, 0)  # deleted: the test event and the upload's message
    runs = instance.get_runs(RunsFilter(tags={"dagster/partition": ref.partition_key}))
    assert [run.run_id for run in runs] == [outcome.run_id]


def test_a_tick_logs_what_it_saw_requested_and_skipped(
    private_queue: Callable[..., PrivateQueue], instance: DagsterInstance, archive: Path
) -> None:
    private = private_queue()
    ref = new_ref()
    key = upload_episode(archive, ref, private.settings)
    upload = f"{ref.partition_key}@{private.storage.head(key).etag}"
    private.queue.client.send_message(QueueUrl=private.queue.queue_url, MessageBody="garbage")
    log = _Log()

    upload_runs.evaluate_uploads(
        SimpleNamespace(instance=instance, log=log), private.queue, private.storage
    )

    text = "\n".join(log.lines)
    assert "received 3 message(s)" in text
    assert "s3:TestEvent" in text and "skipped and deleted" in text
    assert "left on the queue" in text and "body is not JSON" in text  # skipped, and why
    assert f"saw upload {upload} (s3 key {key})" in text
    assert f"requested run key {upload}" in text
    assert f"tick done: requested 1 run(s): {upload}" in text
