"""S3-event parsing and the sensor's pure planning: no stack, no network."""

from __future__ import annotations

import json
from typing import Any

import pytest

from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_tags import SQS_TAG, upload_id
from episode_pipeline.orchestration.upload_runs import held_messages, run_tags, sqs_tag, upload_of
from episode_pipeline.uploads.deliveries import HeldMessage, held_by, merge_held, plan_batch
from episode_pipeline.uploads.events import (
    Malformed,
    QueueMessage,
    TestEvent,
    Upload,
    Uploads,
    handoffs,
    parse_body,
    parse_message,
)

TEST_EVENT_BODY = json.dumps(
    {
        "Service": "Amazon S3",
        "Event": "s3:TestEvent",
        "Time": "2026-11-29T10:00:00.000Z",
        "Bucket": "data",
        "RequestId": "r",
        "HostId": "h",
    }
)


def record(
    key: str,
    event: str = "ObjectCreated:Put",
    etag: str | None = "abc123",
    version_id: str | None = None,
    sequencer: str | None = None,
    event_time: str = "2026-11-29T10:00:00.000Z",
) -> dict[str, Any]:
    obj: dict[str, Any] = {"key": key, "size": 42}
    if etag is not None:
        obj["eTag"] = etag
    if version_id is not None:
        obj["versionId"] = version_id
    if sequencer is not None:
        obj["sequencer"] = sequencer
    return {
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "eventName": event,
        "eventTime": event_time,
        "s3": {"bucket": {"name": "data"}, "object": obj},
    }


def event(*records: dict[str, Any]) -> str:
    return json.dumps({"Records": list(records)})


def message(body: str, message_id: str = "m1", handle: str = "h1", count: int = 1) -> QueueMessage:
    return parse_message(
        {
            "MessageId": message_id,
            "ReceiptHandle": handle,
            "Body": body,
            "Attributes": {"ApproximateReceiveCount": str(count)},
        }
    )


ARCHIVE = "orgs/acme/episodes/ep-1/upload.tar.zst"


def test_test_event_is_recognised() -> None:
    assert parse_body(TEST_EVENT_BODY) == TestEvent(bucket="data")


def test_one_upload_record() -> None:
    parsed = parse_body(event(record(ARCHIVE, version_id="v7", sequencer="00AB")))
    assert isinstance(parsed, Uploads)
    (upload,) = parsed.uploads
    assert upload.ref == EpisodeRef("acme", "ep-1")
    assert (upload.bucket, upload.key, upload.size) == ("data", ARCHIVE, 42)
    assert (upload.etag, upload.version_id, upload.sequencer) == ("abc123", "v7", "00AB")


def test_url_encoded_key_is_decoded() -> None:
    encoded = "orgs/acme/episodes/ep-1/my+upload%2B1%20%282%29.tar.zst"
    (upload,) = parse_body(event(record(encoded))).uploads
    assert upload.key == "orgs/acme/episodes/ep-1/my upload+1 (2).tar.zst"
    assert upload.partition_key == "acme/ep-1"


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("orgs/acme/episodes/ep-1/notes.txt", ".zst"),
        ("orgs/acme/episodes/ep-1/processed/old.tar.zst", "pipeline output"),
    ],
)
def test_records_that_ask_for_no_work_are_skipped(key: str, why: str) -> None:
    parsed = parse_body(event(record(key)))
    assert isinstance(parsed, Uploads)
    assert parsed.uploads == ()
    assert why in parsed.skipped[0] and key in parsed.skipped[0]


def test_non_create_events_are_skipped() -> None:
    parsed = parse_body(event(record(ARCHIVE, event="ObjectRemoved:Delete")))
    assert parsed == Uploads(uploads=(), skipped=parsed.skipped)
    assert "ObjectRemoved:Delete" in parsed.skipped[0]


@pytest.mark.parametrize(
    "key",
    ["uploads/acme/ep-1/upload.tar.zst", "orgs/acme/ep-1.tar.zst", "orgs/ac..me/episodes/e/x.zst"],
)
def test_an_archive_outside_an_episode_prefix_is_malformed(key: str) -> None:
    parsed = parse_body(event(record(key)))
    assert isinstance(parsed, Malformed)
    assert "Records[0].s3.object.key" in parsed.reason


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not an object"),
        (json.dumps({"hello": "world"}), "no Records"),
        (json.dumps({"Records": []}), "no Records"),
        (json.dumps({"Records": [{"eventName": "ObjectCreated:Put"}]}), "Records[0].s3"),
        (
            json.dumps({"Records": [{"eventName": "ObjectCreated:Put", "s3": {"object": {}}}]}),
            "Records[0].s3.object.key",
        ),
    ],
)
def test_bodies_that_are_not_s3_events_are_malformed(body: str, why: str) -> None:
    parsed = parse_body(body)
    assert isinstance(parsed, Malformed)
    assert why in parsed.reason


def test_several_records() -> None:
    body = event(
        record(ARCHIVE),
        record("orgs/acme/episodes/ep-2/a.tar.zst"),
        record("orgs/acme/episodes/ep-2/readme.md"),
    )
    parsed = parse_body(body)
    assert [u.partition_key for u in parsed.uploads] == ["acme/ep-1", "acme/ep-2"]
    assert len(parsed.skipped) == 1


def test_receive_count_defaults_to_one() -> None:
    assert parse_message({"MessageId": "m", "ReceiptHandle": "h", "Body": "x"}).receive_count == 1
    assert message(TEST_EVENT_BODY, count=3).receive_count == 3


def test_an_upload_is_named_by_its_object_version_never_by_the_receive_count() -> None:
    (etag_only,) = parse_body(event(record(ARCHIVE, etag="e1"))).uploads
    (reuploaded,) = parse_body(event(record(ARCHIVE, etag="e2"))).uploads
    (versioned,) = parse_body(event(record(ARCHIVE, etag="e1", version_id="v9"))).uploads
    (sequenced,) = parse_body(event(record(ARCHIVE, etag=None, sequencer="0055"))).uploads
    assert upload_for(etag_only) == "acme/ep-1@e1"
    assert upload_for(reuploaded) != upload_for(etag_only)
    assert upload_for(versioned) == "acme/ep-1@v9"
    assert upload_for(sequenced) == "acme/ep-1@0055"
    first = message(event(record(ARCHIVE, etag="e1")), "m1", "h1", count=1)
    third = message(event(record(ARCHIVE, etag="e1")), "m1", "h3", count=3)
    assert upload_of(handoffs([first])[0]) == upload_of(handoffs([third])[0]) == "acme/ep-1@e1"


def upload_for(upload: Upload) -> str:
    return upload_id(upload.partition_key, upload.object_version)


def test_multipart_duplicate_events_become_one_handoff_with_both_handles() -> None:
    body = event(record(ARCHIVE, event="ObjectCreated:CompleteMultipartUpload"))
    batch = [
        message(body, "m1", "h1"),
        message(event(record(ARCHIVE, event="ObjectCreated:Put")), "m2", "h2"),
    ]
    (handoff,) = handoffs(batch)
    assert handoff.upload.partition_key == "acme/ep-1"
    assert set(handoff.receipt_handles) == {"h1", "h2"}
    tags = run_tags(handoff, held_by(handoff, batch))
    assert {m.receipt_handle for m in held_messages(tags)} == {"h1", "h2"}


def test_the_later_version_of_an_episode_wins_within_a_batch() -> None:
    old = event(record(ARCHIVE, etag="old", event_time="2026-11-29T10:00:00.000Z"))
    new = event(record(ARCHIVE, etag="new", event_time="2026-11-29T11:00:00.000Z"))
    (handoff,) = handoffs([message(new, "m2", "h2"), message(old, "m1", "h1")])
    assert handoff.upload.etag == "new"
    assert handoff.receipt_handles == ("h2", "h1")


def test_plan_deletes_test_events_and_no_work_events_and_leaves_malformed() -> None:
    plan = plan_batch(
        [
            message(TEST_EVENT_BODY, "t", "ht"),
            message("garbage", "g", "hg"),
            message(event(record("orgs/acme/episodes/ep-1/x.txt")), "n", "hn"),
            message(event(record(ARCHIVE)), "u", "hu", count=2),
        ]
    )
    assert plan.delete == ["ht", "hn"]
    assert [message_id for message_id, _ in plan.malformed] == ["g"]
    (handoff,) = plan.handoffs
    tags = run_tags(handoff, [HeldMessage("u", "hu", 2)])
    # The org and the episode to filter by; the upload; all SQS bookkeeping in one tag.
    assert tags["org"] == "acme" and tags["episode"] == "ep-1"
    assert tags["episode_pipeline/upload"] == "acme/ep-1@abc123"
    assert set(tags) == {"org", "episode", "episode_pipeline/upload", SQS_TAG}
    assert held_messages(tags) == [HeldMessage("u", "hu", 2)]


def test_a_redelivery_replaces_the_stale_receipt_handle_of_its_message() -> None:
    held = [HeldMessage("m1", "h1", 1), HeldMessage("m2", "h2", 1, ("acme/ep-2",))]
    merged = merge_held(held, [HeldMessage("m1", "h1-again", 2), HeldMessage("m3", "h3", 1)])
    assert merged == [
        HeldMessage("m1", "h1-again", 2),
        HeldMessage("m2", "h2", 1, ("acme/ep-2",)),
        HeldMessage("m3", "h3", 1),
    ]
    assert held_messages(sqs_tag(merged)) == merged


def test_a_message_announcing_two_episodes_names_the_other_in_each_run() -> None:
    two = event(record(ARCHIVE), record("orgs/acme/episodes/ep-2/take.tar.zst"))
    batch = [message(two, "m1", "h1")]
    first, second = handoffs(batch)
    assert held_by(first, batch) == [HeldMessage("m1", "h1", 1, ("acme/ep-2",))]
    assert held_by(second, batch) == [HeldMessage("m1", "h1", 1, ("acme/ep-1",))]


def test_an_unreadable_sqs_tag_holds_nothing() -> None:
    assert held_messages({SQS_TAG: "not json"}) == []
    assert held_messages({}) == []
