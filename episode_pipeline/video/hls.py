"""The FFmpeg command that turns one camera's video into an HLS rendition (pure).

The contract (docs/contract.md#hls-renditions): H.264 baseline profile, level 3.0, 4-second
segments, `playlist.m3u8`.
Level 3.0 is a real limit, not a label: at most 1,620 macroblocks per frame and 40,500 per
second (H.264 Table A-1). A frame that exceeds it is scaled down (aspect ratio kept) and a rate
above 30 fps is halved until it fits, so the stream a player gets is what the playlist claims.
x264 cuts a GOP every 250 frames unless told otherwise, so keyframes are forced every segment
length and scene-cut keyframes are off (docs/platform-notes.md#ffmpeg): every segment then
starts on a keyframe and lasts exactly `segment_seconds`, except the last.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PLAYLIST_NAME = "playlist.m3u8"
SEGMENT_PATTERN = "segment_%05d.ts"
SEGMENT_SECONDS = 4

# H.264 level 3.0 (Table A-1): MaxFS and MaxMBPS in 16x16 macroblocks; MaxBR 10,000 kbit/s.
LEVEL_30_MAX_FRAME_MBS = 1620
LEVEL_30_MAX_MBS_PER_SECOND = 40500
MAX_FPS = 30.0


@dataclass(frozen=True)
class EncodeSettings:
    """Encoder choices; the defaults are the production ones (docs/platform-notes.md#ffmpeg)."""

    segment_seconds: int = SEGMENT_SECONDS
    preset: str = "veryfast"
    crf: int = 23
    maxrate_kbit: int = 4000  # well under level 3.0's 10,000 kbit/s
    bufsize_kbit: int = 8000
    audio_kbit: int = 128


@dataclass(frozen=True)
class OutputFormat:
    width: int
    height: int
    fps: float  # the output rate; equal to the source's unless it had to be reduced

    @property
    def resolution(self) -> str:
        return f"{self.width}x{self.height}"


def _macroblocks(width: int, height: int) -> int:
    return math.ceil(width / 16) * math.ceil(height / 16)


def _even_down(value: float) -> int:
    return max(2, int(value) // 2 * 2)


def fit_level_30(width: int, height: int, fps: float) -> OutputFormat:
    """The largest even size (same aspect) and rate ≤ the source's that level 3.0 allows."""
    if width <= 0 or height <= 0:
        raise ValueError(f"video size must be positive, got {width}x{height}")
    out_fps = fps if fps > 0 else MAX_FPS
    while out_fps > MAX_FPS:  # 60 → 30, 50 → 25: an exact decimation keeps motion even
        out_fps /= 2
    budget = min(LEVEL_30_MAX_FRAME_MBS, LEVEL_30_MAX_MBS_PER_SECOND / out_fps)
    out_w, out_h = _even_down(width), _even_down(height)
    scale = 1.0
    while _macroblocks(out_w, out_h) > budget:
        scale *= 0.98
        out_w, out_h = _even_down(width * scale), _even_down(height * scale)
    return OutputFormat(width=out_w, height=out_h, fps=out_fps)


def concat_list(names: Sequence[str]) -> str:
    """An ffconcat file for the concat demuxer: plain file names in play order.

    Names are relative to the list's folder (the demuxer's safe mode accepts them); quotes are
    escaped the way the demuxer reads them.
    """
    if not names:
        raise ValueError("concat list needs at least one file")
    lines = ["ffconcat version 1.0"]
    for name in names:
        if "/" in name or name in {"", ".", ".."}:
            raise ValueError(f"concat list entry {name!r} must be a plain file name")
        lines.append("file '" + name.replace("'", "'\\''") + "'")
    return "\n".join(lines) + "\n"


def ffmpeg_command(
    ffmpeg: str,
    source: str | Path,
    output_dir: str | Path,
    *,
    width: int,
    height: int,
    fps: float,
    has_audio: bool = False,
    concat: bool = False,
    settings: EncodeSettings = EncodeSettings(),
) -> list[str]:
    """FFmpeg arguments writing `output_dir/playlist.m3u8` and `segment_NNNNN.ts` from `source`.

    `source` is a video file, or an ffconcat list when `concat` is true (several mp4s of one
    camera played back to back). `width`/`height`/`fps` are the probed source's.
    """
    out = fit_level_30(width, height, fps)
    seconds = settings.segment_seconds
    gop = max(1, round(out.fps * seconds))
    filters = [f"scale={out.width}:{out.height}:flags=bicubic"]
    if out.fps != fps:
        filters.append(f"fps={out.fps:g}")
    filters += ["setsar=1", "format=yuv420p"]
    output_dir = Path(output_dir)
    input_args = (
        ["-f", "concat", "-safe", "0", "-i", str(source)] if concat else ["-i", str(source)]
    )
    audio = (
        ["-map", "0:a:0", "-c:a", "aac", "-b:a", f"{settings.audio_kbit}k", "-ac", "2"]
        if has_audio
        else ["-an"]
    )
    return [
        ffmpeg, "-hide_banner", "-nostdin", "-loglevel", "error", "-y",
        *input_args,
        "-map", "0:v:0", *audio, "-sn", "-dn",
        "-vf", ",".join(filters),
        "-c:v", "libx264", "-preset", settings.preset, "-crf", str(settings.crf),
        "-profile:v", "baseline", "-level:v", "3.0", "-pix_fmt", "yuv420p",
        "-maxrate", f"{settings.maxrate_kbit}k", "-bufsize", f"{settings.bufsize_kbit}k",
        "-g", str(gop), "-keyint_min", str(gop), "-sc_threshold", "0",
        "-force_key_frames", f"expr:gte(t,n_forced*{seconds})",
        "-f", "hls", "-hls_time", str(seconds), "-hls_playlist_type", "vod",
        "-hls_list_size", "0",
        "-hls_segment_filename", str(output_dir / SEGMENT_PATTERN),
        str(output_dir / PLAYLIST_NAME),
    ]  # fmt: skip
