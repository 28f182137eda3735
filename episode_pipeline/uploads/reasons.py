"""Why an upload message is on its way to the dead-letter queue, or in it (pure, no I/O).

SQS moves a message to the dead-letter queue after `SQS_MAX_RECEIVE_COUNT` receives that did
not delete it, and keeps nothing about why. Each way a delivery can leave its message unfinished
has a kind here, used three times: the uploads sensor's log line and its `MessagesLeft` metric
(dimension `Reason`), and `episode-pipeline dlq list`, which shows the reason beside each message.

Where each reason lives, durably (SQS cannot edit a message in place):

- `malformed`: the body is not an S3 event (not JSON, a field missing). Read: the body.
- `bad_key`: the key names no episode (outside orgs/…/episodes/…, or an invalid id). Read: the
  body.
- `no_object`: HEAD 404: the object was deleted since the event, or the event's key decodes to
  another object's. Read: the sensor's record (Dagster's key-value table, by message id:
  instance/app_state.py).
- `no_run`: a run was requested but none exists at the next receive (the tick failed after
  deciding). Read: the sensor's record, else the absence of runs.
- `run_failed`: the upload's runs failed on each receive. Read: Dagster's runs of the upload.
- `in_flight`: delivered again while its run was queued or running. Read: the upload's runs.
- `no_work`: asks for no work (the sensor deletes these: seen only if it never ran). Read: the
  body.
- `unknown`: none of the above could be read (no Dagster instance).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

MALFORMED = "malformed"
BAD_KEY = "bad_key"
NO_OBJECT = "no_object"
NO_RUN = "no_run"
RUN_FAILED = "run_failed"
IN_FLIGHT = "in_flight"
NO_WORK = "no_work"
UNKNOWN = "unknown"
# What the sensor's `MessagesLeft` counts by `Reason` (the list adds no_work and unknown).
LEFT_REASONS = (MALFORMED, BAD_KEY, NO_OBJECT, NO_RUN, RUN_FAILED, IN_FLIGHT)
REASONS = (*LEFT_REASONS, NO_WORK, UNKNOWN)


@dataclass(frozen=True)
class Reason:
    """Why a message is left unfinished: its kind (`REASONS`) and one line for an operator."""

    kind: str
    text: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.text}"


@dataclass(frozen=True)
class RecordedReason:
    """What the uploads sensor recorded about one message the last time it left it."""

    kind: str
    text: str
    receive: int
    at: float  # epoch seconds: retention expires old records by it

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> RecordedReason | None:
        """None for a record this code cannot read (another version's, or damaged)."""
        try:
            data = json.loads(raw)
            kind, text = str(data["kind"]), str(data["text"])
            return cls(kind, text, int(data["receive"]), float(data["at"]))
        except (ValueError, TypeError, KeyError):
            return None


# -- the sensor's side: why it leaves a delivery unfinished ---------------------------------------


def no_object(location: str, receive: int) -> Reason:
    return Reason(
        NO_OBJECT,
        f"no object at {location} (HEAD 404 at receive {receive}: deleted since the event, or "
        "the event's key decodes to another object's)",
    )


def no_run(upload: str, receive: int) -> Reason:
    return Reason(
        NO_RUN,
        f"{upload} has no run at receive {receive}, although an earlier receive requested one: "
        "that tick failed after deciding (adding the partition or creating the run; see the "
        "sensor's failed ticks)",
    )


def run_failed(upload: str, run_id: str, receive: int) -> Reason:
    return Reason(
        RUN_FAILED, f"{upload}: run {run_id} did not succeed (receive {receive}); a retry runs"
    )


def in_flight(upload: str, run_id: str, receive: int) -> Reason:
    return Reason(
        IN_FLIGHT,
        f"{upload}: delivered again (receive {receive}) while run {run_id} was queued or "
        "running: its visibility was not renewed (episode_upload_heartbeat)",
    )


def redelivered_without_run(receive: int, recorded: RecordedReason | None) -> bool:
    """A delivery whose upload has no run yet: is it a redelivery whose earlier request made no
    run? Not on the first receive, nor when the receive just before found no object (it
    requested nothing; what it recorded says why)."""
    previous_had_no_object = (
        recorded is not None and recorded.kind == NO_OBJECT and recorded.receive == receive - 1
    )
    return receive > 1 and not previous_had_no_object


# -- the list's side: why a dead letter is dead ---------------------------------------------------


LATEST_IN_FLIGHT = "queued or running"
LATEST_SUCCEEDED = "succeeded"
LATEST_FAILED = "failed"


@dataclass(frozen=True)
class UploadRuns:
    """What Dagster's runs say about one upload (`defs.runs.upload_history` and its latest)."""

    runs: int
    failures: int
    latest_run_id: str | None = None
    latest_state: str | None = None  # LATEST_IN_FLIGHT, LATEST_SUCCEEDED or LATEST_FAILED
    last_failed_run_id: str | None = None
    error: str | None = None  # the last failed run's error


def dead_letter_reason(
    *,
    body_problem: Reason | None,
    recorded: RecordedReason | None,
    runs: UploadRuns | None,
) -> Reason:
    """The reason `dlq list` shows beside one (message, upload).

    `body_problem` is what parsing the body again says (malformed, a bad key, no work); `recorded`
    what the sensor recorded when it last left the message; `runs` the upload's runs (None when
    the Dagster instance is unknown). The body decides first (it never changes); then the runs,
    which are newer than any record of a receive that found no run; then the record.
    """
    if body_problem is not None:
        return body_problem
    if runs is not None and runs.runs:
        if runs.latest_state in (LATEST_IN_FLIGHT, LATEST_SUCCEEDED):
            return Reason(
                IN_FLIGHT,
                f"run {runs.latest_run_id} {runs.latest_state}: the message was delivered again "
                "while its run worked (its visibility not renewed); a redrive of it is deleted "
                "once the run succeeded",
            )
        if runs.failures:
            return Reason(
                RUN_FAILED,
                f"{runs.failures} failed run(s) of {runs.runs}; last failed run "
                f"{runs.last_failed_run_id}: {runs.error or '(no error recorded)'}",
            )
    if recorded is not None:
        return Reason(recorded.kind, recorded.text)
    if runs is not None:
        return Reason(
            NO_RUN,
            "no run of this upload exists and the sensor recorded no reason: every tick that "
            "received it failed (see the sensor's failed ticks)",
        )
    return Reason(UNKNOWN, "nothing recorded (DAGSTER_HOME unset: runs and records not read)")
