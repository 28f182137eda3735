"""What a camera's failure means (issue 32, finding 0), pure: a file's own bad content takes the
contract's tolerance; an infrastructure error (S3, the disk, the process) fails the step, which
is retried, and removes nothing. Also the rule of what a successful run deletes afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import S3Transfer
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError
from botocore.stub import Stubber

from episode_pipeline.config.settings import AwsSettings, S3Deadlines
from episode_pipeline.runtime.failure_causes import retry_after_seconds
from episode_pipeline.storage.aws import AwsFault, aws_client, aws_fault
from episode_pipeline.transcode.job import (
    CONTENT,
    INFRASTRUCTURE,
    MAX_RETRY_WAIT_SECONDS,
    TranscodeError,
    TranscodeJob,
    TranscodeResult,
    describe_failure,
    leftover_keys,
    retry_wait,
)
from episode_pipeline.transcode.program import StorageCallFailed
from episode_pipeline.video.playlist import PlaylistError
from episode_pipeline.video.probe import ProbeError
from episode_pipeline.video.process import DeadlineExceeded

PREFIX = "orgs/o/episodes/e/processed/hls/front/"


def slow_down(retry_after: str | None = "5") -> ClientError:
    headers = {"content-type": "application/xml"}
    if retry_after is not None:
        headers["retry-after"] = retry_after
    return ClientError(
        {
            "Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."},
            "ResponseMetadata": {"HTTPStatusCode": 503, "HTTPHeaders": headers},
        },
        "PutObject",
    )


@pytest.mark.parametrize(
    "error",
    [
        TranscodeError("ffmpeg exited 1 for camera front: bad stream"),
        DeadlineExceeded("ffmpeg for camera front", 3),
        PlaylistError("front/playlist.m3u8: no segments"),
        ProbeError("no video stream"),
        ValueError("no SPS in the first segment"),
    ],
)
def test_the_files_own_bad_content_is_content(error: Exception) -> None:
    facts = describe_failure(error)
    assert (facts.kind, facts.message, facts.code) == (CONTENT, str(error), None)


@pytest.mark.parametrize(
    "error",
    [
        OSError(28, "No space left on device"),
        EndpointConnectionError(endpoint_url="http://s3"),
        ReadTimeoutError(endpoint_url="http://s3"),
        RuntimeError("nobody foresaw this"),
        KeyError("renditions"),
    ],
)
def test_everything_else_is_infrastructure(error: Exception) -> None:
    assert describe_failure(error).kind == INFRASTRUCTURE


def test_an_s3_error_is_infrastructure_with_its_code_and_retry_after_from_the_headers() -> None:
    error = slow_down("5")
    assert "Retry-After" not in str(error)  # botocore's text does not carry it
    facts = describe_failure(error)
    assert (facts.kind, facts.code, facts.retry_after_seconds) == (INFRASTRUCTURE, "SlowDown", 5)
    assert "SlowDown (HTTP 503), Retry-After: 5" in facts.message
    assert retry_after_seconds(facts.message) == 5.0  # the governor reads it from the text


def test_an_s3_error_wrapped_in_a_content_like_error_is_still_infrastructure() -> None:
    """A ValueError raised while handling an S3 error is not the file's fault."""
    try:
        try:
            raise slow_down("2")
        except ClientError as s3_error:
            raise StorageCallFailed("upload of s3://b/k.m3u8: failed") from s3_error
    except StorageCallFailed as error:
        facts = describe_failure(error)
    assert facts.kind == INFRASTRUCTURE and facts.retry_after_seconds == 2
    assert facts.message.startswith("upload of s3://b/k.m3u8")


def test_a_retry_after_that_is_not_delta_seconds_is_not_guessed() -> None:
    assert aws_fault(slow_down("Wed, 21 Oct 2026 07:28:00 GMT")) == AwsFault("SlowDown", 503)
    assert aws_fault(slow_down(None)) == AwsFault("SlowDown", 503)
    assert aws_fault(ValueError("x")) is None


def test_boto3s_upload_failed_error_keeps_the_client_error_as_its_context(tmp_path: Path) -> None:
    """Found out, not guessed: boto3's `S3Transfer.upload_file` raises `S3UploadFailedError`
    inside `except ClientError` without `from`, so the response (and its Retry-After) is reached
    through `__context__`. The real transfer code; only the HTTP answer is botocore's Stubber."""
    aws = AwsSettings(region="us-east-1", access_key_id="k", secret_access_key="s")
    client = aws_client("s3", aws)
    source = tmp_path / "playlist.m3u8"
    source.write_text("#EXTM3U\n")
    with Stubber(client) as stub:
        stub.add_client_error(
            "put_object",
            service_error_code="SlowDown",
            service_message="Please reduce your request rate.",
            http_status_code=503,
            response_meta={"HTTPHeaders": {"retry-after": "7"}},
        )
        with pytest.raises(S3UploadFailedError) as raised:
            S3Transfer(client).upload_file(str(source), "bucket", "k/playlist.m3u8")
    assert raised.value.__cause__ is None
    assert isinstance(raised.value.__context__, ClientError)
    facts = describe_failure(raised.value)
    assert (facts.kind, facts.code, facts.retry_after_seconds) == (INFRASTRUCTURE, "SlowDown", 7)


def test_the_step_waits_the_retry_after_else_backs_off_and_stops_after_the_last_try() -> None:
    assert retry_wait(0, 3, 30, retry_after=5) == 5
    assert [retry_wait(n, 3, 30, None) for n in range(4)] == [30, 60, 120, None]
    assert retry_wait(0, 3, 30, retry_after=10_000) == MAX_RETRY_WAIT_SECONDS
    assert retry_wait(0, 0, 30, retry_after=1) is None


def test_only_what_this_run_did_not_write_is_deleted_and_only_under_the_prefix() -> None:
    existing = [
        f"{PREFIX}master.m3u8",
        f"{PREFIX}playlist.m3u8",
        f"{PREFIX}segment_00000.ts",
        f"{PREFIX}segment_00001.ts",  # a longer earlier upload's
        f"{PREFIX}1080p/segment_00000.ts",  # a rung no longer made
        "orgs/o/episodes/e/processed/hls/wrist/segment_00001.ts",  # another camera's
    ]
    written = {f"{PREFIX}master.m3u8", f"{PREFIX}playlist.m3u8", f"{PREFIX}segment_00000.ts"}
    assert leftover_keys(existing, written, PREFIX) == [
        f"{PREFIX}1080p/segment_00000.ts",
        f"{PREFIX}segment_00001.ts",
    ]
    assert leftover_keys(sorted(written), written, PREFIX) == []


def test_a_results_kind_crosses_the_pipes_boundary_and_an_older_programs_is_content() -> None:
    result = TranscodeResult(
        camera="front",
        playlist_key=None,
        error="upload failed [SlowDown (HTTP 503), Retry-After: 1]",
        error_kind=INFRASTRUCTURE,
        error_code="SlowDown",
        retry_after_seconds=1.0,
    )
    assert TranscodeResult.from_message(result.to_message()) == result
    assert result.infrastructure_failed
    older = result.to_message()
    for name in ("error_kind", "error_code", "retry_after_seconds"):
        del older["result"][name]
    assert TranscodeResult.from_message(older).error_kind == CONTENT


def test_the_jobs_s3_deadlines_reach_the_transcode() -> None:
    job = TranscodeJob(bucket="b", cameras=[], s3_deadlines=S3Deadlines(max_attempts=2))
    extras = job.to_extras() | {
        "cameras": [{"camera": "c", "sources": ["k"], "output_prefix": "p/"}]
    }
    assert TranscodeJob.from_extras(extras).s3_deadlines.max_attempts == 2
    del extras["s3_deadlines"]  # an older sender: the defaults
    assert TranscodeJob.from_extras(extras).s3_deadlines == S3Deadlines()
