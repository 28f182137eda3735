"""A private bucket → queue → DLQ on the session's moto server, and playing the daemon's part
(a sensor tick, an in-process run, the run-status sensor) against it. A pytest plugin
(conftest.py): the fixtures `private_queue` and `archive` are shared."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dagster import (
    DagsterEventType,
    DagsterInstance,
    SensorResult,
    SkipReason,
    build_run_status_sensor_context,
    build_sensor_context,
)

from episode_pipeline.config.settings import AwsSettings, Settings
from episode_pipeline.definitions import build_definitions
from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME
from episode_pipeline.defs.resources.aws import aws_fields
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.defs.resources.sqs import UploadQueueResource
from episode_pipeline.defs.sensors import sqs
from episode_pipeline.instance.run_tags import EPISODE_JOB_NAME
from episode_pipeline.local import aws_setup
from episode_pipeline.local.stack import StackInfo
from episode_pipeline.orchestration import upload_runs
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.uploads.upload_queue import UploadQueue
from episode_pipeline_tests.support.dagster_internals import RUN_KEY_TAG, SENSOR_NAME_TAG


@dataclasses.dataclass(frozen=True)
class PrivateQueue:
    settings: Settings  # the session's, with this test's bucket and queue
    queue: UploadQueue
    storage: Bucket
    dlq_url: str


@pytest.fixture
def private_queue(stack: StackInfo, settings: Settings) -> Callable[..., PrivateQueue]:
    """Factory: a fresh bucket → queue → DLQ on the session's moto server."""
    assert stack.s3_endpoint is not None
    endpoint = stack.s3_endpoint

    def make(visibility_timeout: int | None = None) -> PrivateQueue:
        name = f"sqs-sensor-{uuid.uuid4().hex[:10]}"
        resources = aws_setup.ensure_resources(endpoint, bucket=name, queue_name=name)
        if visibility_timeout is not None:
            aws_setup.client("sqs", endpoint).set_queue_attributes(
                QueueUrl=resources.queue_url,
                Attributes={"VisibilityTimeout": str(visibility_timeout)},
            )
        aws = AwsSettings(
            region=aws_setup.REGION,
            endpoint_url=endpoint,
            access_key_id=aws_setup.ACCESS_KEY,
            secret_access_key=aws_setup.SECRET_KEY,
        )
        return PrivateQueue(
            settings=dataclasses.replace(
                settings, bucket=resources.bucket, sqs_queue_url=resources.queue_url
            ),
            queue=UploadQueue(resources.queue_url, aws),
            storage=Bucket(resources.bucket, aws),
            dlq_url=resources.dlq_url,
        )

    return make


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sqs-sample") / "episode.tar.zst"
    write_sample(out, SampleSpec(seconds=1.0, cameras=1))
    return out


def queue_resource(queue: UploadQueue) -> UploadQueueResource:
    """The resource the sensors get, pointing at the same queue as `queue`."""
    return UploadQueueResource(queue_url=queue.queue_url, **aws_fields(queue.aws))


def bucket_resource(bucket: Bucket) -> S3BucketResource:
    """The data-bucket resource the uploads sensor HEADs new uploads through."""
    return S3BucketResource(bucket=bucket.name, **aws_fields(bucket.aws))


def tick(instance: DagsterInstance, queue: PrivateQueue | UploadQueue) -> SensorResult | SkipReason:
    """One tick of the uploads sensor on a private queue and its bucket (or on a bare queue,
    with a bucket nothing is uploaded to)."""
    private = queue if isinstance(queue, PrivateQueue) else None
    upload_queue = private.queue if private else queue
    storage = private.storage if private else Bucket("no-uploads-here", upload_queue.aws)
    context = build_sensor_context(
        instance=instance,
        resources={"upload_queue": queue_resource(upload_queue), "s3": bucket_resource(storage)},
    )
    return sqs.episode_uploads(context)


def depth(queue: UploadQueue) -> tuple[int, int]:
    """(visible, in flight) messages, as SQS approximates them."""
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attributes = queue.client.get_queue_attributes(QueueUrl=queue.queue_url, AttributeNames=names)
    visible, in_flight = (int(attributes["Attributes"].get(name, 0)) for name in names)
    return visible, in_flight


def execute(instance: DagsterInstance, private: PrivateQueue, run_request: Any) -> Any:
    """Play the daemon: add the partition and run the job in-process with the request's tags."""
    sqs_name = sqs.UPLOADS_SENSOR_NAME
    instance.add_dynamic_partitions(EPISODES_PARTITION_NAME, [run_request.partition_key])
    job = build_definitions(private.settings).resolve_job_def(EPISODE_JOB_NAME)
    return job.execute_in_process(
        partition_key=run_request.partition_key,
        instance=instance,
        # What the daemon adds to a sensor's run: the run key and the sensor's name.
        tags={**run_request.tags, RUN_KEY_TAG: run_request.run_key, SENSOR_NAME_TAG: sqs_name},
        raise_on_error=False,
    )


def report_done(instance: DagsterInstance, private: PrivateQueue, run_id: str) -> None:
    """Play the daemon's run-status sensor for a succeeded run."""
    (record,) = instance.get_records_for_run(run_id, of_type=DagsterEventType.RUN_SUCCESS).records
    context = build_run_status_sensor_context(
        sensor_name=sqs.UPLOAD_DONE_SENSOR_NAME,
        dagster_event=record.event_log_entry.dagster_event,
        dagster_instance=instance,
        dagster_run=instance.get_run_by_id(run_id),
        resources={"upload_queue": queue_resource(private.queue)},
    )
    sqs.episode_upload_done(context)


def redeliver(private: PrivateQueue, tags: dict[str, str]) -> None:
    """Make the run's messages visible now, as they would be after the visibility timeout."""
    handles = [m.receipt_handle for m in upload_runs.held_messages(tags)]
    assert not private.queue.extend_visibility_many(handles, 0)
