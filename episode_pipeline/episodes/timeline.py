"""An episode's timeline: what a viewer needs to play every camera on one clock with the data
under it (pure; `processed/timeline.json`, docs/contract.md#timeline).

Per LeRobot episode of the upload: its frames' timestamps, each camera's time range in its HLS
stream (and the offset that turns a row's timestamp into the stream's time), the state and
action series, and the sync findings with their time ranges. The clock of an episode is its
rows' `timestamp` (seconds): a camera shows, at clock `t`, its stream at `offset + t`, and
has frames only within `[start, end)` of its stream.

Series keep every frame up to `MAX_POINTS` per episode (measured: docs/contract.md#timeline);
a longer episode is cut into `MAX_POINTS / 2` buckets of consecutive frames and each bucket
becomes two points, at its first and last frame's time, carrying each joint's minimum and
maximum in the order they occur (min/max decimation, the first half of M4): every peak's value
survives, its time is off by less than one bucket.

Where a camera's frames sit comes from the sync rule's placement (`lerobot/sync.py`): v2.x one
mp4 per episode, v3.0 a range of a concatenated mp4. Where an mp4 sits in the camera's stream
comes from the transcode (`TranscodeResult.source_ranges`: sources back to back, each its
probed length; a file's own start time is dropped by FFmpeg, so its frame `k` plays at
`stream_start + k / fps`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from episode_pipeline.lerobot.frames import EPISODE_INDEX, TIMESTAMP, FrameDataError
from episode_pipeline.lerobot.sync import LocatedFinding, Placement

FORMAT = "episode_pipeline/timeline"
VERSION = 1
TIMELINE_NAME = "timeline.json"  # below the episode's processed/ prefix
MAX_POINTS = 3600  # per series and episode: 2 minutes at 30 fps keep every frame
EVERY_FRAME = "every_frame"
MINMAX = "minmax"
TIME_DECIMALS = 6


# -- the series, gathered from the data files' batches -------------------------------------


def _rows(values: Sequence[Any]) -> list[list[float]]:
    """A column of vectors (lists, scalars or nulls) as rows of floats (NaN where missing)."""
    rows = []
    for value in values:
        if value is None:
            rows.append([])
        elif isinstance(value, list | tuple):
            rows.append([math.nan if v is None else float(v) for v in value])
        else:
            rows.append([float(value)])
    return rows


def _frame(rows: list[list[float]]) -> pl.DataFrame:
    """Rows of possibly different lengths as one column per dimension (`d0`, `d1`, ...), a
    missing or non-finite value null."""
    width = max((len(row) for row in rows), default=0)
    columns = {
        f"d{d}": [row[d] if d < len(row) and math.isfinite(row[d]) else None for row in rows]
        for d in range(width)
    }
    return pl.DataFrame(columns, schema={name: pl.Float64 for name in columns})


@dataclass
class EpisodeSeries:
    """One LeRobot episode's rows: timestamps (seconds) and state/action vectors per frame."""

    index: int
    timestamps: list[float] = field(default_factory=list)
    state: list[list[float]] = field(default_factory=list)
    action: list[list[float]] = field(default_factory=list)


class SeriesCollector:
    """Per LeRobot episode, the rows of every data file, fed batch by batch in path order
    (an episode may continue from one batch or file to the next). Rows without an
    `episode_index` column count as episode 0, as in the sync check."""

    def __init__(self) -> None:
        self.episodes: dict[int, EpisodeSeries] = {}

    def add(self, batch: pl.DataFrame, state: str | None, action: str | None) -> None:
        """One batch's rows; a null or non-finite timestamp raises (the frames step skips such
        a file whole, and so does the timeline: collect a file apart, then `extend`)."""
        seconds_column = batch[TIMESTAMP].cast(pl.Float64)
        if (seconds_column.is_null() | ~seconds_column.is_finite()).any():
            raise FrameDataError(f"field {TIMESTAMP!r} is null or not finite")
        episodes = (
            batch[EPISODE_INDEX].fill_null(0).to_list()
            if EPISODE_INDEX in batch.columns
            else [0] * batch.height
        )
        seconds = seconds_column.to_list()
        states = _rows(batch[state].to_list()) if state else [[] for _ in seconds]
        actions = _rows(batch[action].to_list()) if action else [[] for _ in seconds]
        for episode, second, s, a in zip(episodes, seconds, states, actions, strict=True):
            series = self.episodes.setdefault(int(episode), EpisodeSeries(int(episode)))
            series.timestamps.append(second)
            series.state.append(s)
            series.action.append(a)

    def extend(self, later: SeriesCollector) -> None:
        """Append what `later` collected (the next file's rows), episode by episode."""
        for index, series in later.episodes.items():
            mine = self.episodes.setdefault(index, EpisodeSeries(index))
            mine.timestamps += series.timestamps
            mine.state += series.state
            mine.action += series.action

    def series(self) -> list[EpisodeSeries]:
        return [self.episodes[index] for index in sorted(self.episodes)]


# -- downsampling ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Sampled:
    """A series as written: the kept times and, per dimension, its values at them."""

    sampling: str  # EVERY_FRAME or MINMAX
    bucket_frames: int  # frames per bucket (1: every frame)
    t: list[float]
    dims: list[list[float | None]]  # one list per dimension, each len(t)


def minmax_downsample(
    t: Sequence[float], values: pl.DataFrame, max_points: int = MAX_POINTS
) -> Sampled:
    """Every frame when there are at most `max_points`; else min/max per bucket of
    consecutive frames (see the module docstring). `values` has one column per dimension,
    one row per frame; null is a gap."""
    frames = len(t)
    if frames <= max_points:
        return Sampled(EVERY_FRAME, 1, list(t), [values[c].to_list() for c in values.columns])
    bucket = math.ceil(frames / (max_points // 2))
    framed = pl.DataFrame({"t": pl.Series(t, dtype=pl.Float64)}).hstack(values)
    framed = framed.with_row_index("frame")
    grouped = (
        framed.group_by((pl.col("frame") // bucket).alias("bucket"), maintain_order=True)
        .agg(
            pl.col("t").first().alias("t_first"),
            pl.col("t").last().alias("t_last"),
            *[
                expr
                for c in values.columns
                for expr in (
                    pl.col(c).min().alias(f"{c}_min"),
                    pl.col(c).max().alias(f"{c}_max"),
                    pl.col(c).arg_min().alias(f"{c}_at_min"),
                    pl.col(c).arg_max().alias(f"{c}_at_max"),
                )
            ],
        )
        .sort("bucket")
    )
    out_t = [v for pair in zip(grouped["t_first"], grouped["t_last"], strict=True) for v in pair]
    dims = []
    for c in values.columns:
        min_first = grouped[f"{c}_at_min"].fill_null(0) <= grouped[f"{c}_at_max"].fill_null(0)
        low, high = grouped[f"{c}_min"].to_list(), grouped[f"{c}_max"].to_list()
        dims.append(
            [
                v
                for a, b, first in zip(low, high, min_first.to_list(), strict=True)
                for v in ((a, b) if first else (b, a))
            ]
        )
    return Sampled(MINMAX, bucket, out_t, dims)


# -- JSON ------------------------------------------------------------------------------------


def _times(values: Iterable[float]) -> list[float]:
    return [round(float(v), TIME_DECIMALS) for v in values]


def _values(column: Sequence[float | None]) -> list[float | None]:
    """Values as float32 prints them shortest (LeRobot stores float32: 0.1, not
    0.10000000149011612); a gap as null."""
    short = pl.Series(column, dtype=pl.Float64).cast(pl.Float32).cast(pl.String).to_list()
    return [None if text is None else float(text) for text in short]


def _vector_json(
    t: list[float], rows: list[list[float]], names: Sequence[str] | None, max_points: int
) -> dict[str, Any] | None:
    values = _frame(rows)
    if values.width == 0:
        return None
    sampled = minmax_downsample(t, values, max_points)
    labels = list(names) if names and len(names) == values.width else None
    return {
        "names": labels or [str(d) for d in range(values.width)],
        "values": [_values(dim) for dim in sampled.dims],
    }


def series_json(
    series: EpisodeSeries, names: Mapping[str, Sequence[str] | None], max_points: int = MAX_POINTS
) -> dict[str, Any]:
    """The episode's state and action on one time axis, downsampled alike (same `t`)."""
    t = series.timestamps
    sampled = minmax_downsample(t, pl.DataFrame(), max_points)
    return {
        "sampling": sampled.sampling,
        "bucket_frames": sampled.bucket_frames,
        "t": _times(sampled.t),
        "state": _vector_json(t, series.state, names.get("state"), max_points),
        "action": _vector_json(t, series.action, names.get("action"), max_points),
    }


# -- cameras ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CameraSource:
    """One mp4 of a camera as the transcode recorded it (`hls_renditions` metadata `sources`)."""

    key: str
    stream_start: float | None  # where it starts in the camera's HLS stream; None: left out
    stream_end: float | None
    fps: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class CameraTrack:
    """A camera's outputs (keys relative to the episode's processed/ prefix) and sources."""

    name: str
    master: str | None
    playlist: str | None
    poster: str | None
    storyboard: Mapping[str, Any] | None  # image, vtt, interval, tiles, tile_width, tile_height
    seconds: float
    sources: list[CameraSource]
    error: str | None = None


def camera_range(
    place: Placement | str | None, sources: Mapping[str, CameraSource], fps: float
) -> dict[str, Any]:
    """Where one episode's frames of a camera are in the camera's stream: `offset` (stream time
    = offset + the rows' timestamp), `start`/`end` (the frames it has), the mp4; or why none."""
    if place is None:
        return {"error": "no video of this camera for this episode"}
    if isinstance(place, str):
        return {"error": place}
    video = place.video
    source = sources.get(video.key)
    if source is None or source.stream_start is None:
        return {"source": video.key, "error": "not in the camera's stream (left out)"}
    rate = video.fps or fps
    base = source.stream_start
    return {
        "source": video.key,
        "offset": round(base - (video.start_seconds or 0.0) + place.offset, TIME_DECIMALS),
        "start": round(base + place.first / rate, TIME_DECIMALS),
        "end": round(base + place.end / rate, TIME_DECIMALS),
    }


def _camera_json(camera: CameraTrack) -> dict[str, Any]:
    return {
        "name": camera.name,
        "master": camera.master,
        "playlist": camera.playlist,
        "poster": camera.poster,
        "storyboard": dict(camera.storyboard) if camera.storyboard else None,
        "seconds": camera.seconds,
        "sources": [
            {
                "key": s.key,
                "start": s.stream_start,
                "end": s.stream_end,
                **({"error": s.error} if s.error else {}),
            }
            for s in camera.sources
        ],
        "error": camera.error,
    }


def _finding_json(finding: LocatedFinding) -> dict[str, Any]:
    return {
        "episode": finding.episode,
        "camera": finding.camera,
        "start": None if finding.start is None else round(finding.start, TIME_DECIMALS),
        "end": None if finding.end is None else round(finding.end, TIME_DECIMALS),
        "message": finding.message,
    }


def build_timeline(
    *,
    episode: str,
    fps: float | None,
    codebase_version: str | None,
    series: Sequence[EpisodeSeries],
    cameras: Sequence[CameraTrack],
    placements: Mapping[tuple[int, str], Placement | str],
    findings: Sequence[LocatedFinding],
    names: Mapping[str, Sequence[str] | None] | None = None,
    max_points: int = MAX_POINTS,
) -> dict[str, Any]:
    """The timeline document (docs/contract.md#timeline). `placements` and `findings` come
    from the sync rule over the same facts; `series` from the data files."""
    # By name, not in the order the cameras' transcodes ended: the same facts, the same bytes.
    cameras = sorted(cameras, key=lambda camera: camera.name)
    rate = fps or next((s.fps for c in cameras for s in c.sources if s.fps), None) or 30.0
    by_key = {s.key: s for camera in cameras for s in camera.sources}
    episodes = []
    for item in series:
        stamps = item.timestamps
        episodes.append(
            {
                "index": item.index,
                "frames": len(stamps),
                "start": round(stamps[0], TIME_DECIMALS) if stamps else None,
                "end": round(stamps[-1] + 1 / rate, TIME_DECIMALS) if stamps else None,
                "cameras": {
                    camera.name: camera_range(
                        placements.get((item.index, camera.name)), by_key, rate
                    )
                    for camera in cameras
                },
                "series": series_json(item, names or {}, max_points),
                "findings": [_finding_json(f) for f in findings if f.episode == item.index],
            }
        )
    return {
        "format": FORMAT,
        "version": VERSION,
        "episode": episode,
        "fps": rate,
        "codebase_version": codebase_version,
        "max_points": max_points,
        "cameras": [_camera_json(camera) for camera in cameras],
        "episodes": episodes,
        "findings": [_finding_json(f) for f in findings if f.episode is None],
    }


def feature_names(spec: Mapping[str, Any] | None) -> list[str] | None:
    """A vector feature's per-dimension names from info.json's `names`, in the shapes LeRobot
    writes: a list, a list of lists (flattened), or `{"motors": [...]}` (one entry); else None."""
    names = (spec or {}).get("names")
    if isinstance(names, Mapping) and len(names) == 1:
        names = next(iter(names.values()))
    if isinstance(names, list) and names and all(isinstance(n, list) for n in names):
        names = [n for part in names for n in part]
    if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
        return list(names)
    return None
