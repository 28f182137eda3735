"""Why each dead letter is dead (uploads.reasons; the reasons' table is in
docs/operations.md#the-dead-letter-queue-why-each-message-is-there): the rule `dlq list` applies,
the sensor's redelivery rule, the body's reasons and the metric's lines by reason, no servers."""

from __future__ import annotations

import json

import pytest
from dagster import DagsterRunStatus

from episode_pipeline.orchestration.upload_runs import latest_state
from episode_pipeline.runtime import metrics
from episode_pipeline.uploads import reasons
from episode_pipeline.uploads.dead_letters import as_dead_letter
from episode_pipeline.uploads.reasons import (
    LATEST_FAILED,
    LATEST_IN_FLIGHT,
    LATEST_SUCCEEDED,
    Reason,
    RecordedReason,
    UploadRuns,
    dead_letter_reason,
    redelivered_without_run,
)
from episode_pipeline_tests.test_events import event, record

ARCHIVE = "orgs/acme/episodes/ep-1/take.tar.zst"
NO_OBJECT = reasons.no_object(f"s3://bucket/{ARCHIVE}", 3)


def recorded(reason: Reason, receive: int = 3) -> RecordedReason:
    return RecordedReason(reason.kind, reason.text, receive, 1_700_000_000.0)


def failed_runs(runs: int = 3) -> UploadRuns:
    return UploadRuns(
        runs=runs,
        failures=runs,
        latest_run_id="r3",
        latest_state=LATEST_FAILED,
        last_failed_run_id="r3",
        error="episode: EpisodeNotFound: acme/ep-1 has no row in `episodes`",
    )


# -- the rule `dlq list` applies ----------------------------------------------------------------


def test_a_missing_object_is_named_from_the_sensors_record() -> None:
    why = dead_letter_reason(body_problem=None, recorded=recorded(NO_OBJECT), runs=UploadRuns(0, 0))
    assert why.kind == reasons.NO_OBJECT
    assert why.text.startswith(f"no object at s3://bucket/{ARCHIVE} (HEAD 404 at receive 3")


def test_the_body_decides_first_then_the_runs_then_the_record() -> None:
    bad_key = Reason(reasons.BAD_KEY, "Records[0].s3.object.key: invalid org id 'a b'")
    assert dead_letter_reason(body_problem=bad_key, recorded=None, runs=None) == bad_key
    # A record of a receive that found no object, then a run that failed on the next receives:
    # the runs are newer than the record.
    why = dead_letter_reason(body_problem=None, recorded=recorded(NO_OBJECT, 1), runs=failed_runs())
    assert why.kind == reasons.RUN_FAILED
    assert why.text == (
        "3 failed run(s) of 3; last failed run r3: episode: EpisodeNotFound: acme/ep-1 has no "
        "row in `episodes`"
    )


@pytest.mark.parametrize("state", [LATEST_IN_FLIGHT, LATEST_SUCCEEDED])
def test_a_message_dead_lettered_while_its_run_worked_says_so(state: str) -> None:
    runs = UploadRuns(runs=2, failures=1, latest_run_id="r2", latest_state=state)
    why = dead_letter_reason(body_problem=None, recorded=None, runs=runs)
    assert why.kind == reasons.IN_FLIGHT
    assert f"run r2 {state}" in why.text


def test_no_run_and_no_record_means_every_tick_that_received_it_failed() -> None:
    why = dead_letter_reason(body_problem=None, recorded=None, runs=UploadRuns(0, 0))
    assert why.kind == reasons.NO_RUN and "every tick that received it failed" in why.text
    no_run = reasons.no_run("acme/ep-1@e", 3)
    assert (
        dead_letter_reason(body_problem=None, recorded=recorded(no_run), runs=UploadRuns(0, 0))
        == no_run
    )


def test_without_dagster_the_record_still_speaks_and_nothing_else_is_unknown() -> None:
    assert dead_letter_reason(body_problem=None, recorded=recorded(NO_OBJECT), runs=None) == (
        NO_OBJECT
    )
    assert dead_letter_reason(body_problem=None, recorded=None, runs=None).kind == reasons.UNKNOWN


def test_every_reason_has_a_kind_of_the_list() -> None:
    made = [
        NO_OBJECT,
        reasons.no_run("u", 2),
        reasons.run_failed("u", "r", 2),
        reasons.in_flight("u", "r", 2),
    ]
    assert {r.kind for r in made} <= set(reasons.LEFT_REASONS)
    assert set(reasons.LEFT_REASONS) < set(reasons.REASONS)


# -- the sensor's redelivery rule ----------------------------------------------------------------


def test_a_redelivery_without_a_run_is_a_run_never_created() -> None:
    assert not redelivered_without_run(1, None)  # a first receive requests the first run
    assert redelivered_without_run(2, None)  # receive 1 requested one; none exists
    # Receive 1 found no object, so it requested nothing: receive 2 is not "no run".
    assert not redelivered_without_run(2, recorded(NO_OBJECT, receive=1))
    # Receive 1 found no object, receive 2 found it and requested a run: none at receive 3.
    assert redelivered_without_run(3, recorded(NO_OBJECT, receive=1))
    assert redelivered_without_run(3, recorded(reasons.no_run("u", 2), receive=2))


def test_the_latest_run_status_maps_to_its_state() -> None:
    assert latest_state(None) is None
    assert latest_state(DagsterRunStatus.QUEUED) == LATEST_IN_FLIGHT
    assert latest_state(DagsterRunStatus.STARTED) == LATEST_IN_FLIGHT
    assert latest_state(DagsterRunStatus.SUCCESS) == LATEST_SUCCEEDED
    assert latest_state(DagsterRunStatus.FAILURE) == LATEST_FAILED
    assert latest_state(DagsterRunStatus.CANCELED) == LATEST_FAILED


def test_a_record_survives_json_and_a_damaged_one_is_ignored() -> None:
    kept = recorded(NO_OBJECT)
    assert RecordedReason.from_json(kept.to_json()) == kept
    for raw in ("", "[]", "{}", json.dumps({"kind": "no_object", "text": "x"}), "nope"):
        assert RecordedReason.from_json(raw) is None


# -- the body's own reasons ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "kind", "says"),
    [
        ("not json", reasons.MALFORMED, "body is not JSON"),
        (json.dumps({"hello": "world"}), reasons.MALFORMED, "no Records list"),
        (event(record("uploads/acme/ep-1/x.tar.zst")), reasons.BAD_KEY, "is not orgs/<org_id>"),
        (event(record("orgs/a+b/episodes/ep/x.tar.zst")), reasons.BAD_KEY, "invalid org id 'a b'"),
        (json.dumps({"Event": "s3:TestEvent"}), reasons.NO_WORK, "s3:TestEvent"),
        (event(record("orgs/acme/episodes/ep/notes.txt")), reasons.NO_WORK, "not a .zst archive"),
    ],
    ids=["not-json", "not-s3", "outside-orgs", "unkeyable-id", "test-event", "no-work"],
)
def test_a_body_that_announces_no_upload_says_why(body: str, kind: str, says: str) -> None:
    letter = as_dead_letter({"MessageId": "m", "ReceiptHandle": "h", "Body": body})
    assert letter.uploads == ()
    assert letter.body_reason is not None and letter.body_reason.kind == kind
    assert says in letter.body_reason.text
    assert dead_letter_reason(body_problem=letter.body_reason, recorded=None, runs=None) == (
        letter.body_reason
    )


# -- the metric by reason --------------------------------------------------------------------------


def test_messages_left_are_counted_and_written_by_reason() -> None:
    with metrics.counting_tick({metrics.MESSAGES_LEFT: 0}) as counts:
        metrics.count_reason(metrics.MESSAGES_LEFT, reasons.NO_OBJECT)
        metrics.count_reason(metrics.MESSAGES_LEFT, reasons.NO_OBJECT)
        metrics.count_reason(metrics.MESSAGES_LEFT, reasons.MALFORMED)
    assert counts.values == {metrics.MESSAGES_LEFT: 3}
    assert counts.by_reason == {metrics.MESSAGES_LEFT: {"no_object": 2, "malformed": 1}}

    written: list[str] = []
    emitter = metrics.Emitter("t", write=written.append)
    emitter.sensor_tick("episode_uploads", 0.1, False, counts.values, counts.by_reason)
    tick, *by_reason = [json.loads(line) for line in written]
    assert tick["MessagesLeft"] == 3 and "Reason" not in tick
    assert [(d["Reason"], d["MessagesLeft"]) for d in by_reason] == [
        ("malformed", 1),
        ("no_object", 2),
    ]
    for document in by_reason:
        (directive,) = document["_aws"]["CloudWatchMetrics"]
        assert directive["Dimensions"] == [["Deployment", "Sensor", "Reason"]]
        assert directive["Metrics"] == [{"Name": "MessagesLeft", "Unit": "Count"}]
        assert document["Sensor"] == "episode_uploads"
