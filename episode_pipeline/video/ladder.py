"""One camera's renditions: the compatibility baseline and an adaptive ladder beside it (pure).

`processed/hls/<camera>/playlist.m3u8` stays the application's stream: H.264 baseline, level
3.0, fitted by `hls.fit_level_30`. Beside it, `master.m3u8` lists that baseline and the ladder's
rungs, each in its own folder (`720p/index.m3u8`), H.264 high profile, never above the source's
size or rate (docs/contract.md#hls-renditions):

- the ladder is a list of heights and `source` (the source's own height); rungs taller than the
  source are dropped, and a rung the baseline already is (same size and rate) is left to it, so
  a 640x480 camera gets the baseline and 240p, not a second 480p encode;
- a rung keeps the source's aspect ratio (even sizes, rounded down) and its frame rate;
- its bit rate is capped in proportion to its pixel rate (`RUNG_BITS_PER_PIXEL`).

The master's attributes come from what was written, not from what was asked: `BANDWIDTH` is
the peak bit rate over the segments as RFC 8216 4.3.4.2 defines it, `CODECS` is read from the
stream's sequence parameter set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import m3u8
from m3u8.model import Playlist as VariantEntry

from episode_pipeline.config.settings import SOURCE_RUNG
from episode_pipeline.video.hls import (
    BASELINE,
    DEFAULT_ENCODE,
    EncodeSettings,
    Rendition,
    even_down,
    fit_level_30,
)

MASTER_NAME = "master.m3u8"
HIGH = "high"
AAC_LC = "mp4a.40.2"
RUNG_BITS_PER_PIXEL = 0.15  # maxrate = width x height x fps x this (1080p30 ≈ 9.3 Mbit/s)
MIN_RUNG_KBIT = 400


def baseline_rendition(width: int, height: int, fps: float, settings: EncodeSettings) -> Rendition:
    """Today's compatibility rendition: baseline profile, level 3.0, fitted to that level."""
    out = fit_level_30(width, height, fps)
    return Rendition(
        name=BASELINE,
        width=out.width,
        height=out.height,
        fps=out.fps,
        profile="baseline",
        level="3.0",
        preset=settings.preset,
        crf=settings.crf,
        maxrate_kbit=settings.maxrate_kbit,
        bufsize_kbit=settings.bufsize_kbit,
    )


def plan_renditions(
    width: int,
    height: int,
    fps: float,
    ladder: Sequence[str],
    *,
    baseline: EncodeSettings = DEFAULT_ENCODE,
    ladder_preset: str | None = None,
) -> list[Rendition]:
    """The baseline first, then the ladder's rungs that fit the source, tallest first."""
    if width <= 0 or height <= 0:
        raise ValueError(f"video size must be positive, got {width}x{height}")
    base = baseline_rendition(width, height, fps, baseline)
    rate = fps if fps > 0 else base.fps
    wanted = {height if rung == SOURCE_RUNG else int(rung) for rung in ladder}
    heights = sorted({even_down(h) for h in wanted if h <= height}, reverse=True)
    renditions = [base]
    for rung_height in heights:
        rung_width = even_down(width * rung_height / height)
        if (rung_width, rung_height) == (base.width, base.height) and rate == base.fps:
            continue  # the baseline is this rung already
        pixel_rate = rung_width * rung_height * rate
        maxrate = max(MIN_RUNG_KBIT, round(pixel_rate * RUNG_BITS_PER_PIXEL / 1000))
        renditions.append(
            Rendition(
                name=f"{rung_height}p",
                width=rung_width,
                height=rung_height,
                fps=rate,
                profile=HIGH,
                level=None,
                preset=ladder_preset or baseline.preset,
                crf=baseline.crf,
                maxrate_kbit=maxrate,
                bufsize_kbit=2 * maxrate,
            )
        )
    return renditions


# -- what the master says about each rendition --------------------------------------------------


def peak_bandwidth(segments: Sequence[tuple[int, float]], target_seconds: float) -> int:
    """BANDWIDTH (bit/s) from (bytes, seconds) per segment, per RFC 8216 section 4.3.4.2.

    The largest bit rate of any run of consecutive segments lasting 0.5 to 1.5 times the target
    duration, so a short last segment alone does not count. A stream shorter than half a target
    duration has no such run: its average is used.
    """
    best = 0.0
    for start in range(len(segments)):
        size = seconds = 0.0
        for index in range(start, len(segments)):
            size += segments[index][0]
            seconds += segments[index][1]
            if seconds > 1.5 * target_seconds:
                break
            if seconds >= 0.5 * target_seconds:
                best = max(best, size * 8 / seconds)
    return round(best) if best else average_bandwidth(segments)


def average_bandwidth(segments: Sequence[tuple[int, float]]) -> int:
    """AVERAGE-BANDWIDTH (bit/s): all the bytes over all the seconds."""
    seconds = sum(s for _, s in segments)
    return round(sum(b for b, _ in segments) * 8 / seconds) if seconds > 0 else 0


def avc1_codec(annex_b: bytes) -> str:
    """The RFC 6381 `avc1.PPCCLL` of the first sequence parameter set in H.264 Annex B bytes.

    An MPEG-TS segment carries the stream in Annex B form and x264 puts the SPS at the start of
    every keyframe, so the first kilobytes of a segment hold it (profile, constraints, level).
    """
    start = 0
    while (start := annex_b.find(b"\x00\x00\x01", start)) != -1:
        header = annex_b[start + 3 : start + 7]
        if len(header) == 4 and header[0] & 0x1F == 7 and not header[0] & 0x80:
            return "avc1." + header[1:4].hex().upper()
        start += 3
    raise ValueError("no H.264 sequence parameter set found")


@dataclass(frozen=True)
class VariantStream:
    """One line pair of the master playlist."""

    uri: str
    bandwidth: int
    average_bandwidth: int
    width: int
    height: int
    fps: float
    codecs: str


def master_playlist(variants: Sequence[VariantStream]) -> str:
    """The master playlist text (written by the `m3u8` package), variants in the given order."""
    master = m3u8.M3U8()
    master.version = 3
    for variant in variants:
        master.add_playlist(
            VariantEntry(
                variant.uri,
                stream_info={
                    "bandwidth": variant.bandwidth,
                    "average_bandwidth": variant.average_bandwidth,
                    "resolution": f"{variant.width}x{variant.height}",
                    "frame_rate": round(variant.fps, 3),
                    "codecs": variant.codecs,
                },
                media=[],
                base_uri="",
            )
        )
    return master.dumps()
