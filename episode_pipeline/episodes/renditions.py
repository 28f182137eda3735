"""The `hls_renditions` step's work around its transcode: each camera's job, and what the
transcode's outcome leaves to do (docs/contract.md#hls-renditions).

A video's own bad content is listed (`failed_video_rows`) and the episode can still be
processed. An infrastructure error is not a bad video (`transcode.job.describe_failure`): S3
failing once botocore's retries ran out, the transcode process dying, stopped or past its
deadline. Then nothing is removed (the earlier run's HLS stays whole) and `settle_transcode`
returns the causes, whether S3 failed and the `Retry-After` it sent; the asset retries or fails.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from episode_pipeline.episodes.extracted_files import ExtractedFiles, ProcessedFile
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.storage.aws import aws_fault
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.transcode.job import (
    INFRASTRUCTURE,
    CameraJob,
    FailedVideo,
    TranscodeOutcome,
    TranscodeResult,
)


def camera_jobs(ref: EpisodeRef, cameras: dict[str, list[ProcessedFile]]) -> list[CameraJob]:
    """One job per camera: its mp4s, played back to back, into `processed/hls/<camera>/`."""
    return [
        CameraJob(camera=c, sources=[f.key for f in files], output_prefix=ref.hls_prefix(c))
        for c, files in cameras.items()
    ]


def stale_cameras(bucket: Bucket, ref: EpisodeRef, cameras: set[str]) -> set[str]:
    """Camera folders under `hls/` that this upload no longer has (a re-upload dropped them)."""
    root = ref.hls_root
    found = {key[len(root) :].split("/", 1)[0] for key in bucket.list_keys(root)}
    return {camera for camera in found if camera and camera not in cameras}


def episode_seconds(extracted: ExtractedFiles) -> float | None:
    """The episode's length by its info.json, to size the transcode's deadline (None: unknown)."""
    try:
        return extracted.dataset_info().duration_seconds
    except ValueError:
        return None


def infrastructure_failures(
    cameras: list[str], outcome: TranscodeOutcome
) -> tuple[list[TranscodeResult], list[str]]:
    """The reported results, one per camera, and the infrastructure failures among them: a camera
    that reported one, and a camera not reported at all (the process died, was stopped or ran past
    the transcode's deadline), which carries the process's error."""
    results, causes = [], []
    for camera in cameras:
        result = outcome.results.get(camera)
        if result is None:
            result = TranscodeResult(
                camera=camera,
                playlist_key=None,
                error=f"transcode failed: {outcome.error or 'not reported'}",
                error_kind=INFRASTRUCTURE,
                error_code=outcome.error_code,
                retry_after_seconds=outcome.retry_after_seconds,
            )
        results.append(result)
        if result.infrastructure_failed:
            causes.append(result)
    return results, [f"camera {r.camera}: {r.error}" for r in causes]


def failed_videos(result: TranscodeResult, files: list[ProcessedFile]) -> list[FailedVideo]:
    """The camera's mp4s that made no video: those left out, and all the others when the
    camera as a whole failed."""
    left_out = {f.key for f in result.failed}
    if result.error is None:
        return result.failed
    return result.failed + [
        FailedVideo(f.key, result.error) for f in files if f.key not in left_out
    ]


@dataclass(frozen=True)
class SettledTranscode:
    """Every camera's result, and the infrastructure errors (none: the HLS is complete)."""

    results: list[TranscodeResult]
    causes: list[str]
    storage: bool  # S3 failed (in the transcode or removing stale cameras), not the process
    retry_after: float | None  # the longest Retry-After sent, if any


def settle_transcode(
    bucket: Bucket,
    ref: EpisodeRef,
    cameras: dict[str, list[ProcessedFile]],
    outcome: TranscodeOutcome,
    log: logging.Logger,
) -> SettledTranscode:
    """The cameras' results; when every camera of this upload is up, its stale cameras removed."""
    results, causes = infrastructure_failures(list(cameras), outcome)
    stale_fault = None
    if not causes:
        try:  # last, once every camera of this upload is up: the cameras it no longer has
            for camera in sorted(stale_cameras(bucket, ref, set(cameras))):
                removed = bucket.delete_prefix(ref.hls_prefix(camera))
                log.info(
                    f"removed {removed} stale object(s) of camera {camera} (no longer uploaded)"
                )
        except Exception as error:
            fault = aws_fault(error)
            if fault is None:
                raise
            causes.append(f"removing stale cameras under {bucket.uri(ref.hls_root)}: {error}")
            stale_fault = fault
    if not causes:
        return SettledTranscode(results, causes, storage=False, retry_after=None)
    failing = [r for r in results if r.infrastructure_failed]
    waits = [r.retry_after_seconds for r in failing] + [outcome.retry_after_seconds]
    if stale_fault is not None:
        waits.append(stale_fault.retry_after_seconds)
    # S3 failing in the transcode (a camera's own report) or here; else the process or ECS.
    reported = [r for r in failing if r.camera in outcome.results]
    return SettledTranscode(
        results,
        causes,
        storage=any(r.error_code for r in reported) or stale_fault is not None,
        retry_after=max((w for w in waits if w is not None), default=None),
    )


def failed_video_rows(
    results: list[TranscodeResult], cameras: dict[str, list[ProcessedFile]], log: logging.Logger
) -> list[dict[str, Any]]:
    """Every mp4 that made no video, logged, as the `failed_videos` entry lists it."""
    failed = []
    for result in results:
        for item in failed_videos(result, cameras[result.camera]):
            log.warning(f"camera {result.camera}: {item.error}")
            failed.append({"camera": result.camera, "key": item.key, "error": item.error})
    return failed
