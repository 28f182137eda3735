"""What a video file really holds, read with PyAV (the bundled FFmpeg has no ffprobe).

LeRobot's info.json labels the codec but nobody checks the label
(docs/lerobot-archives.md#videos): the transcode decides from the probed stream, and a file
PyAV cannot open is reported by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any


class ProbeError(ValueError):
    """The file is not a readable video (corrupt, truncated, or without a video stream)."""


@dataclass(frozen=True)
class VideoProbe:
    """The facts the transcode needs: the first video stream's codec, size, rate and length."""

    codec: str  # canonical codec name: "av1", "h264", "hevc", ...
    width: int
    height: int
    duration_ms: int
    frames: int
    fps: float
    has_audio: bool = False

    @property
    def resolution(self) -> str:
        return f"{self.width}x{self.height}"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VideoProbe:
        return cls(**data)


def _duration_ms(container: Any, stream: Any) -> int:
    if stream.duration is not None and stream.time_base is not None:
        return round(float(stream.duration * stream.time_base) * 1000)
    if container.duration is not None:  # microseconds (AV_TIME_BASE)
        return round(container.duration / 1000)
    return 0


def probe(path: str | Path) -> VideoProbe:
    """Probe `path` without decoding it; raises ProbeError naming the file on anything wrong."""
    import av  # PyAV loads FFmpeg's libraries: keep it out of module import time

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise ProbeError(f"{path}: no video stream")
            stream = container.streams.video[0]
            context = stream.codec_context
            rate = stream.average_rate or stream.guessed_rate or Fraction(0)
            fps = float(rate)
            duration_ms = _duration_ms(container, stream)
            frames = int(stream.frames or 0) or round(duration_ms * fps / 1000)
            width, height = int(context.width or 0), int(context.height or 0)
            if width <= 0 or height <= 0:
                raise ProbeError(f"{path}: video stream has no size ({width}x{height})")
            return VideoProbe(
                codec=context.codec.canonical_name,
                width=width,
                height=height,
                duration_ms=duration_ms,
                frames=frames,
                fps=fps,
                has_audio=bool(container.streams.audio),
            )
    except ProbeError:
        raise
    except (av.error.FFmpegError, OSError, ValueError) as error:
        reason = getattr(error, "strerror", None) or str(error)  # without the path again
        raise ProbeError(f"{path}: not a readable video ({reason})") from error
