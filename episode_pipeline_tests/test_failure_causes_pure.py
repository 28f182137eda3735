"""The one failure taxonomy (runtime/failure_causes.py): a failure's cause by its exception's
type, read from the stored name, and backpressure (throttled, no capacity, Retry-After) read from
its text."""

from __future__ import annotations

import pytest

from episode_pipeline.defs.assets.hls_renditions import StorageUnavailable, TranscodeInterrupted
from episode_pipeline.runtime.failure_causes import (
    CAUSE_OF_NAME_ABOVE_THE_CORE,
    CAUSES,
    NO_CAPACITY,
    OTHER,
    THROTTLED,
    cause_class,
    classify_error,
    retry_after_seconds,
)
from episode_pipeline_tests.support.dagster_internals import DagsterAssetCheckFailedError


@pytest.mark.parametrize(
    ("errors", "cause"),
    [
        ([("extracted_files", "CorruptArchive", "not a zstd frame")], "bad_archive"),
        ([("extracted_files", "NotALeRobotDataset", "no meta/info.json")], "bad_archive"),
        ([("hls_renditions", "TranscodeFailed", "ffmpeg exited 1")], "transcode"),
        ([("frames", "psycopg.errors.UniqueViolation", "duplicate key")], "database"),
        ([("frames", "OperationalError", "connection refused")], "database"),
        ([("hls_renditions", "DeadlineExceeded", "ffmpeg ran past 600 s")], "timeout"),
        ([(None, "failure", "exceeded maximum runtime of 7200 seconds")], "timeout"),
        ([("extracted_files", "ClientError", "SlowDown")], "storage"),
        ([(None, "failure", "its process is gone (killed or crashed)")], "run_crashed"),
        ([], "run_crashed"),
        ([("frames", "KeyError", "'x'")], "other"),
    ],
)
def test_cause_classes(errors: list, cause: str) -> None:
    assert cause_class(errors) == cause
    assert cause in CAUSES


@pytest.mark.parametrize(
    ("error_type", "cause"),
    [
        ("TooManyMembers", "bad_archive"),  # a subclass of a declared type: ArchiveError's
        ("UniqueViolation", "database"),  # psycopg.Error's, by its bare name as Dagster keeps it
        ("QueryCanceled", "timeout"),  # the statement timeout: nearer than psycopg.Error
        ("EventStreamError", "storage"),  # botocore's ClientError's
        ("TranscodeDeadlineExceeded", "timeout"),  # declared: nearer than TranscodeFailed
        ("MissingStoredOutput", "storage"),  # the S3 IO manager's: an input never stored
    ],
)
def test_a_subclass_has_its_nearest_declared_ancestors_cause(error_type: str, cause: str) -> None:
    assert cause_class([("frames", error_type, "no words that tell")]) == cause


def test_the_exceptions_named_above_the_core_exist_under_those_names() -> None:
    """The core names the exceptions it may not import: a rename of one fails here."""
    named = (
        TranscodeInterrupted,
        StorageUnavailable,
        DagsterAssetCheckFailedError,
    )
    assert {error.__name__ for error in named} == set(CAUSE_OF_NAME_ABOVE_THE_CORE)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            "ClientError: An error occurred (SlowDown) when calling the PutObject operation",
            THROTTLED,
        ),
        ("ClientError: An error occurred (503) when calling the PutObject operation", THROTTLED),
        ("ClientError: An error occurred (429) when calling the HeadObject operation", THROTTLED),
        ("ServiceUnavailable: Service Unavailable", THROTTLED),
        ("botocore 503 Service Unavailable", THROTTLED),
        ("ResponseError: too many 503 error responses", THROTTLED),
        ("unexpected status code 503 from s3", THROTTLED),
        ("HTTP/1.1 503 Slow Down", THROTTLED),
        ("{'ResponseMetadata': {'HTTPStatusCode': 503}}", THROTTLED),
        ("ThrottlingException: Rate exceeded (RunTask)", THROTTLED),
        (
            "ClientError: An error occurred (ThrottlingException) when calling the RunTask "
            "operation (reached max retries: 4): Rate exceeded",
            THROTTLED,
        ),
        ("Capacity is unavailable at this time", NO_CAPACITY),
        ("RESOURCE:MEMORY", NO_CAPACITY),
        ("Exception: Task failed. Failure reason: RESOURCE:CPU", NO_CAPACITY),
        ("frames: ValueError: bad parquet", OTHER),
        # Issue 32, finding 10: an id with 503 or 429 in it is not a throttle.
        ("extracted_files: ValueError: acme/ep-503: bad tar header", OTHER),
        ("frames: KeyError: 'camera-429'", OTHER),
        ("episode ep_503 429 frames short", OTHER),
        (None, OTHER),
    ],
)
def test_run_errors_are_classified(message: str | None, expected: str) -> None:
    assert classify_error(message) == expected


def test_a_retry_after_in_the_error_is_read() -> None:
    assert retry_after_seconds("SlowDown ... 'Retry-After': '7'") == 7.0
    assert retry_after_seconds("SlowDown") is None
