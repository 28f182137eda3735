"""Forged S3 events on the real stack (moto S3 and SQS): the uploads sensor trusts S3, not the
event. A lying `size` does not size the run; an event for an object that does not exist adds
no partition and starts no run, and its message stays, so an object that appears later is still
processed (docs/contract.md#upload-queue)."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from dagster import DagsterInstance, SensorResult

from episode_pipeline.config.settings import TranscodeSettings
from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_tags import (
    ECS_CPU_TAG,
    ECS_MEMORY_TAG,
    TRANSCODER_TAG,
    placement_tags,
)
from episode_pipeline.orchestration import upload_runs
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.transcode.placement import place
from episode_pipeline_tests.support import new_ref
from episode_pipeline_tests.support.queues import PrivateQueue, depth, tick

pytestmark = pytest.mark.integration

LIE = 64 << 30  # what a relay claims: 64 GiB
VISIBILITY_SECONDS = 4


def forged_event(bucket: str, key: str, size: int, etag: str) -> str:
    """An S3 notification as a relay could write it: every field is the relay's word."""
    record = {
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "eventTime": "2026-12-01T22:00:00.000Z",
        "eventName": "ObjectCreated:Put",
        "s3": {"bucket": {"name": bucket}, "object": {"key": key, "size": size, "eTag": etag}},
    }
    return json.dumps({"Records": [record]})


@pytest.fixture
def quiet_bucket(
    private_queue: Callable[..., PrivateQueue], instance: DagsterInstance
) -> Callable[..., PrivateQueue]:
    """Factory: a private queue whose data bucket notifies nobody: only forged events arrive."""

    def make(visibility_timeout: int | None = None) -> PrivateQueue:
        private = private_queue(visibility_timeout)
        first = tick(instance, private)  # deletes the bucket's s3:TestEvent
        assert not (isinstance(first, SensorResult) and first.run_requests)
        storage = Bucket(f"forged-{uuid.uuid4().hex[:8]}", private.storage.aws)
        storage.client.create_bucket(
            Bucket=storage.name,
            CreateBucketConfiguration={"LocationConstraint": storage.aws.region},
        )
        return dataclasses.replace(private, storage=storage)

    return make


def send(private: PrivateQueue, ref: EpisodeRef, size: int, etag: str) -> str:
    key = f"{ref.prefix}take.tar.zst"
    body = forged_event(private.storage.name, key, size, etag)
    private.queue.client.send_message(QueueUrl=private.queue.queue_url, MessageBody=body)
    return key


def test_the_run_is_sized_by_s3_not_by_the_event(
    quiet_bucket: Callable[..., PrivateQueue], instance: DagsterInstance, archive: Path
) -> None:
    private, ref = quiet_bucket(), new_ref()
    key = f"{ref.prefix}take.tar.zst"
    private.storage.upload_file(archive, key)
    real = private.storage.head(key)
    assert real is not None
    truth, lie = place(real.size, None, TranscodeSettings()), place(LIE, None, TranscodeSettings())
    assert placement_tags(truth) != placement_tags(lie)  # or the test proves nothing
    send(private, ref, LIE, real.etag)

    result = tick(instance, private)

    assert isinstance(result, SensorResult)
    (request,) = result.run_requests
    assert request.partition_key == ref.partition_key
    tags = {k: request.tags[k] for k in (TRANSCODER_TAG, ECS_CPU_TAG, ECS_MEMORY_TAG)}
    assert tags == placement_tags(truth)


class Log:
    """Collects what the tick logs (the daemon writes it to the tick's log in the UI)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)

    warning = debug = info


def test_an_event_for_no_object_adds_nothing_and_its_message_waits(
    quiet_bucket: Callable[..., PrivateQueue], instance: DagsterInstance, archive: Path
) -> None:
    private, ghost = quiet_bucket(VISIBILITY_SECONDS), new_ref()
    key = send(private, ghost, 1 << 20, "0" * 32)
    log = Log()

    result = upload_runs.evaluate_uploads(
        SimpleNamespace(instance=instance, log=log), private.queue, private.storage
    )

    assert isinstance(result, SensorResult) and not result.run_requests
    assert not result.dynamic_partitions_requests
    assert not instance.has_dynamic_partition(EPISODES_PARTITION_NAME, ghost.partition_key)
    (named,) = [line for line in log.lines if "does not exist (HEAD 404" in line]
    assert key in named and "left on the queue" in named
    assert "1 upload(s) of no object" in log.lines[-1]
    assert depth(private.queue)[1] == 1  # in flight, not deleted: back after its timeout

    # The object appears (a relay that announced it early, a store slower than S3): the
    # message's next delivery finds it, and the upload is processed after all.
    private.storage.upload_file(archive, key)
    time.sleep(VISIBILITY_SECONDS + 1)
    again = upload_runs.evaluate_uploads(
        SimpleNamespace(instance=instance, log=log), private.queue, private.storage
    )
    assert isinstance(again, SensorResult)
    assert [r.partition_key for r in again.run_requests] == [ghost.partition_key]
