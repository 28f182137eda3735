"""Every shape S3 delivers to the upload queue, parsed from AWS's own samples (pure, no stack).

The samples live in episode_pipeline_tests/data/s3_events/ with their sources; a test changes
only the object key (and, for SNS, what was published), so what is parsed is what AWS documents.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import pytest

from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.uploads.dead_letters import as_dead_letter
from episode_pipeline.uploads.events import Malformed, TestEvent, Upload, Uploads, parse_body

SAMPLES = Path(__file__).parent / "data" / "s3_events"
EPISODE = "orgs/acme/episodes/ep-1/"

# Object names that break a naive parser or a JSON template: quotes, backslashes, spaces, `+`,
# a literal `%2B`, non-ASCII.
AWKWARD_NAMES = [
    'take "one".tar.zst',
    "back\\slash.tar.zst",
    "two words.tar.zst",
    "a+b.tar.zst",
    "already%2Bencoded.tar.zst",
    "épisode-日本.tar.zst",
]


@cache
def _sample(name: str) -> dict[str, Any]:
    return json.loads((SAMPLES / name).read_text())


def sample(name: str) -> dict[str, Any]:
    return copy.deepcopy(_sample(name))


def s3_notification(key: str) -> dict[str, Any]:
    """The documented PUT notification for `key`, URL-encoded as S3 encodes keys."""
    event = sample("s3-notification-put.json")
    event["Records"][0]["s3"]["object"]["key"] = quote_plus(key, safe="/")
    return event


def sns_wrapped(published: dict[str, Any]) -> dict[str, Any]:
    """The documented SNS-to-SQS message with `published` as its Message."""
    envelope = sample("sns-notification.json")
    envelope["Subject"] = "Amazon S3 Notification"
    envelope["Message"] = json.dumps(published)
    return envelope


def eventbridge_event(key: str, detail_type: str = "Object Created") -> dict[str, Any]:
    event = sample("eventbridge-object-created.json")
    event["detail"]["object"]["key"] = key
    event["detail-type"] = detail_type
    return event


def only_upload(body: dict[str, Any]) -> Upload:
    parsed = parse_body(json.dumps(body))
    assert isinstance(parsed, Uploads), parsed
    assert not parsed.skipped, parsed.skipped
    (upload,) = parsed.uploads
    return upload


@pytest.mark.parametrize("name", AWKWARD_NAMES)
def test_a_direct_notification_decodes_the_key(name: str) -> None:
    upload = only_upload(s3_notification(EPISODE + name))
    assert upload.key == EPISODE + name
    assert upload.ref == EpisodeRef("acme", "ep-1")
    assert (upload.bucket, upload.size) == ("amzn-s3-demo-bucket", 1024)
    assert upload.etag == "d41d8cd98f00b204e9800998ecf8427e"
    assert upload.version_id == "096fKKXTRTtl3on89fVO.nfljtsv6qko"
    assert upload.sequencer == "0055AED6DCD90281E5"
    assert upload.event_time == "1970-01-01T00:00:00.000Z"


@pytest.mark.parametrize("name", AWKWARD_NAMES)
def test_an_sns_wrapped_notification_is_read_like_a_direct_one(name: str) -> None:
    upload = only_upload(sns_wrapped(s3_notification(EPISODE + name)))
    assert upload == only_upload(s3_notification(EPISODE + name))


@pytest.mark.parametrize("name", AWKWARD_NAMES)
def test_an_eventbridge_event_keeps_the_key_as_it_is(name: str) -> None:
    upload = only_upload(eventbridge_event(EPISODE + name))
    assert upload.key == EPISODE + name  # "+" and "%2B" are not decoded
    assert upload.ref == EpisodeRef("acme", "ep-1")
    assert (upload.bucket, upload.size) == ("amzn-s3-demo-bucket1", 5)
    assert upload.etag == "b1946ac92492d2347c6235b4d2611184"
    assert upload.version_id == "IYV3p45BT0ac8hjHg1houSdS1a.Mro8e"
    assert upload.sequencer == "617f08299329d189"
    assert upload.event_time == "2021-11-12T00:00:00Z"


def test_the_documented_samples_as_they_are_ask_for_no_work() -> None:
    """As documented (keys HappyFace.jpg, example-key) nothing is an episode archive: skipped."""
    for body in (
        sample("s3-notification-put.json"),
        sns_wrapped(sample("s3-notification-put.json")),
        sample("eventbridge-object-created.json"),
    ):
        parsed = parse_body(json.dumps(body))
        assert isinstance(parsed, Uploads) and parsed.uploads == (), parsed
        assert "is not a .zst archive" in parsed.skipped[0]


def test_the_test_event_direct_and_through_sns() -> None:
    test_event = sample("s3-test-event.json")
    expected = TestEvent(bucket="amzn-s3-demo-bucket")
    assert parse_body(json.dumps(test_event)) == expected
    assert parse_body(json.dumps(sns_wrapped(test_event))) == expected


def test_an_eventbridge_event_that_is_not_a_creation_asks_for_no_work() -> None:
    parsed = parse_body(json.dumps(eventbridge_event(EPISODE + "x.tar.zst", "Object Deleted")))
    assert isinstance(parsed, Uploads) and parsed.uploads == ()
    assert "Object Deleted" in parsed.skipped[0]


def test_a_record_reshaped_from_eventbridge_carries_the_raw_key() -> None:
    """eventSource "aws.s3" in a Records body: the key is EventBridge's, not URL-encoded."""
    event = sample("s3-notification-put.json")
    event["Records"][0]["eventSource"] = "aws.s3"
    event["Records"][0]["s3"]["object"]["key"] = EPISODE + "a+b.tar.zst"
    assert only_upload(event).key == EPISODE + "a+b.tar.zst"


def _with_detail(**changes: Any) -> dict[str, Any]:
    event = eventbridge_event(EPISODE + "x.tar.zst")
    event["detail"].update(changes)
    return event


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (
            sns_wrapped(s3_notification("uploads/acme/x.tar.zst")),
            "Message: Records[0].s3.object.key",
        ),
        ({**sns_wrapped({}), "Message": "not json"}, "SNS Message is not JSON"),
        ({**sns_wrapped({}), "Message": None}, "SNS notification has no Message string"),
        ({**sns_wrapped({}), "Type": "SubscriptionConfirmation"}, "SNS SubscriptionConfirmation"),
        (sns_wrapped(sns_wrapped({})), "Message: an SNS envelope inside an SNS envelope"),
        (sns_wrapped({"hello": "world"}), "Message: body is not an S3 event"),
        (eventbridge_event("uploads/acme/x.tar.zst"), "detail.object.key: S3 key"),
        (_with_detail(object={"size": 5}), "detail.object.key is missing"),
        (_with_detail(bucket={}), "detail.bucket.name is missing"),
        ({**eventbridge_event("k"), "detail": None}, "detail is missing"),
        ({"source": "aws.ec2", "detail-type": "EC2 Instance State-change"}, "no Records"),
    ],
)
def test_what_cannot_be_an_upload_is_malformed_naming_the_field(
    body: dict[str, Any], why: str
) -> None:
    parsed = parse_body(json.dumps(body))
    assert isinstance(parsed, Malformed), parsed
    assert why in parsed.reason, parsed.reason


@pytest.mark.parametrize(
    "body",
    [
        s3_notification(EPISODE + "a+b.tar.zst"),
        sns_wrapped(s3_notification(EPISODE + "a+b.tar.zst")),
        eventbridge_event(EPISODE + "a+b.tar.zst"),
    ],
    ids=["s3", "sns", "eventbridge"],
)
def test_dlq_list_names_the_episode_whatever_the_route(body: dict[str, Any]) -> None:
    """`episode-pipeline dlq list` reads a dead letter of any route (and redrive resends the
    body unchanged, so the sensor reads it again)."""
    letter = as_dead_letter({"MessageId": "m", "ReceiptHandle": "h", "Body": json.dumps(body)})
    assert letter.problem is None
    assert letter.episodes == ["acme/ep-1"]
    assert [upload.key for upload in letter.uploads] == [EPISODE + "a+b.tar.zst"]
