"""`hls_renditions`: one HLS stream per camera, transcoded outside the run through Dagster Pipes.

Each mp4 → HLS (baseline, level 3.0, 4-second segments, `playlist.m3u8`) under
`processed/hls/<camera>/`; a video error is logged and the episode can still be processed
(docs/contract.md#hls-renditions). So a
camera whose videos fail is listed in `failed_videos` and the asset still materializes; the
WARN check `hls_playlists_valid` then flags the episode. Several mp4s of one camera (a v2.1
archive holding several LeRobot episodes, or a v3.0 camera split into files) are played back to
back in path order (`path_order`: file-2 before file-10) as one rendition, so nothing under
`hls/<camera>/` is overwritten.
"""

from collections import defaultdict

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetIn,
    MaterializeResult,
    MetadataValue,
)

from episode_pipeline.bucket import Bucket
from episode_pipeline.defs.assets.archive import extracted_files
from episode_pipeline.defs.partitions import episode_asset, episode_check
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.defs.resources.transcoder import HlsTranscoder
from episode_pipeline.extracted_files import ExtractedFiles, ProcessedFile
from episode_pipeline.keys import EpisodeRef, parse_partition_key
from episode_pipeline.lerobot.cameras import DEFAULT_CAMERA
from episode_pipeline.lerobot.layout import path_order
from episode_pipeline.transcode.job import FailedVideo, TranscodeJob, TranscodeResult
from episode_pipeline.video.hls import PLAYLIST_NAME
from episode_pipeline.video.playlist import PlaylistError, check_playlist, parse_playlist


def videos_by_camera(extracted: ExtractedFiles) -> dict[str, list[ProcessedFile]]:
    """Each camera's mp4s in path order (the play order of a concatenated rendition)."""
    cameras: dict[str, list[ProcessedFile]] = defaultdict(list)
    for video in extracted.videos:
        cameras[video.camera or DEFAULT_CAMERA].append(video)
    return {
        camera: sorted(files, key=lambda f: path_order(f.path))
        for camera, files in sorted(cameras.items())
    }


def stale_cameras(bucket: Bucket, ref: EpisodeRef, cameras: set[str]) -> set[str]:
    """Camera folders under `hls/` that this upload no longer has (a re-upload dropped them)."""
    root = ref.hls_root
    found = {key[len(root) :].split("/", 1)[0] for key in bucket.list_keys(root)}
    return {camera for camera in found if camera and camera not in cameras}


def camera_summary(result: TranscodeResult) -> dict[str, object]:
    first = result.sources[0].probe if result.sources else None
    return {
        "playlist": result.playlist_key,
        "sources": len(result.sources),
        "source_codec": first.codec if first else None,
        "source_resolution": first.resolution if first else None,
        "source_fps": first.fps if first else None,
        "source_duration_ms": result.source_duration_ms,
        "output_resolution": result.output_resolution,
        "segments": len(result.segment_keys),
        "seconds": result.seconds,
        "ffmpeg_seconds": result.ffmpeg_seconds,
        "failed": len(result.failed),
    }


@episode_asset(
    kinds={"ffmpeg", "s3"},
    ins={"extracted_files": AssetIn(key=extracted_files.key)},
    description="Per camera an HLS rendition (H.264 baseline, level 3.0, 4-second segments) at "
    "`processed/hls/<camera>/playlist.m3u8`, transcoded by `python -m "
    "episode_pipeline.transcode` through Dagster Pipes (a subprocess locally, an ECS task in "
    "production). A video that cannot be transcoded is listed in `failed_videos`; it does not "
    "fail the episode.",
)
def hls_renditions(
    context: AssetExecutionContext,
    extracted_files: ExtractedFiles,
    s3: S3BucketResource,
    transcoder: HlsTranscoder,
) -> MaterializeResult:
    ref = parse_partition_key(context.partition_key)
    bucket = s3.get_client()
    cameras = videos_by_camera(extracted_files)
    for camera in sorted(stale_cameras(bucket, ref, set(cameras))):
        removed = bucket.delete_prefix(ref.hls_prefix(camera))
        context.log.info(
            f"removed {removed} stale object(s) of camera {camera} (no longer uploaded)"
        )

    results: dict[str, TranscodeResult] = {}
    failed: list[dict[str, str]] = []
    for camera, files in cameras.items():
        job = TranscodeJob(
            bucket=bucket.name,
            camera=camera,
            sources=[f.key for f in files],
            output_prefix=ref.hls_prefix(camera),
            preset=transcoder.preset,
        )
        try:
            result = transcoder.transcode(context, job)
        except Exception as error:
            context.log.error(f"camera {camera}: transcode failed: {error}")
            result = TranscodeResult(
                camera=camera,
                playlist_key=None,
                failed=[FailedVideo(key=f.key, error=f"transcode failed: {error}") for f in files],
            )
        results[camera] = result
        for item in result.failed:
            context.log.warning(f"camera {camera}: {item.error}")
            failed.append({"camera": camera, "key": item.key, "error": item.error})

    playlists = [r.playlist_key for r in results.values() if r.playlist_key]
    return MaterializeResult(
        metadata={
            "cameras": ", ".join(cameras) or "(none)",
            "playlists": MetadataValue.json(playlists),
            "per_camera": MetadataValue.json({c: camera_summary(r) for c, r in results.items()}),
            "segments": sum(len(r.segment_keys) for r in results.values()),
            "seconds": round(sum(r.seconds for r in results.values()), 3),
            "ffmpeg_seconds": round(sum(r.ffmpeg_seconds for r in results.values()), 3),
            "failed_videos": MetadataValue.json(failed),
            "transcoder": transcoder.mode,
            "hls_prefix": MetadataValue.url(bucket.uri(ref.hls_root)),
        }
    )


def playlist_problems(bucket: Bucket, ref: EpisodeRef, camera: str) -> list[str]:
    """Re-read a camera's playlist from S3 and check it against the segments S3 holds."""
    prefix = ref.hls_prefix(camera)
    key = prefix + PLAYLIST_NAME
    if bucket.head(key) is None:
        return [f"{key}: missing"]
    try:
        playlist = parse_playlist(bucket.get_bytes(key).decode("utf-8", "replace"), source=key)
    except PlaylistError as error:
        return [str(error)]
    names = {k[len(prefix) :] for k in bucket.list_keys(prefix)}
    return [f"{key}: {problem}" for problem in check_playlist(playlist, names)]


@episode_check(
    asset=hls_renditions,
    additional_ins={"extracted_files": AssetIn(key=extracted_files.key)},
    description="Every camera of the upload has a complete playlist in S3 (ENDLIST, target "
    "duration ≤ 4 s, every listed segment present). WARN: an episode is processed "
    "despite a video error, so a bad rendition flags the episode without blocking it.",
)
def hls_playlists_valid(
    context: AssetCheckExecutionContext, extracted_files: ExtractedFiles, s3: S3BucketResource
) -> AssetCheckResult:
    ref = parse_partition_key(context.partition_key)
    bucket = s3.get_client()
    cameras = list(videos_by_camera(extracted_files))
    problems = [p for camera in cameras for p in playlist_problems(bucket, ref, camera)]
    return AssetCheckResult(
        passed=not problems,
        severity=AssetCheckSeverity.WARN,
        metadata={"cameras_checked": len(cameras), "problems": MetadataValue.json(problems)},
    )
