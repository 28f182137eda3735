"""The one FFmpeg command that turns one camera's video into all its HLS renditions (pure).

The contract (docs/contract.md#hls-renditions): the compatibility rendition is H.264 baseline
profile, level 3.0, 4-second segments, `playlist.m3u8`; the ladder's rungs (`video.ladder`)
come out of the same invocation: the source is decoded once and `split` feeds one scaler and
one x264 per rendition, plus the poster (the first frame as a small JPEG).

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
from typing import TYPE_CHECKING

from episode_pipeline.config.settings import VideoSettings

if TYPE_CHECKING:  # storyboard.py sizes its tiles with even_down, from here
    from episode_pipeline.video.storyboard import Storyboard

PLAYLIST_NAME = "playlist.m3u8"
VARIANT_PLAYLIST_NAME = "index.m3u8"  # not playlist.m3u8: that name means "a camera's stream"
SEGMENT_PATTERN = "segment_%05d.ts"
SEGMENT_SUFFIX = ".ts"
SEGMENT_SECONDS = 4
POSTER_NAME = "poster.jpg"
POSTER_MAX_WIDTH = 320
POSTER_QSCALE = 4
BASELINE = "baseline"

# H.264 level 3.0 (Table A-1): MaxFS and MaxMBPS in 16x16 macroblocks; MaxBR 10,000 kbit/s.
LEVEL_30_MAX_FRAME_MBS = 1620
LEVEL_30_MAX_MBS_PER_SECOND = 40500
MAX_FPS = 30.0


@dataclass(frozen=True)
class EncodeSettings:
    """Encoder choices; the defaults are the production ones (docs/platform-notes.md#ffmpeg)."""

    segment_seconds: int = SEGMENT_SECONDS
    preset: str = VideoSettings.preset  # TRANSCODE_PRESET's default
    crf: int = 23
    maxrate_kbit: int = 4000  # well under level 3.0's 10,000 kbit/s
    bufsize_kbit: int = 8000
    audio_kbit: int = 128


DEFAULT_ENCODE = EncodeSettings()


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


def even_down(value: float) -> int:
    """The even number at or below `value` (at least 2): yuv420p needs even sizes."""
    return max(2, int(value) // 2 * 2)


def fit_level_30(width: int, height: int, fps: float) -> OutputFormat:
    """The largest even size (same aspect) and rate ≤ the source's that level 3.0 allows."""
    if width <= 0 or height <= 0:
        raise ValueError(f"video size must be positive, got {width}x{height}")
    out_fps = fps if fps > 0 else MAX_FPS
    while out_fps > MAX_FPS:  # 60 → 30, 50 → 25: an exact decimation keeps motion even
        out_fps /= 2
    budget = min(LEVEL_30_MAX_FRAME_MBS, LEVEL_30_MAX_MBS_PER_SECOND / out_fps)
    out_w, out_h = even_down(width), even_down(height)
    scale = 1.0
    while _macroblocks(out_w, out_h) > budget:
        scale *= 0.98
        out_w, out_h = even_down(width * scale), even_down(height * scale)
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


@dataclass(frozen=True)
class Rendition:
    """One encode of a camera: where it goes and how x264 is told to make it."""

    name: str  # "baseline", "720p", ...
    width: int
    height: int
    fps: float
    profile: str  # x264 profile: "baseline" | "high"
    level: str | None  # "3.0" for the baseline; None: x264 picks the lowest that fits
    preset: str
    crf: int
    maxrate_kbit: int
    bufsize_kbit: int

    @property
    def is_baseline(self) -> bool:
        return self.name == BASELINE

    @property
    def folder(self) -> str:
        """Below the camera's prefix: "" for the baseline (the contract's place), else `720p/`."""
        return "" if self.is_baseline else f"{self.name}/"

    @property
    def playlist(self) -> str:
        """The media playlist's path below the camera's prefix."""
        return PLAYLIST_NAME if self.is_baseline else f"{self.folder}{VARIANT_PLAYLIST_NAME}"

    @property
    def resolution(self) -> str:
        return f"{self.width}x{self.height}"


def poster_size(width: int, height: int) -> tuple[int, int]:
    """The poster's size: the source's aspect, at most `POSTER_MAX_WIDTH` wide, never larger."""
    poster_width = even_down(min(width, POSTER_MAX_WIDTH))
    return poster_width, even_down(height * poster_width / width)


def _scale(width: int, height: int) -> str:
    return f"scale={width}:{height}:flags=bicubic"


def _encode_args(
    rendition: Rendition, segment_seconds: int, audio: list[str], output_dir: Path
) -> list[str]:
    gop = max(1, round(rendition.fps * segment_seconds))
    level = ["-level:v", rendition.level] if rendition.level else []
    folder = output_dir / rendition.folder
    return [
        *audio, "-sn", "-dn",
        "-c:v", "libx264", "-preset", rendition.preset, "-crf", str(rendition.crf),
        "-profile:v", rendition.profile, *level, "-pix_fmt", "yuv420p",
        "-maxrate", f"{rendition.maxrate_kbit}k", "-bufsize", f"{rendition.bufsize_kbit}k",
        "-g", str(gop), "-keyint_min", str(gop), "-sc_threshold", "0",
        "-force_key_frames", f"expr:gte(t,n_forced*{segment_seconds})",
        "-f", "hls", "-hls_time", str(segment_seconds), "-hls_playlist_type", "vod",
        "-hls_list_size", "0",
        # A segment appears under its name only once complete: the uploader may take it then.
        "-hls_flags", "temp_file",
        "-hls_segment_filename", str(folder / SEGMENT_PATTERN),
        str(output_dir / rendition.playlist),
    ]  # fmt: skip


def hls_command(
    ffmpeg: str,
    source: str | Path,
    output_dir: str | Path,
    renditions: Sequence[Rendition],
    *,
    source_width: int,
    source_height: int,
    source_fps: float,
    has_audio: bool = False,
    concat: bool = False,
    poster: bool = False,
    storyboard: Storyboard | None = None,
    settings: EncodeSettings = EncodeSettings(),
) -> list[str]:
    """FFmpeg arguments writing every rendition (and `poster.jpg`, `storyboard.jpg`) under
    `output_dir`.

    `source` is a video file, or an ffconcat list when `concat` is true (several mp4s of one
    camera played back to back); `source_*` are the probed first source's. Each rendition's
    folder must exist. One rendition without a poster is today's single baseline encode. The
    storyboard is one more branch of the same decode (`video/storyboard.py`): no second pass.
    """
    if not renditions:
        raise ValueError("an HLS command needs at least one rendition")
    output_dir = Path(output_dir)
    chains = []
    for rendition in renditions:
        chain = [_scale(rendition.width, rendition.height)]
        if rendition.fps != source_fps:
            chain.append(f"fps={rendition.fps:g}")
        chains.append(",".join([*chain, "setsar=1", "format=yuv420p"]))
    images: list[tuple[str, Path, int]] = []  # one-frame JPEGs after the renditions: quality
    if poster:
        # trim ends the branch after one frame, so it is not scaled for every frame that follows
        poster_scale = _scale(*poster_size(source_width, source_height))
        poster_chain = f"trim=end_frame=1,{poster_scale},setsar=1,format=yuvj420p"
        images.append((poster_chain, output_dir / POSTER_NAME, POSTER_QSCALE))
    if storyboard is not None:
        images.append((storyboard.filter_chain(), output_dir / storyboard.image, storyboard.qscale))
    chains += [chain for chain, _, _ in images]
    labels = [f"v{index}" for index in range(len(chains))]
    if len(chains) == 1:
        graph = f"[0:v:0]{chains[0]}[{labels[0]}]"
    else:
        splits = "".join(f"[s{index}]" for index in range(len(chains)))
        graph = ";".join(
            [f"[0:v:0]split={len(chains)}{splits}"]
            + [f"[s{index}]{chain}[{labels[index]}]" for index, chain in enumerate(chains)]
        )
    input_args = (
        ["-f", "concat", "-safe", "0", "-i", str(source)] if concat else ["-i", str(source)]
    )
    audio = (
        ["-map", "0:a:0", "-c:a", "aac", "-b:a", f"{settings.audio_kbit}k", "-ac", "2"]
        if has_audio
        else ["-an"]
    )
    command = [
        ffmpeg, "-hide_banner", "-nostdin", "-loglevel", "error", "-y",
        *input_args, "-filter_complex", graph,
    ]  # fmt: skip
    for rendition, label in zip(renditions, labels[: len(renditions)], strict=True):
        command += ["-map", f"[{label}]"]
        command += _encode_args(rendition, settings.segment_seconds, audio, output_dir)
    for label, (_, path, quality) in zip(labels[len(renditions) :], images, strict=True):
        command += ["-map", f"[{label}]", "-an", "-frames:v", "1", "-q:v", str(quality),
                    "-update", "1", str(path)]  # fmt: skip
    return command
