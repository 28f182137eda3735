"""The two routes besides S3's direct notification, wired on the real moto server: an upload
whose key holds quotes, a backslash, spaces, `+` and non-ASCII reaches the queue through SNS
(raw message delivery off) or through an EventBridge rule (the event as it is, no input
transformer), and the uploads sensor turns it into exactly one run, which processes that object.

moto plays S3, SNS, EventBridge and SQS; its S3 publishes the notification to the topic and the
event to the default bus as AWS does (docs/deploy-aws.md#upload-routes). The shapes themselves,
as AWS documents them, are parsed in test_events_shapes.py.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dagster import AssetRecordsFilter, DagsterInstance, SensorResult, SkipReason

from episode_pipeline.config.settings import Settings
from episode_pipeline.defs.assets.archive import RAW_ARCHIVE_KEY
from episode_pipeline.local import aws_setup
from episode_pipeline.local.stack import StackInfo
from episode_pipeline.local.upload import upload_episode
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.uploads.upload_queue import UploadQueue
from episode_pipeline_tests.support import new_ref
from episode_pipeline_tests.support.queues import PrivateQueue, depth, execute, report_done, tick

pytestmark = pytest.mark.integration

AWKWARD_ARCHIVE_NAME = 'take "one" + back\\slash épisode.tar.zst'


@pytest.fixture(scope="module")
def awkward_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("routes-sample") / AWKWARD_ARCHIVE_NAME
    write_sample(out, SampleSpec(seconds=1.0, cameras=1))
    return out


def _sns_route(clients: dict[str, Any], bucket: str, queue_arn: str, name: str) -> None:
    """S3 notification → topic → queue, the queue subscribed without raw message delivery."""
    topic_arn = clients["sns"].create_topic(Name=name)["TopicArn"]
    clients["sns"].subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=queue_arn)
    configuration = aws_setup.notification_configuration(queue_arn)["QueueConfigurations"][0]
    clients["s3"].put_bucket_notification_configuration(
        Bucket=bucket,
        NotificationConfiguration={
            "TopicConfigurations": [
                {
                    "Id": configuration["Id"],
                    "TopicArn": topic_arn,
                    "Events": configuration["Events"],
                    "Filter": configuration["Filter"],
                }
            ]
        },
    )


def _eventbridge_route(clients: dict[str, Any], bucket: str, queue_arn: str, name: str) -> None:
    """S3 → EventBridge (the bucket's delivery on) → a rule like infra/notifications.tf's → the
    queue, the event delivered as it is. moto matches no `wildcard` (the rule's `orgs/*.zst`):
    the suffix alone keeps the run's own outputs off the queue here."""
    clients["s3"].put_bucket_versioning(
        Bucket=bucket, VersioningConfiguration={"Status": "Enabled"}
    )
    pattern = {
        "source": ["aws.s3"],
        "detail-type": ["Object Created"],
        "detail": {"bucket": {"name": [bucket]}, "object": {"key": [{"suffix": ".zst"}]}},
    }
    clients["events"].put_rule(Name=name, EventPattern=json.dumps(pattern))
    clients["events"].put_targets(Rule=name, Targets=[{"Id": "upload-queue", "Arn": queue_arn}])
    clients["s3"].put_bucket_notification_configuration(
        Bucket=bucket, NotificationConfiguration={"EventBridgeConfiguration": {}}
    )


ROUTES: dict[str, Callable[[dict[str, Any], str, str, str], None]] = {
    "sns": _sns_route,
    "eventbridge": _eventbridge_route,
}


@pytest.fixture
def routed_queue(stack: StackInfo, settings: Settings) -> Callable[[str], PrivateQueue]:
    """Factory: a fresh bucket and queue (with its dead-letter queue) joined by `route`."""
    assert stack.s3_endpoint is not None
    endpoint = stack.s3_endpoint

    def make(route: str) -> PrivateQueue:
        name = f"route-{route}-{uuid.uuid4().hex[:10]}"
        clients = {service: aws_setup.client(service, endpoint) for service in ROUTES_CLIENTS}
        clients["s3"].create_bucket(
            Bucket=name, CreateBucketConfiguration={"LocationConstraint": aws_setup.REGION}
        )
        sqs = clients["sqs"]
        dlq_url = sqs.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
        queue_url = sqs.create_queue(
            QueueName=name, Attributes=aws_setup.queue_attributes(_arn(sqs, dlq_url))
        )["QueueUrl"]
        ROUTES[route](clients, name, _arn(sqs, queue_url), name)
        aws = aws_setup.moto_settings(endpoint)
        return PrivateQueue(
            settings=dataclasses.replace(settings, bucket=name, sqs_queue_url=queue_url),
            queue=UploadQueue(queue_url, aws),
            storage=Bucket(name, aws),
            dlq_url=dlq_url,
        )

    return make


ROUTES_CLIENTS = ("s3", "sqs", "sns", "events")


def _arn(sqs: Any, url: str) -> str:
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
    return str(attributes["Attributes"]["QueueArn"])


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_an_upload_through_the_route_becomes_one_run_of_that_object(
    route: str,
    routed_queue: Callable[[str], PrivateQueue],
    instance: DagsterInstance,
    awkward_archive: Path,
) -> None:
    private = routed_queue(route)
    ref = new_ref()
    key = upload_episode(awkward_archive, ref, private.settings)
    assert key.endswith(AWKWARD_ARCHIVE_NAME)
    body = json.loads(private.queue.receive(visibility_seconds=0)[0]["Body"])
    # The shape that reached the queue (moto's SNS also forwards the bucket's s3:TestEvent).
    assert ("Type" in body) if route == "sns" else (body.get("detail-type") == "Object Created")

    result = tick(instance, private)

    assert isinstance(result, SensorResult)
    (request,) = result.run_requests
    assert request.partition_key == ref.partition_key
    outcome = execute(instance, private, request)
    assert outcome.success
    # The run read the object the event named, its key intact.
    records = instance.fetch_observations(
        AssetRecordsFilter(asset_key=RAW_ARCHIVE_KEY, asset_partitions=[ref.partition_key]), limit=1
    ).records
    observation = records[0].asset_observation
    assert observation is not None and observation.metadata["key"].value == key
    report_done(instance, private, outcome.dagster_run.run_id)
    assert depth(private.queue) == (0, 0)
    assert isinstance(tick(instance, private), SkipReason)
