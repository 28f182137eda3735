"""What the `hls_renditions` materialization shows in the UI: per-camera, per-source and
per-rendition tables, and the posters' thumbnails inline."""

import base64
from typing import Any

from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.storage.links import BucketLinks
from episode_pipeline.transcode.job import TranscodeResult
from episode_pipeline.video.thumbnail import thumbnail_jpeg

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
    ("storyboard", "string", "Sprite of a tile every `storyboard_interval` s, and its WebVTT map"),
    ("storyboard_interval", "int", "Seconds between storyboard tiles"),
    ("storyboard_tiles", "int", "Tiles in the sprite"),
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
    ("start_seconds", "float", "When its first frame is shown (its own timeline)"),
    ("last_frame_seconds", "float", "When its last frame is shown"),
    ("stream_start_seconds", "float", "Where it starts in the camera's HLS stream"),
    ("stream_end_seconds", "float", "Where it ends in the camera's HLS stream"),
    ("error", "string", "Why it was left out (cannot be downloaded, probed or decoded)"),
]
# Dagster's UI shows a Markdown entry inline below this length, else behind a click.
INLINE_MARKDOWN_CHARACTERS = 1000
STORYBOARD_METADATA_PREFIX = "storyboard: "  # one entry per camera: `storyboard: <camera>`
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
        "storyboard": result.storyboard.image_key if result.storyboard else None,
        "storyboard_interval": result.storyboard.interval if result.storyboard else None,
        "storyboard_tiles": result.storyboard.tiles if result.storyboard else None,
    }


def source_rows(result: TranscodeResult) -> list[dict[str, Any]]:
    rows = []
    for source, (start, end) in zip(result.sources, result.source_ranges(), strict=True):
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
                "start_seconds": probe.start_seconds,
                "last_frame_seconds": probe.last_frame_seconds,
                "stream_start_seconds": start,
                "stream_end_seconds": end,
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
    """Each camera's poster inline as a thumbnail (a data URI: the UI shows it without S3
    access), with links to the poster and the camera's master playlist."""
    parts = []
    for result in results:
        if not result.poster_key or not result.master_key:
            continue
        thumbnail = thumbnail_jpeg(bucket.get_bytes(result.poster_key))
        jpeg = base64.b64encode(thumbnail).decode("ascii")
        parts.append(
            f"**{result.camera}** ([poster]({links.object(result.poster_key)}), "
            f"[master.m3u8]({links.object(result.master_key)}))\n\n"
            f"![{result.camera}](data:image/jpeg;base64,{jpeg})"
        )
    return "\n\n".join(parts) or "(no poster: no camera was transcoded)"


def storyboard_markdown(result: TranscodeResult, links: BucketLinks) -> str | None:
    """One camera's storyboard as the partitions view shows it without a click.

    Dagster's asset event table renders a Markdown entry inline only when it is shorter than
    `INLINE_MARKDOWN_CHARACTERS` (`MetadataEntry.tsx`: `expandSmallValues && mdStr.length <
    1000`; longer ones, like the base64 posters, sit behind *Show Markdown*). So the sprite is an
    image by address, not inlined: locally the presigned object link (moto; 7 days), which the
    browser loads. On AWS no address loads without the operator's credentials (the bucket stays
    private, a presigned link dies with the task's credentials), so the entry is the links to
    the sprite and its VTT in the S3 console, inline still. None: no storyboard."""
    board = result.storyboard
    if board is None:
        return None
    image, vtt = links.object(board.image_key), links.object(board.vtt_key)
    caption = f"{board.tiles} tiles, one every {board.interval} s ([vtt]({vtt}))"
    if links.endpoint_url:
        text = f"![{result.camera} storyboard]({image})\n\n{caption}"
        if len(text) < INLINE_MARKDOWN_CHARACTERS:
            return text
    return f"[storyboard.jpg]({image}): {caption}"
