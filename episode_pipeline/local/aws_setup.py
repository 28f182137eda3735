"""The AWS resources of the local stack, created idempotently on moto, and the S3 snapshot.

Mirrors production's data-ingestion wiring (docs/contract.md#upload-queue): one data bucket
whose `ObjectCreated:*` events for keys `orgs/…` ending in `.zst` go to an SQS queue (visibility
15 min, retention 4 days) that redrives to a dead-letter queue (retention 14 days) after 3
receives.

Moto keeps everything in memory. Its request recorder would replay every request (SQS receives
and deletes included, duplicating notifications), so instead `stop_stack` saves the bucket's
objects to `<home>/s3-snapshot/` and the next start puts them back *before* the bucket
notification exists, so restoring sends no events. Only a clean `stack down` saves: objects
written since the last `stack down` are lost if moto is killed. Queue messages never survive.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from episode_pipeline.config.settings import DEFAULT_REGION, AwsSettings, QueueSettings
from episode_pipeline.storage.aws import aws_client

REGION = DEFAULT_REGION
ACCESS_KEY = "testing"
SECRET_KEY = "testing"
MAX_RECEIVE_COUNT = 3
VISIBILITY_TIMEOUT_SECONDS = QueueSettings.visibility_timeout_seconds
QUEUE_RETENTION_SECONDS = 4 * 24 * 3600  # 345600
DLQ_RETENTION_SECONDS = 14 * 24 * 3600  # 1209600
NOTIFICATION_ID = "raw-episode-archives"
RAW_PREFIX = "orgs/"
RAW_SUFFIX = ".zst"
# moto S3 roughly doubles its object rate with 8 threads (docs/platform-notes.md#moto).
_PARALLEL = 8


@dataclass(frozen=True)
class AwsResources:
    bucket: str
    queue_url: str
    dlq_url: str


def moto_settings(endpoint_url: str) -> AwsSettings:
    """How the stack's clients reach the moto server (what `stack.json` publishes too)."""
    return AwsSettings(
        region=REGION,
        endpoint_url=endpoint_url,
        access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY,
    )


def client(service: str, endpoint_url: str) -> Any:
    return aws_client(
        service,
        moto_settings(endpoint_url),
        max_pool_connections=_PARALLEL * 2,
        retries={"max_attempts": 3},
    )


@dataclass(frozen=True)
class QueueTiming:
    """How long a received upload stays hidden, and after how many receives it goes to the DLQ.

    Production's values by default; the local stack takes shorter ones from
    SQS_VISIBILITY_TIMEOUT_SECONDS and SQS_MAX_RECEIVE_COUNT so a failing upload reaches the
    dead-letter queue in minutes, not 45 (docs/operations.md#the-dead-letter-queue-locally).
    """

    visibility_timeout_seconds: int = VISIBILITY_TIMEOUT_SECONDS
    max_receive_count: int = MAX_RECEIVE_COUNT

    def __post_init__(self) -> None:
        # The heartbeat renews in-flight messages at 4/15 of the timeout: it needs seconds.
        if not 4 <= self.visibility_timeout_seconds <= 43200:
            raise ValueError(
                f"SQS_VISIBILITY_TIMEOUT_SECONDS={self.visibility_timeout_seconds}: "
                "must be 4..43200 (SQS allows at most 12 hours)"
            )
        if not 1 <= self.max_receive_count <= 1000:
            raise ValueError(f"SQS_MAX_RECEIVE_COUNT={self.max_receive_count}: must be 1..1000")

    @property
    def heartbeat_seconds(self) -> int:
        """How often the heartbeat sensor renews in-flight messages: production's 4 minutes of
        15, at that ratio for a shorter timeout (20 s → 5 s)."""
        return max(1, min(240, self.visibility_timeout_seconds * 4 // 15))

    def env(self) -> dict[str, str]:
        """What the stack publishes, so the sensors' QueueSettings agree with the queue."""
        return {
            "SQS_VISIBILITY_TIMEOUT_SECONDS": str(self.visibility_timeout_seconds),
            "SQS_HEARTBEAT_SECONDS": str(self.heartbeat_seconds),
            "SQS_MAX_RECEIVE_COUNT": str(self.max_receive_count),
        }

    @classmethod
    def from_env(cls, env: Mapping[str, str], recorded: Mapping[str, str]) -> QueueTiming:
        """The values asked for in `env`, else those the stack `recorded` last, else defaults."""

        def value(name: str, default: int) -> int:
            raw = env.get(name) or recorded.get(name)
            try:
                return int(raw) if raw else default
            except ValueError:
                raise ValueError(f"{name}={raw!r}: not a whole number") from None

        return cls(
            value("SQS_VISIBILITY_TIMEOUT_SECONDS", VISIBILITY_TIMEOUT_SECONDS),
            value("SQS_MAX_RECEIVE_COUNT", MAX_RECEIVE_COUNT),
        )


def queue_attributes(dlq_arn: str, timing: QueueTiming | None = None) -> dict[str, str]:
    """The main queue's settings (pure, so tests can compare against it)."""
    timing = timing or QueueTiming()
    return {
        "VisibilityTimeout": str(timing.visibility_timeout_seconds),
        "MessageRetentionPeriod": str(QUEUE_RETENTION_SECONDS),
        "RedrivePolicy": json.dumps(
            {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": timing.max_receive_count}
        ),
    }


def notification_configuration(queue_arn: str) -> dict[str, Any]:
    return {
        "QueueConfigurations": [
            {
                "Id": NOTIFICATION_ID,
                "QueueArn": queue_arn,
                "Events": ["s3:ObjectCreated:*"],
                "Filter": {
                    "Key": {
                        "FilterRules": [
                            {"Name": "prefix", "Value": RAW_PREFIX},
                            {"Name": "suffix", "Value": RAW_SUFFIX},
                        ]
                    }
                },
            }
        ]
    }


def _ensure_queue(sqs: Any, name: str, attributes: dict[str, str]) -> str:
    try:
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    except ClientError:
        return sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    sqs.set_queue_attributes(QueueUrl=url, Attributes=attributes)
    return url


def _queue_arn(sqs: Any, url: str) -> str:
    return sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]


def ensure_resources(
    endpoint_url: str,
    bucket: str,
    queue_name: str,
    snapshot_dir: Path | None = None,
    timing: QueueTiming | None = None,
) -> AwsResources:
    """Create what is missing; restore `snapshot_dir` into the bucket when it was just created."""
    s3 = client("s3", endpoint_url)
    sqs = client("sqs", endpoint_url)
    try:
        s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
        created = True
    except ClientError as error:
        if error.response["Error"]["Code"] != "BucketAlreadyOwnedByYou":
            raise
        created = False
    if created and snapshot_dir is not None:
        restore_snapshot(s3, bucket, snapshot_dir)

    dlq_url = _ensure_queue(
        sqs, f"{queue_name}-dlq", {"MessageRetentionPeriod": str(DLQ_RETENTION_SECONDS)}
    )
    queue_url = _ensure_queue(sqs, queue_name, queue_attributes(_queue_arn(sqs, dlq_url), timing))
    if created:  # re-putting it would queue another s3:TestEvent on every start
        s3.put_bucket_notification_configuration(
            Bucket=bucket,
            NotificationConfiguration=notification_configuration(_queue_arn(sqs, queue_url)),
        )
    return AwsResources(bucket=bucket, queue_url=queue_url, dlq_url=dlq_url)


# --- S3 snapshot ---------------------------------------------------------------------------

MANIFEST = "manifest.json"


def _object_file(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()  # keys may hold anything; file names may not


def _read_manifest(directory: Path) -> dict[str, dict[str, Any]]:
    try:
        return dict(json.loads((directory / MANIFEST).read_text()))
    except (OSError, ValueError):
        return {}


def save_snapshot(s3: Any, bucket: str, directory: Path) -> int:
    """Mirror the bucket into `directory`, downloading only objects whose ETag changed."""
    objects_dir = directory / "objects"
    objects_dir.mkdir(parents=True, exist_ok=True)
    previous = _read_manifest(directory)
    listed: dict[str, str] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            listed[item["Key"]] = item["ETag"]

    def fetch(key: str) -> tuple[str, dict[str, Any]]:
        entry = previous.get(key)
        path = objects_dir / _object_file(key)
        if entry and entry["etag"] == listed[key] and path.exists():
            return key, entry
        response = s3.get_object(Bucket=bucket, Key=key)
        tmp = path.with_suffix(".part")
        with tmp.open("wb") as out:
            for chunk in response["Body"].iter_chunks(1 << 20):
                out.write(chunk)
        os.replace(tmp, path)
        return key, {
            "etag": listed[key],
            "file": path.name,
            "content_type": response.get("ContentType") or "binary/octet-stream",
            "metadata": response.get("Metadata") or {},
        }

    with ThreadPoolExecutor(_PARALLEL) as pool:
        manifest = dict(pool.map(fetch, sorted(listed)))
    keep = {entry["file"] for entry in manifest.values()}
    for path in objects_dir.iterdir():
        if path.name not in keep:
            path.unlink()
    tmp_manifest = directory / (MANIFEST + ".tmp")
    tmp_manifest.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(tmp_manifest, directory / MANIFEST)
    return len(manifest)


def restore_snapshot(s3: Any, bucket: str, directory: Path) -> int:
    """Put every saved object back (content type and user metadata too); returns the count."""
    manifest = _read_manifest(directory)
    objects_dir = directory / "objects"

    def put(item: tuple[str, dict[str, Any]]) -> None:
        key, entry = item
        path = objects_dir / entry["file"]
        if path.exists():
            extra = {"ContentType": entry["content_type"], "Metadata": entry["metadata"]}
            s3.upload_file(str(path), bucket, key, ExtraArgs=extra)

    with ThreadPoolExecutor(_PARALLEL) as pool:
        list(pool.map(put, manifest.items()))
    return len(manifest)
