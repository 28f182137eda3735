"""The transcode's job and result, as they cross the Pipes boundary (pure, JSON-able).

The asset sends a `TranscodeJob` as Pipes extras; the external process (a subprocess locally, an
ECS task in production) answers with one custom message holding a `TranscodeResult`. Both sides
import this module, so the field names are defined once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from episode_pipeline.settings import DEFAULT_PRESET
from episode_pipeline.video.hls import SEGMENT_SECONDS
from episode_pipeline.video.probe import VideoProbe

RESULT_MESSAGE_TYPE = "hls_rendition"


class JobError(ValueError):
    """The extras do not describe a transcode job; the message names the field."""


def _field(extras: Mapping[str, Any], name: str, kind: type) -> Any:
    value = extras.get(name)
    if not isinstance(value, kind) or (isinstance(value, str) and not value):
        raise JobError(
            f"transcode job (Pipes extras): field {name!r} must be a non-empty "
            f"{kind.__name__}, got {value!r}"
        )
    return value


@dataclass(frozen=True)
class TranscodeJob:
    """One camera of one episode: its mp4s in play order → one HLS rendition under a prefix."""

    bucket: str
    camera: str
    sources: list[str]  # S3 keys, concatenated in this order
    output_prefix: str  # ends with "/": orgs/<org>/episodes/<ep>/processed/hls/<camera>/
    segment_seconds: int = SEGMENT_SECONDS
    preset: str = DEFAULT_PRESET

    def to_extras(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_extras(cls, extras: Mapping[str, Any]) -> TranscodeJob:
        sources = _field(extras, "sources", list)
        if not sources or not all(isinstance(s, str) and s for s in sources):
            raise JobError(
                f"transcode job (Pipes extras): field 'sources' must list S3 keys, got {sources!r}"
            )
        prefix = _field(extras, "output_prefix", str)
        if not prefix.endswith("/") or not prefix.strip("/"):
            raise JobError(
                "transcode job (Pipes extras): field 'output_prefix' must be a non-root prefix "
                f"ending in '/', got {prefix!r}"
            )
        seconds = extras.get("segment_seconds", SEGMENT_SECONDS)
        if not isinstance(seconds, int) or seconds < 1:
            raise JobError(
                "transcode job (Pipes extras): field 'segment_seconds' must be a positive "
                f"integer, got {seconds!r}"
            )
        return cls(
            bucket=_field(extras, "bucket", str),
            camera=_field(extras, "camera", str),
            sources=list(sources),
            output_prefix=prefix,
            segment_seconds=seconds,
            preset=str(extras.get("preset") or DEFAULT_PRESET),
        )


@dataclass(frozen=True)
class SourceVideo:
    key: str
    probe: VideoProbe


@dataclass(frozen=True)
class FailedVideo:
    key: str
    error: str


@dataclass(frozen=True)
class TranscodeResult:
    """What one transcode made: the playlist (None when no source was usable) and what failed."""

    camera: str
    playlist_key: str | None
    segment_keys: list[str] = field(default_factory=list)
    seconds: float = 0.0  # the rendition's length, from the playlist
    output_resolution: str | None = None
    sources: list[SourceVideo] = field(default_factory=list)
    failed: list[FailedVideo] = field(default_factory=list)
    ffmpeg_seconds: float = 0.0  # wall time of FFmpeg alone

    @property
    def source_duration_ms(self) -> int:
        return sum(s.probe.duration_ms for s in self.sources)

    def to_message(self) -> dict[str, Any]:
        return {"type": RESULT_MESSAGE_TYPE, "result": asdict(self)}

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> TranscodeResult:
        data = dict(message["result"])
        return cls(
            camera=data["camera"],
            playlist_key=data.get("playlist_key"),
            segment_keys=list(data.get("segment_keys", [])),
            seconds=float(data.get("seconds", 0.0)),
            output_resolution=data.get("output_resolution"),
            sources=[
                SourceVideo(key=s["key"], probe=VideoProbe.from_dict(s["probe"]))
                for s in data.get("sources", [])
            ],
            failed=[FailedVideo(**f) for f in data.get("failed", [])],
            ffmpeg_seconds=float(data.get("ffmpeg_seconds", 0.0)),
        )


def find_result(messages: list[Any]) -> TranscodeResult | None:
    """The result among a session's custom messages (the last one wins)."""
    found = None
    for message in messages:
        if isinstance(message, Mapping) and message.get("type") == RESULT_MESSAGE_TYPE:
            found = TranscodeResult.from_message(message)
    return found
