"""`hls_renditions`: every camera's HLS, transcoded by a Dagster Pipes process.

Per camera under `processed/hls/<camera>/`: the compatibility rendition `playlist.m3u8`
(baseline, level 3.0, 4-second segments), an adaptive ladder beside it listed by `master.m3u8`,
and `poster.jpg` (docs/contract.md#hls-renditions). All cameras of the episode go to one
transcode process (a subprocess of the run, or an ECS task of its own), encoded in parallel
inside it.

A video's own bad content is logged and the episode can still be processed: a camera whose
videos fail is listed in `failed_videos` and the asset still materializes; the WARN checks
(`checks/hls.py`) then flag the episode, camera by camera. An infrastructure error is not a bad
video (`transcode.job.describe_failure`): S3 failing once botocore's retries ran out, the
transcode process dying, stopped or past its deadline. Then nothing is removed (the earlier
run's HLS stays whole) and the step raises `RetryRequested`, waiting the `Retry-After` S3 sent
or backing off, up to `TRANSCODE_STEP_RETRIES` times; the last try fails with a `Failure`
naming the camera, the S3 key, the error code and `Retry-After: N`, so the run fails and the
episode is `failed` with that cause. Why not an asset `RetryPolicy`: its wait is fixed by the
definition and cannot follow a Retry-After, and it would retry a content error's raise too.

Several mp4s of one camera (a v2.1 archive holding several LeRobot episodes, or a v3.0 camera
split into files) are played back to back in path order (`path_order`: file-2 before file-10)
as one stream.
"""

import time
from collections.abc import Mapping
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetIn,
    Failure,
    MaterializeResult,
    MetadataValue,
    RetryRequested,
)

from episode_pipeline.defs.asset_keys import EXTRACTED_FILES_KEY
from episode_pipeline.defs.metadata import bucket_links, materialized, table
from episode_pipeline.defs.partitions import SERVING, episode_asset
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.defs.resources.transcoder import HlsTranscoder
from episode_pipeline.episodes.extracted_files import ExtractedFiles, videos_by_camera
from episode_pipeline.episodes.hls_tables import (
    CAMERA_COLUMNS,
    RENDITION_COLUMNS,
    SOURCE_COLUMNS,
    STORYBOARD_METADATA_PREFIX,
    camera_row,
    posters_markdown,
    rendition_rows,
    source_rows,
    storyboard_markdown,
)
from episode_pipeline.episodes.keys import EpisodeRef, parse_partition_key
from episode_pipeline.episodes.renditions import (
    camera_jobs,
    episode_seconds,
    failed_video_rows,
    settle_transcode,
)
from episode_pipeline.instance.run_tags import ECS_CPU_TAG, ECS_MEMORY_TAG
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.storage.links import BucketLinks
from episode_pipeline.transcode.job import TranscodeOutcome, TranscodeResult, retry_wait


class StorageUnavailable(Failure):
    """The transcode's last try failed on S3 (or another AWS call): the run fails with it."""


class TranscodeInterrupted(Failure):
    """The transcode's last try failed because its process died, was stopped or ran late, or
    ECS would not start its task (throttled, no capacity)."""


def retry_or_fail(
    context: AssetExecutionContext,
    transcoder: HlsTranscoder,
    causes: list[str],
    *,
    storage: bool,
    retry_after: float | None,
) -> Exception:
    """What to raise after an infrastructure error: `RetryRequested` while tries are left, then
    the `Failure` naming every cause (its text carries `Retry-After: N` when S3 sent one)."""
    attempt = context.retry_number
    cause = "; ".join(causes)
    wait = retry_wait(attempt, transcoder.step_retries, transcoder.step_retry_seconds, retry_after)
    if wait is None:
        failure = StorageUnavailable if storage else TranscodeInterrupted
        return failure(
            description=f"{cause} (try {attempt + 1} of {transcoder.step_retries + 1}; the "
            "earlier HLS was left in place)",
        )
    context.log.warning(
        f"infrastructure error, try {attempt + 1} of {transcoder.step_retries + 1}, again in "
        f"{wait:g} s ({'Retry-After' if retry_after is not None else 'backoff'}): {cause}"
    )
    return RetryRequested(max_retries=transcoder.step_retries, seconds_to_wait=wait)


@episode_asset(
    kinds={"ffmpeg", "s3"},
    tags=SERVING,
    # Bump when the same videos give other segments or playlists (video/, transcode/); the
    # encoder settings (preset, ladder) are appended by definitions.py.
    code_version="2",
    ins={"extracted_files": AssetIn(key=EXTRACTED_FILES_KEY)},
    description="The episode's video as HLS, per camera: the compatibility stream "
    "`processed/hls/<camera>/playlist.m3u8` (H.264 baseline, level 3.0, 4-second segments), an "
    "adaptive ladder beside it listed by `master.m3u8` (never above the source), "
    "`poster.jpg`, and a storyboard (`storyboard.jpg` sprite, `storyboard.vtt`). All cameras go "
    "to one `python -m episode_pipeline.transcode` through Dagster Pipes (a subprocess of the "
    "run; an ECS task of its own when the run's "
    "`episode_pipeline/transcoder` tag says `ecs`). A video that cannot be "
    "transcoded is listed in `failed_videos`; it does not fail the episode.",
)
def hls_renditions(
    context: AssetExecutionContext,
    extracted_files: ExtractedFiles,
    s3: S3BucketResource,
    transcoder: HlsTranscoder,
) -> MaterializeResult:
    ref = parse_partition_key(context.partition_key)
    bucket = s3.get_client()
    links = bucket_links(s3)
    cameras = videos_by_camera(extracted_files)
    # The run's own S3 deadlines, for the transcode's client.
    job = transcoder.job(bucket.name, camera_jobs(ref, cameras), bucket.deadlines)
    started = time.monotonic()
    outcome = (
        transcoder.transcode(context, job, episode_seconds(extracted_files))
        if job.cameras
        else TranscodeOutcome()
    )
    transcode_seconds = time.monotonic() - started
    if outcome.error:
        context.log.error(f"transcode: {outcome.error}")
    settled = settle_transcode(bucket, ref, cameras, outcome, context.log)
    if settled.causes:
        raise retry_or_fail(
            context,
            transcoder,
            settled.causes,
            storage=settled.storage,
            retry_after=settled.retry_after,
        )
    failed = failed_video_rows(settled.results, cameras, context.log)
    return materialized(
        context,
        materialization_metadata(
            ref,
            bucket,
            links,
            settled.results,
            outcome,
            transcode_seconds,
            failed,
            context.run.tags,
        ),
    )


def materialization_metadata(
    ref: EpisodeRef,
    bucket: Bucket,
    links: BucketLinks,
    results: list[TranscodeResult],
    outcome: TranscodeOutcome,
    transcode_seconds: float,
    failed: list[dict[str, Any]],
    run_tags: Mapping[str, str],
) -> dict[str, Any]:
    """What the materialization shows: the cameras' tables, posters and storyboards, the
    transcode's figures (the sync check and the timeline read the `sources` table back)."""
    metadata: dict[str, Any] = {
        "cameras": ", ".join(r.camera for r in results) or "(none)",
        "playlists": MetadataValue.json([r.playlist_key for r in results if r.playlist_key]),
        "masters": MetadataValue.json([r.master_key for r in results if r.master_key]),
        "per_camera": table(CAMERA_COLUMNS, [camera_row(r) for r in results]),
        "sources": table(SOURCE_COLUMNS, [row for r in results for row in source_rows(r)]),
        "renditions": table(RENDITION_COLUMNS, [row for r in results for row in rendition_rows(r)]),
        "posters": MetadataValue.md(posters_markdown(bucket, links, results)),
        "segments": sum(r.segments for r in results),
        "seconds": round(sum(r.seconds for r in results), 3),
        "ffmpeg_seconds": round(sum(r.ffmpeg_seconds for r in results), 3),
        "transcode_seconds": round(transcode_seconds, 3),
        "transcode_deadline_seconds": outcome.deadline_seconds,
        "failed_videos": MetadataValue.json(failed),
        "transcoder": outcome.mode,
        "hls_prefix": MetadataValue.url(links.folder(ref.hls_root)),
    }
    for result in results:  # after the tables, one inline entry per camera
        if (markdown := storyboard_markdown(result, links)) is not None:
            metadata[STORYBOARD_METADATA_PREFIX + result.camera] = MetadataValue.md(markdown)
    if outcome.task_size is not None:
        metadata["transcode_task"] = (
            f"{outcome.task_size.vcpus} vCPU / {outcome.task_size.memory} MiB"
        )
    if ECS_CPU_TAG in run_tags:  # the run's own task, sized by the uploads sensor
        metadata["run_task"] = (
            f"{int(run_tags[ECS_CPU_TAG]) / 1024:g} vCPU / {run_tags.get(ECS_MEMORY_TAG)} MiB"
        )
    if outcome.error:
        metadata["transcode_error"] = outcome.error
    return metadata
