"""Parse HLS playlists (with the `m3u8` package) and check them against the contract.

The checks run twice: in the transcode before a playlist is uploaded, and in the asset checks on
what S3 holds afterwards. Both call `check_playlist` with the segment names that exist, and
`check_master` on a camera's master playlist.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import m3u8

from episode_pipeline.video.hls import SEGMENT_SECONDS

# FFmpeg's EXTINF carries the real keyframe distance, e.g. 4.004 s at 29.97 fps.
DURATION_TOLERANCE = 0.1


class PlaylistError(ValueError):
    """The text is not an HLS media playlist."""


@dataclass(frozen=True)
class Segment:
    uri: str
    duration: float


@dataclass(frozen=True)
class Playlist:
    target_duration: int | None
    endlist: bool
    playlist_type: str | None
    segments: list[Segment] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(s.duration for s in self.segments)


def _load(text: str, source: str) -> m3u8.M3U8:
    if not text.lstrip().startswith("#EXTM3U"):
        raise PlaylistError(f"{source}: not an HLS playlist (no #EXTM3U header)")
    try:
        return m3u8.loads(text)
    except Exception as error:  # the parser raises bare ValueError/IndexError on bad tags
        raise PlaylistError(f"{source}: cannot parse ({error})") from error


def parse_playlist(text: str, source: str = "playlist.m3u8") -> Playlist:
    """A media playlist's target duration, ENDLIST, type and segments; master playlists fail."""
    parsed = _load(text, source)
    if parsed.is_variant:
        raise PlaylistError(f"{source}: a master playlist, expected a media playlist")
    return Playlist(
        target_duration=parsed.target_duration,
        endlist=bool(parsed.is_endlist),
        playlist_type=(parsed.playlist_type or None),
        segments=[Segment(uri=s.uri, duration=float(s.duration or 0)) for s in parsed.segments],
    )


def check_playlist(
    playlist: Playlist,
    existing: Collection[str],
    segment_seconds: int = SEGMENT_SECONDS,
    tolerance: float = DURATION_TOLERANCE,
) -> list[str]:
    """What is wrong with `playlist` (empty when nothing); `existing` are the segment names present.

    Target duration ≤ `segment_seconds` (FFmpeg writes it rounded to the nearest integer, as RFC
    8216 allows), ENDLIST present (a VOD rendition is complete), every segment a plain name beside
    the playlist that exists, with a positive duration, each but the last no longer than
    `segment_seconds` + `tolerance` (forced keyframes land on frame boundaries: 4.004 s at
    29.97 fps).
    """
    problems = []
    if playlist.target_duration is None:
        problems.append("no #EXT-X-TARGETDURATION")
    elif playlist.target_duration > segment_seconds:
        problems.append(f"target duration {playlist.target_duration} > {segment_seconds} s")
    if not playlist.endlist:
        problems.append("no #EXT-X-ENDLIST (playlist incomplete)")
    if playlist.playlist_type and playlist.playlist_type.upper() != "VOD":
        problems.append(f"playlist type {playlist.playlist_type}, expected VOD")
    if not playlist.segments:
        problems.append("no segments")
    present = set(existing)
    last = len(playlist.segments) - 1
    for index, segment in enumerate(playlist.segments):
        if "/" in segment.uri or segment.uri.startswith("."):
            problems.append(f"segment {segment.uri!r} is not a plain name beside the playlist")
        elif segment.uri not in present:
            problems.append(f"segment {segment.uri} is missing")
        if segment.duration <= 0:
            problems.append(f"segment {segment.uri} has duration {segment.duration}")
        if index < last and segment.duration > segment_seconds + tolerance:
            problems.append(
                f"segment {segment.uri} lasts {segment.duration:.3f} s > {segment_seconds} s"
            )
    return problems


@dataclass(frozen=True)
class Variant:
    """One `#EXT-X-STREAM-INF` of a master playlist."""

    uri: str
    bandwidth: int | None
    average_bandwidth: int | None
    resolution: tuple[int, int] | None
    codecs: str | None
    frame_rate: float | None


def parse_master(text: str, source: str = "master.m3u8") -> list[Variant]:
    """The variant streams a master playlist lists; a media playlist fails."""
    parsed = _load(text, source)
    if not parsed.is_variant:
        raise PlaylistError(f"{source}: a media playlist, expected a master playlist")
    variants = []
    for entry in parsed.playlists:
        info = entry.stream_info
        variants.append(
            Variant(
                uri=entry.uri,
                bandwidth=info.bandwidth,
                average_bandwidth=info.average_bandwidth,
                resolution=(
                    (int(info.resolution[0]), int(info.resolution[1])) if info.resolution else None
                ),
                codecs=info.codecs,
                frame_rate=info.frame_rate,
            )
        )
    return variants


def check_master(variants: list[Variant], baseline_uri: str) -> list[str]:
    """What is wrong with a master playlist's variants (empty when nothing).

    Every variant states BANDWIDTH, RESOLUTION, CODECS and FRAME-RATE, lives in the camera's
    folder (a relative path without `..`), no two share a playlist, and the compatibility
    rendition `baseline_uri` is among them.
    """
    problems = []
    if not variants:
        problems.append("no variant streams")
    uris = [v.uri for v in variants]
    if baseline_uri not in uris:
        problems.append(f"the baseline rendition {baseline_uri} is not listed")
    for uri in sorted({u for u in uris if uris.count(u) > 1}):
        problems.append(f"variant {uri} is listed more than once")
    for variant in variants:
        parts = variant.uri.split("/")
        if ":" in variant.uri or variant.uri.startswith("/") or ".." in parts:
            problems.append(f"variant {variant.uri!r} is not a path inside the camera's folder")
        missing = [
            name
            for name, value in (
                ("BANDWIDTH", variant.bandwidth),
                ("RESOLUTION", variant.resolution),
                ("CODECS", variant.codecs),
                ("FRAME-RATE", variant.frame_rate),
            )
            if not value
        ]
        if missing:
            problems.append(f"variant {variant.uri} lacks {', '.join(missing)}")
    return problems
