"""What the HLS checks conclude about one camera from facts gathered elsewhere (pure).

The asset checks read the playlists and segments from S3, decode the baseline, and take the
sources' probed facts from the transcode's record; these functions turn those facts into the
problems a check reports (docs/contract.md#hls-renditions).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from episode_pipeline.video.playlist import Variant

DRIFT_TOLERANCE_SECONDS = 0.5  # HLS total vs the sources' total: the drift canary
FPS_TOLERANCE = 0.01


@dataclass(frozen=True)
class SourceFacts:
    """One usable source as its probe saw it."""

    key: str
    width: int
    height: int
    fps: float
    frames: int
    seconds: float


def duration_problem(hls_seconds: float, sources: Sequence[SourceFacts]) -> str | None:
    """The HLS total must be within `DRIFT_TOLERANCE_SECONDS` of the sources' total."""
    source_seconds = sum(s.seconds for s in sources)
    drift = hls_seconds - source_seconds
    if abs(drift) <= DRIFT_TOLERANCE_SECONDS:
        return None
    return (
        f"HLS lasts {hls_seconds:.3f} s, the sources {source_seconds:.3f} s "
        f"(drift {drift:+.3f} s > ±{DRIFT_TOLERANCE_SECONDS} s)"
    )


def expected_frames(sources: Sequence[SourceFacts], output_fps: float) -> int:
    """Frames a rendition at `output_fps` holds: each source's, scaled when the rate was reduced
    (a 60 fps source in the 30 fps baseline keeps every other frame)."""
    return sum(
        round(s.frames * output_fps / s.fps) if s.fps > 0 and output_fps > 0 else s.frames
        for s in sources
    )


def frame_count_problem(
    decoded: int, sources: Sequence[SourceFacts], output_fps: float
) -> str | None:
    """Decoding the rendition end to end must give the sources' frames, ± one per source."""
    expected = expected_frames(sources, output_fps)
    if abs(decoded - expected) <= len(sources):
        return None
    return (
        f"decoding gives {decoded} frames, the sources hold {expected} "
        f"(± {len(sources)} allowed, one per source)"
    )


def upscale_problems(variants: Sequence[Variant], source: SourceFacts) -> list[str]:
    """No variant may claim more pixels in either direction, or a higher rate, than the source."""
    problems = []
    for variant in variants:
        if variant.resolution:
            width, height = variant.resolution
            if width > source.width or height > source.height:
                problems.append(
                    f"{variant.uri}: {width}x{height} exceeds the source's "
                    f"{source.width}x{source.height}"
                )
        if variant.frame_rate and source.fps and variant.frame_rate > source.fps + FPS_TOLERANCE:
            problems.append(
                f"{variant.uri}: {variant.frame_rate:g} fps exceeds the source's {source.fps:g}"
            )
    return problems


def size_problem(claimed: tuple[int, int] | None, actual: tuple[int, int]) -> str | None:
    """A variant's decoded size must be the RESOLUTION the master claims for it."""
    if claimed is None or tuple(claimed) == tuple(actual):
        return None
    return f"decodes at {actual[0]}x{actual[1]}, the master says {claimed[0]}x{claimed[1]}"
