"""`hls_renditions`: every camera's HLS, transcoded outside the run through Dagster Pipes.

Per camera under `processed/hls/<camera>/`: the compatibility rendition `playlist.m3u8`
(baseline, level 3.0, 4-second segments), an adaptive ladder beside it listed by `master.m3u8`,
and `poster.jpg` (docs/contract.md#hls-renditions). All cameras of the episode go to one
transcode process (one ECS task in production), encoded in parallel inside it.

A video error is logged and the episode can still be processed: a camera whose videos fail is
listed in `failed_videos` and the asset still materializes; the WARN checks below then flag the
episode, camera by camera. Several mp4s of one camera (a v2.1 archive holding several LeRobot
episodes, or a v3.0 camera split into files) are played back to back in path order
(`path_order`: file-2 before file-10) as one stream.

The checks read what S3 holds now (playlists, segments, decoded frames); the sources' facts
(size, rate, duration, frames) come from the probes the transcode recorded in the materialization
(`sources`), since probing them again would download every mp4 a second time.
"""

import base64
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetIn,
    MaterializeResult,
    MetadataValue,
)

from episode_pipeline.defs.assets.archive import bucket_links, extracted_files
from episode_pipeline.defs.metadata import table
from episode_pipeline.defs.partitions import SERVING, episode_asset, episode_check
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.defs.resources.transcoder import HlsTranscoder, TranscodeOutcome
from episode_pipeline.episodes.extracted_files import ExtractedFiles, ProcessedFile
from episode_pipeline.episodes.keys import EpisodeRef, parse_partition_key
from episode_pipeline.lerobot.cameras import DEFAULT_CAMERA
from episode_pipeline.lerobot.layout import path_order
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.storage.links import BucketLinks
from episode_pipeline.transcode.job import CameraJob, FailedVideo, TranscodeResult
from episode_pipeline.video.stored import (
    StoredCamera,
    decode_problems,
    drift_problems,
    playlist_problems,
)
from episode_pipeline.video.verify import SourceFacts


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


def episode_seconds(extracted: ExtractedFiles) -> float | None:
    """The episode's length by its info.json, to size the transcode's deadline (None: unknown)."""
    try:
        return extracted.dataset_info().duration_seconds
    except ValueError:
        return None


# -- what the UI shows --------------------------------------------------------------------------


CAMERA_COLUMNS = [
    ("camera", "string", "Camera (the LeRobot feature key)"),
    ("status", "string", "ok; ok with sources left out; or failed and why"),
    ("playlist", "string", "The baseline `playlist.m3u8` the application plays"),
    ("master", "string", "`master.m3u8`: the baseline and the ladder, for adaptive players"),
    ("renditions", "string", "What the master lists"),
    ("source_codec", "string", "Probed codec of the first source"),
    ("source_resolution", "string", "Probed size of the first source"),
    ("source_fps", "float", "Probed frame rate of the first source"),
    ("sources", "int", "mp4s transcoded (played back to back)"),
    ("source_frames", "int", "Frames in those mp4s (packets counted)"),
    ("source_seconds", "float", "Their probed length"),
    ("hls_seconds", "float", "The baseline playlist's length"),
    ("segments", "int", "Segments over all renditions"),
    ("ffmpeg_seconds", "float", "Wall time of the camera's one FFmpeg invocation"),
    ("poster", "string", "First frame as JPEG, beside the playlist"),
]
SOURCE_COLUMNS = [
    ("camera", "string", "Camera"),
    ("key", "string", "The mp4 in S3"),
    ("codec", "string", "Probed codec"),
    ("width", "int", "Probed width"),
    ("height", "int", "Probed height"),
    ("fps", "float", "Probed frame rate"),
    ("seconds", "float", "Probed length"),
    ("frames", "int", "Video packets in the file (one per frame)"),
    ("error", "string", "Why it was left out (cannot be downloaded, probed or decoded)"),
]
RENDITION_COLUMNS = [
    ("camera", "string", "Camera"),
    ("rendition", "string", "`baseline` (playlist.m3u8) or a ladder rung"),
    ("resolution", "string", "RESOLUTION in the master"),
    ("fps", "float", "FRAME-RATE in the master"),
    ("codecs", "string", "CODECS in the master, read from the stream"),
    ("bandwidth", "int", "BANDWIDTH: peak bit/s over the segments (RFC 8216)"),
    ("average_bandwidth", "int", "AVERAGE-BANDWIDTH in bit/s"),
    ("segments", "int", "Segments"),
    ("seconds", "float", "Length"),
    ("playlist", "string", "Its media playlist"),
]
CHECK_COLUMNS = [
    ("camera", "string", "Camera"),
    ("passed", "bool", "Whether this camera passed"),
    ("problems", "string", "What is wrong, naming the object"),
]


def camera_row(result: TranscodeResult) -> dict[str, Any]:
    first = result.sources[0].probe if result.sources else None
    if result.playlist_key is None:
        status = f"failed: {result.error or 'no rendition'}"
    else:
        status = f"ok, {len(result.failed)} source(s) left out" if result.failed else "ok"
    return {
        "camera": result.camera,
        "status": status,
        "playlist": result.playlist_key,
        "master": result.master_key,
        "renditions": ", ".join(f"{r.name} {r.resolution}" for r in result.renditions),
        "source_codec": first.codec if first else None,
        "source_resolution": first.resolution if first else None,
        "source_fps": first.fps if first else None,
        "sources": len(result.sources),
        "source_frames": result.source_frames,
        "source_seconds": result.source_duration_ms / 1000,
        "hls_seconds": result.seconds,
        "segments": result.segments,
        "ffmpeg_seconds": result.ffmpeg_seconds,
        "poster": result.poster_key,
    }


def source_rows(result: TranscodeResult) -> list[dict[str, Any]]:
    rows = []
    for source in result.sources:
        probe = source.probe
        rows.append(
            {
                "camera": result.camera,
                "key": source.key,
                "codec": probe.codec,
                "width": probe.width,
                "height": probe.height,
                "fps": probe.fps,
                "seconds": probe.duration_ms / 1000,
                "frames": probe.frames,
                "error": None,
            }
        )
    rows += [{"camera": result.camera, "key": f.key, "error": f.error} for f in result.failed]
    return rows


def rendition_rows(result: TranscodeResult) -> list[dict[str, Any]]:
    return [
        {
            "camera": result.camera,
            "rendition": r.name,
            "resolution": r.resolution,
            "fps": r.fps,
            "codecs": r.codecs,
            "bandwidth": r.bandwidth,
            "average_bandwidth": r.average_bandwidth,
            "segments": r.segments,
            "seconds": r.seconds,
            "playlist": r.playlist_key,
        }
        for r in result.renditions
    ]


def posters_markdown(bucket: Bucket, links: BucketLinks, results: list[TranscodeResult]) -> str:
    """Each camera's poster inline (a data URI: the UI shows it without S3 access), with links
    to the poster and the camera's master playlist."""
    parts = []
    for result in results:
        if not result.poster_key or not result.master_key:
            continue
        jpeg = base64.b64encode(bucket.get_bytes(result.poster_key)).decode("ascii")
        parts.append(
            f"**{result.camera}** ([poster]({links.object(result.poster_key)}), "
            f"[master.m3u8]({links.object(result.master_key)}))\n\n"
            f"![{result.camera}](data:image/jpeg;base64,{jpeg})"
        )
    return "\n\n".join(parts) or "(no poster: no camera was transcoded)"


def failed_videos(result: TranscodeResult, files: list[ProcessedFile]) -> list[FailedVideo]:
    """The camera's mp4s that made no video: those left out, and all the others when the
    camera as a whole failed."""
    left_out = {f.key for f in result.failed}
    if result.error is None:
        return result.failed
    return result.failed + [
        FailedVideo(f.key, result.error) for f in files if f.key not in left_out
    ]


@episode_asset(
    kinds={"ffmpeg", "s3"},
    tags=SERVING,
    # Bump when the same videos give other segments or playlists (video/, transcode/); the
    # encoder settings (preset, ladder) are appended by definitions.py.
    code_version="1",
    ins={"extracted_files": AssetIn(key=extracted_files.key)},
    description="The episode's video as HLS, per camera: the compatibility stream "
    "`processed/hls/<camera>/playlist.m3u8` (H.264 baseline, level 3.0, 4-second segments), an "
    "adaptive ladder beside it listed by `master.m3u8` (never above the source), and "
    "`poster.jpg`. All cameras go to one `python -m episode_pipeline.transcode` through Dagster "
    "Pipes (a subprocess locally, one ECS task in production). A video that cannot be "
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
    for camera in sorted(stale_cameras(bucket, ref, set(cameras))):
        removed = bucket.delete_prefix(ref.hls_prefix(camera))
        context.log.info(
            f"removed {removed} stale object(s) of camera {camera} (no longer uploaded)"
        )

    job = transcoder.job(
        bucket.name,
        [
            CameraJob(camera=c, sources=[f.key for f in files], output_prefix=ref.hls_prefix(c))
            for c, files in cameras.items()
        ],
    )
    started = time.monotonic()
    outcome = (
        transcoder.transcode(context, job, episode_seconds(extracted_files))
        if job.cameras
        else TranscodeOutcome()
    )
    transcode_seconds = time.monotonic() - started
    if outcome.error:
        context.log.error(f"transcode: {outcome.error}")
    results: list[TranscodeResult] = []
    for camera in cameras:
        result = outcome.results.get(camera)
        if result is None:  # the process died or was stopped before this camera was done
            bucket.delete_prefix(ref.hls_prefix(camera))
            error = f"transcode failed: {outcome.error or 'not reported'}"
            result = TranscodeResult(camera=camera, playlist_key=None, error=error)
        results.append(result)
    failed = []
    for result in results:
        for item in failed_videos(result, cameras[result.camera]):
            context.log.warning(f"camera {result.camera}: {item.error}")
            failed.append({"camera": result.camera, "key": item.key, "error": item.error})

    metadata: dict[str, Any] = {
        "cameras": ", ".join(cameras) or "(none)",
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
        "transcoder": transcoder.mode,
        "hls_prefix": MetadataValue.url(links.folder(ref.hls_root)),
    }
    if outcome.task_size is not None:
        metadata["transcode_task"] = (
            f"{outcome.task_size.vcpus} vCPU / {outcome.task_size.memory} MiB"
        )
    if outcome.error:
        metadata["transcode_error"] = outcome.error
    return MaterializeResult(metadata=metadata)


# -- checks: one row per camera, so the UI shows which camera failed ---------------------------


def recorded_sources(context: AssetCheckExecutionContext) -> dict[str, list[dict[str, Any]]]:
    """The `sources` table of the latest materialization, by camera ({} when none)."""
    from episode_pipeline.defs.checks import latest_materialization_metadata  # (import cycle)

    metadata = latest_materialization_metadata(
        context.instance, hls_renditions.key, context.partition_key
    )
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in getattr(metadata.get("sources"), "records", None) or []:
        rows[record.data["camera"]].append(dict(record.data))
    return rows


def usable_sources(rows: list[dict[str, Any]]) -> list[SourceFacts]:
    fields = ("key", "width", "height", "fps", "frames", "seconds")
    return [SourceFacts(**{f: row[f] for f in fields}) for row in rows if not row.get("error")]


@dataclass
class CheckedCameras:
    """What every HLS check starts from: the episode's cameras as S3 holds them now, and each
    camera's usable sources as the transcode probed them."""

    stored: dict[str, StoredCamera]
    sources: dict[str, list[SourceFacts]]
    recorded: dict[str, list[dict[str, Any]]]

    @classmethod
    def load(
        cls,
        context: AssetCheckExecutionContext,
        extracted: ExtractedFiles,
        s3: S3BucketResource,
    ) -> "CheckedCameras":
        ref = parse_partition_key(context.partition_key)
        bucket = s3.get_client()
        recorded = recorded_sources(context)
        cameras = list(videos_by_camera(extracted))
        return cls(
            stored={c: StoredCamera(bucket, ref.hls_prefix(c)) for c in cameras},
            sources={c: usable_sources(recorded.get(c, [])) for c in cameras},
            recorded=recorded,
        )

    def result(self, problems_of: Callable[[str], list[str]]) -> AssetCheckResult:
        """A WARN result with a camera | passed | problems table (an episode is processed despite
        a video error, so a bad stream flags the episode without blocking it)."""
        rows = []
        for camera in self.stored:
            problems = problems_of(camera)
            rows.append({"camera": camera, "passed": not problems, "problems": "; ".join(problems)})
        failing = [row["camera"] for row in rows if not row["passed"]]
        return AssetCheckResult(
            passed=not failing,
            severity=AssetCheckSeverity.WARN,
            description=f"failing camera(s): {', '.join(failing)}" if failing else None,
            metadata={
                "cameras_checked": len(rows),
                "failing_cameras": MetadataValue.json(failing),
                "per_camera": table(CHECK_COLUMNS, rows),
            },
        )


CHECK_INS = {"extracted_files": AssetIn(key=extracted_files.key)}


@episode_check(
    asset=hls_renditions,
    additional_ins=CHECK_INS,
    description="Every mp4 of every camera was probed and decodes (PyAV: codec, size, rate, "
    "duration, frames; a file cut short holds fewer frames than its index). Fails naming the "
    "file. WARN: a bad source is left out and the episode goes on.",
)
def hls_sources_readable(
    context: AssetCheckExecutionContext, extracted_files: ExtractedFiles, s3: S3BucketResource
) -> AssetCheckResult:
    checked = CheckedCameras.load(context, extracted_files, s3)
    files = videos_by_camera(extracted_files)

    def problems_of(camera: str) -> list[str]:
        rows = {row["key"]: row for row in checked.recorded.get(camera, [])}
        return [
            rows[f.key]["error"] if f.key in rows else f"{f.key}: not probed (see the asset)"
            for f in files[camera]
            if f.key not in rows or rows[f.key].get("error")
        ]

    return checked.result(problems_of)


@episode_check(
    asset=hls_renditions,
    additional_ins=CHECK_INS,
    description="Per camera in S3: `master.m3u8` and every playlist it lists parse; every "
    "variant states BANDWIDTH, RESOLUTION, CODECS and FRAME-RATE, none above the source's size or "
    "rate, the baseline `playlist.m3u8` among them; every listed segment exists, each but the "
    "last at most 4 s (+0.1 s), ENDLIST present. WARN.",
)
def hls_playlists_valid(
    context: AssetCheckExecutionContext, extracted_files: ExtractedFiles, s3: S3BucketResource
) -> AssetCheckResult:
    checked = CheckedCameras.load(context, extracted_files, s3)
    return checked.result(lambda c: playlist_problems(checked.stored[c], checked.sources[c]))


@episode_check(
    asset=hls_renditions,
    additional_ins=CHECK_INS,
    description="The drift canary: per camera, the baseline HLS lasts as long as its sources "
    "together (within 0.5 s). WARN.",
)
def hls_duration_matches_sources(
    context: AssetCheckExecutionContext, extracted_files: ExtractedFiles, s3: S3BucketResource
) -> AssetCheckResult:
    checked = CheckedCameras.load(context, extracted_files, s3)
    return checked.result(lambda c: drift_problems(checked.stored[c], checked.sources[c]))


@episode_check(
    asset=hls_renditions,
    additional_ins=CHECK_INS,
    description="Decoding proves playback: per camera the baseline HLS decodes end to end to "
    "the sources' frame count (± one frame per source), and the first segment of every "
    "rendition decodes at the size the master claims. WARN.",
)
def hls_decodes_to_source_frames(
    context: AssetCheckExecutionContext, extracted_files: ExtractedFiles, s3: S3BucketResource
) -> AssetCheckResult:
    checked = CheckedCameras.load(context, extracted_files, s3)
    cameras = {c: (stored, checked.sources[c]) for c, stored in checked.stored.items()}
    with tempfile.TemporaryDirectory(prefix="hls-decode-") as tmp:
        problems = decode_problems(cameras, Path(tmp))
    return checked.result(lambda c: problems[c])


HLS_CHECKS = [
    hls_sources_readable,
    hls_playlists_valid,
    hls_duration_matches_sources,
    hls_decodes_to_source_frames,
]
