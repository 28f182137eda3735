"""Do each LeRobot episode's rows and each camera's frames line up? The rule, pure (docs/sync.md).

LeRobot trains on (row, frame) pairs: row `i` of episode `e` is paired with the frame its camera
shows at `from_timestamp + timestamp[i]` (v3.0: the episode's range inside a concatenated mp4;
v2.x: 0, one mp4 per episode), and LeRobot refuses a pair further apart than `tolerance_s`
(1e-4 s by default). This module checks the same promises from facts gathered elsewhere, never
decoding anything itself:

- the rows' timestamps, spaced 1/fps (± tolerance), from `TimingAccumulator` fed by the frames
  asset while it streams the data parquets;
- each mp4's frame count, duration, first and last frame time, from the transcode's probe;
- v3.0 only: each episode's `videos/<camera>/from_timestamp`..`to_timestamp` from
  `meta/episodes/*.parquet` (`episodes_table`).

The frames of a range are placed on a constant-rate timeline (first frame + k / fps), which is
how LeRobot encodes; a file whose last frame is not where that timeline puts it is reported.
"""

from __future__ import annotations

import copy
import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl

TOLERANCE_S = 1e-4  # LeRobot's default `tolerance_s`
FRAME_SLACK = 1  # rows vs frames: ± one frame (a last frame cut or kept by the encoder)
EPISODES_TABLE_PREFIX = "meta/episodes/"
_NUMBER = {name: re.compile(rf"{name}[-_](\d+)") for name in ("chunk", "file", "episode")}


# -- the rows' timestamps, gathered while the frames asset streams them ---------------------


@dataclass
class EpisodeTiming:
    """What the rows of one LeRobot episode say about time."""

    episode_index: int
    rows: int = 0
    first_timestamp: float | None = None
    last_timestamp: float | None = None
    irregular: int = 0  # intervals further than the tolerance from 1/fps
    first_irregular_row: int | None = None  # row (0-based in the episode) after the first such
    first_irregular_interval: float | None = None  # seconds between it and the row before
    largest_deviation: float = 0.0  # seconds, over all intervals

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EpisodeTiming:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


class TimingAccumulator:
    """Per LeRobot episode: rows, first and last timestamp, intervals off 1/fps.

    Batches arrive in row order (files in path order); an episode may continue from one batch
    or file to the next. `fps` None (info.json without it): rows are counted, spacing is not.
    """

    def __init__(self, fps: float | None, tolerance_s: float = TOLERANCE_S) -> None:
        self.fps = fps
        self.tolerance_s = tolerance_s
        self.episodes: dict[int, EpisodeTiming] = {}

    def absorb(self, later: TimingAccumulator) -> None:
        """Append what `later` saw (the next file's rows), as if this accumulator had seen it."""
        for episode, timing in later.episodes.items():
            mine = self.episodes.get(episode)
            if mine is None or mine.last_timestamp is None or timing.first_timestamp is None:
                self.episodes[episode] = copy.copy(timing)
                continue
            rows_before = mine.rows
            self._add_run(episode, pl.Series([timing.first_timestamp]))  # the interval between
            mine.rows = rows_before + timing.rows
            mine.last_timestamp = timing.last_timestamp
            mine.largest_deviation = max(mine.largest_deviation, timing.largest_deviation)
            if mine.first_irregular_row is None and timing.first_irregular_row is not None:
                mine.first_irregular_row = rows_before + timing.first_irregular_row
                mine.first_irregular_interval = timing.first_irregular_interval
            mine.irregular += timing.irregular

    def add(
        self, timestamps: Sequence[float] | pl.Series, episodes: Sequence[Any] | pl.Series | None
    ) -> None:
        """One batch: its timestamps (seconds) and episode indices (None: all episode 0)."""
        seconds = pl.Series(timestamps, dtype=pl.Float64)
        if not len(seconds):
            return
        if episodes is None:
            indices = pl.zeros(len(seconds), dtype=pl.Int64, eager=True)
        else:
            indices = pl.Series(episodes, dtype=pl.Int64).fill_null(0)
        starts = [0, *(indices.diff() != 0).arg_true().to_list(), len(seconds)]
        for start, end in itertools.pairwise(starts):
            self._add_run(indices[start], seconds.slice(start, end - start))

    def _add_run(self, episode: int, seconds: pl.Series) -> None:
        timing = self.episodes.setdefault(episode, EpisodeTiming(episode))
        before = timing.rows
        if timing.last_timestamp is not None:
            seconds_with_previous = pl.concat([pl.Series([timing.last_timestamp]), seconds])
            first_row = before  # interval i ends at row before + i
        else:
            seconds_with_previous = seconds
            first_row = 1
            timing.first_timestamp = float(seconds[0])
        timing.rows += len(seconds)
        timing.last_timestamp = float(seconds[-1])
        if not self.fps or len(seconds_with_previous) < 2:
            return
        intervals = seconds_with_previous.diff().slice(1)
        deviation = (intervals - 1.0 / self.fps).abs()
        timing.largest_deviation = max(timing.largest_deviation, float(deviation.max()))
        off = (deviation > self.tolerance_s).arg_true()
        if len(off) and timing.first_irregular_row is None:
            timing.first_irregular_row = first_row + int(off[0])
            timing.first_irregular_interval = round(float(intervals[off[0]]), 6)
        timing.irregular += len(off)

    def to_json(self) -> dict[str, Any]:
        return {
            "fps": self.fps,
            "tolerance_s": self.tolerance_s,
            "episodes": [asdict(self.episodes[e]) for e in sorted(self.episodes)],
        }


def timings_from_json(data: Mapping[str, Any]) -> dict[int, EpisodeTiming]:
    """The per-episode timings the frames asset recorded (`TimingAccumulator.to_json`)."""
    timings = (EpisodeTiming.from_dict(item) for item in data.get("episodes") or [])
    return {timing.episode_index: timing for timing in timings}


# -- the v3.0 episodes table ---------------------------------------------------------------


@dataclass(frozen=True)
class EpisodeRange:
    """Where one episode's frames sit inside one camera's concatenated mp4 (v3.0)."""

    chunk_index: int
    file_index: int
    from_timestamp: float
    to_timestamp: float


@dataclass
class EpisodesTable:
    """`meta/episodes/*.parquet` as the check needs it; `problems` name what could not be read."""

    source: str
    lengths: dict[int, int] = field(default_factory=dict)
    ranges: dict[tuple[int, str], EpisodeRange] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _number(row: Mapping[str, Any], column: str) -> float | None:
    value = row.get(column)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def episodes_table(
    rows: Iterable[Mapping[str, Any]], cameras: Sequence[str], source: str
) -> EpisodesTable:
    """Parse the episodes table's rows (dicts by column); a bad cell is a problem, not a crash."""
    table = EpisodesTable(source)
    for position, row in enumerate(rows):
        episode = _number(row, "episode_index")
        if episode is None or episode != int(episode):
            table.problems.append(
                f"{source}: row {position}: field 'episode_index' is {row.get('episode_index')!r}"
            )
            continue
        index = int(episode)
        length = _number(row, "length")
        if length is not None:
            table.lengths[index] = int(length)
        for camera in cameras:
            columns = [
                f"videos/{camera}/{name}"
                for name in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
            ]
            values = [_number(row, column) for column in columns]
            missing = [c for c, v in zip(columns, values, strict=True) if v is None]
            if missing:
                table.problems.append(
                    f"{source}: episode {index}: field(s) {', '.join(missing)} missing or not "
                    "numbers"
                )
                continue
            chunk, file, start, end = values
            table.ranges[(index, camera)] = EpisodeRange(int(chunk), int(file), start, end)  # type: ignore[arg-type]
    return table


# -- the videos ---------------------------------------------------------------------------


@dataclass(frozen=True)
class VideoFacts:
    """One mp4 of one camera as the transcode probed it (`error`: why it was not)."""

    key: str
    camera: str
    indices: Mapping[str, int] = field(default_factory=dict)  # from its path: episode/chunk/file
    frames: int | None = None
    seconds: float | None = None
    fps: float | None = None
    start_seconds: float | None = None
    last_frame_seconds: float | None = None
    error: str | None = None

    def frame_time(self, k: float, fps: float) -> float:
        return (self.start_seconds or 0.0) + k / fps


def path_indices(path: str, captured: Mapping[str, int]) -> dict[str, int]:
    """episode_index / chunk_index / file_index of an mp4: what info.json's `video_path`
    captured, else the `episode_000001`, `chunk-000`, `file-000` parts of the path."""
    indices = dict(captured)
    name = path.rsplit("/", 1)[-1]
    for key, where in (("episode_index", name), ("chunk_index", path), ("file_index", name)):
        match = _NUMBER[key.split("_")[0]].findall(where)
        if key not in indices and match:
            indices[key] = int(match[-1])
    return indices


# -- the rule -----------------------------------------------------------------------------


@dataclass
class SyncRow:
    """One episode by camera: what was compared and what is wrong (the table the UI shows)."""

    episode: int
    camera: str
    file: str | None = None
    rows: int = 0
    frames: int | None = None  # the camera's frames for this episode
    drift_frames: int | None = None  # frames - rows
    drift_seconds: float | None = None  # drift_frames / fps
    start_offset_seconds: float | None = None  # first frame - first row's time (late: > 0)
    timestamps: str = "ok"
    problems: list[str] = field(default_factory=list)
    # Where each of `problems` happens, in the episode's time (its rows' timestamps, seconds).
    spans: list[Span | None] = field(default_factory=list)

    def add(self, problem: str, span: Span | None) -> None:
        self.problems.append(problem)
        self.spans.append(span)


Span = tuple[float, float]


@dataclass(frozen=True)
class LocatedFinding:
    """A finding and where it happens: the LeRobot episode, the camera, and the time range in
    the episode's own time (its rows' timestamps); None where the finding names no episode,
    camera or moment (an episodes table's problem, a whole file)."""

    message: str  # as in `SyncReport.findings`
    episode: int | None = None
    camera: str | None = None
    start: float | None = None
    end: float | None = None


@dataclass
class SyncReport:
    rows: list[SyncRow]
    findings: list[str]  # every problem, each naming episode, camera, file and offset
    located: list[LocatedFinding] = field(default_factory=list)  # the same, with their times

    @property
    def passed(self) -> bool:
        return not self.findings

    @property
    def failing(self) -> list[str]:
        """`episode E / camera` of every failing row."""
        return [f"episode {r.episode} / {r.camera}" for r in self.rows if r.problems]


def _frames(seconds: float, fps: float) -> str:
    return f"{seconds:+.3f} s, {seconds * fps:+.0f} frames"


def _timestamps_problem(timing: EpisodeTiming, fps: float, tolerance_s: float) -> str | None:
    if not timing.irregular:
        return None
    row = timing.first_irregular_row
    interval = timing.first_irregular_interval or 0.0
    return (
        f"timestamps not spaced 1/fps = {1 / fps:.6f} s (± {tolerance_s:g} s): "
        f"{timing.irregular} interval(s), the first {interval:.6f} s between rows {row - 1} "
        f"and {row} (offset {_frames(interval - 1 / fps, fps)})"
        if row is not None
        else f"timestamps not spaced 1/fps: {timing.irregular} interval(s)"
    )


@dataclass(frozen=True)
class Placement:
    """The episode's frames in one file: the frame index range, and the offset that turns a
    row's timestamp into the file's time (`offset + timestamp`)."""

    video: VideoFacts
    first: int  # frame index of the range's first frame
    end: int  # one past its last
    offset: float  # seconds added to the rows' timestamps (v3.0 from_timestamp; v2.x 0)
    range_seconds: float | None  # v3.0: to - from


def _compare(
    row: SyncRow, timing: EpisodeTiming, place: Placement, fps: float, tolerance_s: float
) -> None:
    """Counts, duration and alignment of one episode's rows with one camera's frames."""
    video = place.video
    where = video.key
    video_fps = video.fps or fps
    whole = episode_span(timing, fps)
    first_ts = timing.first_timestamp or 0.0
    end_ts = whole[1] if whole else timing.rows / fps
    frames = max(0, place.end - place.first)
    row.frames, row.file = frames, video.key
    row.drift_frames = frames - timing.rows
    row.drift_seconds = round(row.drift_frames / fps, 6)
    if abs(row.drift_frames) > FRAME_SLACK:
        side = "short by" if row.drift_frames < 0 else "over by"
        row.add(
            f"{where}: {frames} frames for {timing.rows} rows: {side} "
            f"{abs(row.drift_frames)} frames ({abs(row.drift_seconds):.3f} s)",
            (max(first_ts, end_ts + row.drift_seconds), end_ts) if row.drift_frames < 0 else whole,
        )
    rows_seconds = timing.rows / fps
    length = place.range_seconds if place.range_seconds is not None else video.seconds
    what = "range from_timestamp..to_timestamp" if place.range_seconds is not None else "video"
    if length is not None and abs(length - rows_seconds) > 1 / fps + tolerance_s:
        short = length < rows_seconds
        row.add(
            f"{where}: the {what} lasts {length:.3f} s, the {timing.rows} rows {rows_seconds:.3f} "
            f"s (offset {_frames(length - rows_seconds, fps)})",
            (max(first_ts, end_ts - (rows_seconds - length)), end_ts) if short else whole,
        )
    if video.frames is None or video.frames == 0 or timing.first_timestamp is None:
        return
    wanted_first = place.offset + timing.first_timestamp
    wanted_last = place.offset + (timing.last_timestamp or timing.first_timestamp)
    first_frame = video.frame_time(place.first, video_fps)
    file_first = video.frame_time(0, video_fps)
    file_last = video.frame_time(video.frames - 1, video_fps)
    row.start_offset_seconds = round(first_frame - wanted_first, 6)
    slack = FRAME_SLACK / video_fps + tolerance_s  # the ± one frame of the counts
    if wanted_first < file_first - slack:
        late = file_first - wanted_first
        row.add(
            f"{where}: the camera starts late: its first frame is at {file_first:.3f} s, row 0 "
            f"wants {wanted_first:.3f} s (offset {_frames(late, fps)})",
            (first_ts, min(end_ts, first_ts + late)),
        )
    elif wanted_last > file_last + slack:
        early = wanted_last - file_last
        row.add(
            f"{where}: the camera ends early: its last frame is at {file_last:.3f} s, row "
            f"{timing.rows - 1} wants {wanted_last:.3f} s (offset {_frames(-early, fps)})",
            (max(first_ts, end_ts - early), end_ts),
        )
    else:
        nearest = min(max(round((wanted_first - file_first) * video_fps), 0), video.frames - 1)
        miss = video.frame_time(nearest, video_fps) - wanted_first
        if abs(miss) > tolerance_s:
            row.add(
                f"{where}: the nearest frame to row 0 ({wanted_first:.6f} s) is {miss:+.6f} s "
                f"away (tolerance {tolerance_s:g} s)",
                (first_ts, min(end_ts, first_ts + 1 / fps)),
            )


def episode_span(timing: EpisodeTiming, fps: float) -> Span | None:
    """The episode's time: its first row's timestamp to one frame after its last."""
    if timing.first_timestamp is None:
        return None
    last = timing.last_timestamp if timing.last_timestamp is not None else timing.first_timestamp
    return (timing.first_timestamp, round(last + 1 / fps, 6))


def _gap_span(timing: EpisodeTiming, fps: float) -> Span | None:
    """The first interval off 1/fps: the rows before it are regular, so it starts
    `(row - 1) / fps` after the first."""
    if timing.first_irregular_row is None or timing.first_timestamp is None:
        return None
    start = timing.first_timestamp + (timing.first_irregular_row - 1) / fps
    return (round(start, 6), round(start + (timing.first_irregular_interval or 0.0), 6))


def _spacing_problem(video: VideoFacts, fps: float) -> str | None:
    """A file whose last frame is not where a constant rate puts it lost frames mid-file."""
    if not video.frames or video.start_seconds is None or video.last_frame_seconds is None:
        return None
    video_fps = video.fps or fps
    expected = video.frame_time(video.frames - 1, video_fps)
    gap = video.last_frame_seconds - expected
    if abs(gap) <= 1 / video_fps:
        return None
    return (
        f"{video.key}: {video.frames} frames at {video_fps:g} fps should end at {expected:.3f} s, "
        f"the last is at {video.last_frame_seconds:.3f} s: frames missing mid-file "
        f"(offset {_frames(gap, fps)})"
    )


def _v2_placements(
    videos: Sequence[VideoFacts],
) -> tuple[dict[tuple[int, str], Placement | str], list[str]]:
    placed: dict[tuple[int, str], Placement | str] = {}
    findings = []
    for video in videos:
        episode = video.indices.get("episode_index")
        if episode is None:
            if len([v for v in videos if v.camera == video.camera]) == 1:
                episode = 0  # the only mp4 of its camera: the only episode
            else:
                findings.append(f"{video.key}: camera {video.camera}: no episode index in its path")
                continue
        if video.error:
            placed[(episode, video.camera)] = f"{video.key}: not probed ({video.error})"
            continue
        frames = video.frames or 0
        placed[(episode, video.camera)] = Placement(video, 0, frames, 0.0, None)
    return placed, findings


def _frame_index(video: VideoFacts, seconds: float, fps: float, tolerance_s: float) -> int:
    """Index of the first frame shown at or after `seconds` on the file's timeline, clamped."""
    video_fps = video.fps or fps
    k = math.ceil((seconds - (video.start_seconds or 0.0) - tolerance_s) * video_fps)
    return min(max(k, 0), video.frames or 0)


def _v3_placements(
    cameras: Sequence[str],
    videos: Sequence[VideoFacts],
    table: EpisodesTable | None,
    timings: Mapping[int, EpisodeTiming],
    fps: float,
    tolerance_s: float,
) -> tuple[dict[tuple[int, str], Placement | str], list[str]]:
    placed: dict[tuple[int, str], Placement | str] = {}
    findings: list[str] = []
    files = {
        (v.camera, v.indices.get("chunk_index", 0), v.indices.get("file_index", 0)): v
        for v in videos
    }
    ranges = dict(table.ranges) if table else {}
    findings += table.problems if table else []
    if table is None or not table.ranges:
        findings.append(
            f"{table.source if table else 'meta/episodes/'}: no v3.0 episodes table with "
            "videos/<camera>/from_timestamp..to_timestamp: episodes cannot be placed in the "
            "concatenated mp4s"
            + ("; assumed back to back in episode order" if len(files) == len(cameras) else "")
        )
        if len(files) == len(cameras):  # one mp4 per camera: LeRobot writes them back to back
            for camera in cameras:
                start = 0.0
                for episode in sorted(timings):
                    end = start + timings[episode].rows / fps
                    ranges[(episode, camera)] = EpisodeRange(0, 0, start, end)
                    start = end
            files = {(v.camera, 0, 0): v for v in videos}
    by_file: dict[tuple[str, int, int], list[tuple[EpisodeRange, int]]] = {}
    for (episode, camera), where in sorted(ranges.items()):
        video = files.get((camera, where.chunk_index, where.file_index))
        if video is None:
            placed[(episode, camera)] = (
                f"episodes table points at chunk {where.chunk_index} file {where.file_index}, "
                "which the archive has no mp4 for"
            )
            continue
        if video.error:
            placed[(episode, camera)] = f"{video.key}: not probed ({video.error})"
            continue
        first = _frame_index(video, where.from_timestamp, fps, tolerance_s)
        end = _frame_index(video, where.to_timestamp, fps, tolerance_s)
        placed[(episode, camera)] = Placement(
            video, first, end, where.from_timestamp, where.to_timestamp - where.from_timestamp
        )
        by_file.setdefault((camera, where.chunk_index, where.file_index), []).append(
            (where, episode)
        )
    for (camera, _, _), entries in by_file.items():
        entries.sort(key=lambda item: (item[0].from_timestamp, item[1]))
        for (before, previous), (after, episode) in itertools.pairwise(entries):
            overlap = before.to_timestamp - after.from_timestamp
            if overlap > tolerance_s:
                findings.append(
                    f"episode {episode}, camera {camera}: its range starts at "
                    f"{after.from_timestamp:.3f} s, inside episode {previous}'s (ends "
                    f"{before.to_timestamp:.3f} s): offset {_frames(-overlap, fps)}"
                )
    return placed, findings


def _table_problems(table: EpisodesTable | None, timings: Mapping[int, EpisodeTiming]) -> list[str]:
    if table is None or not (table.lengths or table.ranges):
        return []  # nothing read: the "no episodes table" finding says it once
    problems = []
    for episode, length in sorted(table.lengths.items()):
        rows = timings[episode].rows if episode in timings else 0
        if episode not in timings:
            problems.append(f"{table.source}: episode {episode} is listed, the data has no rows")
        elif length != rows:
            problems.append(
                f"{table.source}: episode {episode}: length {length}, the data has {rows} rows"
            )
    listed = set(table.lengths) | {episode for episode, _ in table.ranges}
    for episode in sorted(set(timings) - listed):
        problems.append(f"{table.source}: episode {episode} has rows but is not listed")
    return problems


def check_sync(
    *,
    codebase_version: str | None,
    fps: float | None,
    timings: Mapping[int, EpisodeTiming],
    videos: Sequence[VideoFacts],
    table: EpisodesTable | None = None,
    tolerance_s: float = TOLERANCE_S,
) -> SyncReport:
    """Every LeRobot episode against every camera, episode by episode (docs/sync.md)."""
    cameras = sorted({video.camera for video in videos})
    rate = fps or next((v.fps for v in videos if v.fps), None)
    if not rate:
        nothing = "info.json has no fps and no video was probed: nothing to check"
        return SyncReport([], [nothing], [LocatedFinding(nothing)])
    placed, general = place_episodes(
        codebase_version, rate, timings, videos, table, tolerance_s=tolerance_s
    )
    located = [LocatedFinding(message) for message in general]
    rows: list[SyncRow] = []
    for video in videos:
        if not video.error and (problem := _spacing_problem(video, rate)):
            located.append(LocatedFinding(f"camera {video.camera}: {problem}", camera=video.camera))
    for episode in sorted(timings):
        timing = timings[episode]
        spacing = _timestamps_problem(timing, rate, tolerance_s)
        if spacing:
            gap = _gap_span(timing, rate)
            located.append(
                LocatedFinding(
                    f"episode {episode}: {spacing}", episode, None, *(gap or (None, None))
                )
            )
        for camera in cameras or [""]:
            row = SyncRow(episode, camera, rows=timing.rows, timestamps=spacing or "ok")
            rows.append(row)
            if not camera:
                continue
            place = placed.pop((episode, camera), None)
            whole = episode_span(timing, rate)
            if place is None:
                row.add(f"no video of camera {camera} for this episode", whole)
            elif isinstance(place, str):
                row.add(place, whole)
            else:
                _compare(row, timing, place, rate, tolerance_s)
            located += [
                LocatedFinding(
                    f"episode {episode}, camera {camera}: {problem}",
                    episode,
                    camera,
                    *(span or (None, None)),
                )
                for problem, span in zip(row.problems, row.spans, strict=True)
            ]
            if spacing:
                row.add(spacing, _gap_span(timing, rate))
    for (episode, camera), place in sorted(placed.items()):
        key = place.video.key if isinstance(place, Placement) else place
        located.append(
            LocatedFinding(
                f"episode {episode}, camera {camera}: {key}: video without data rows",
                episode,
                camera,
            )
        )
    return SyncReport(rows, [finding.message for finding in located], located)


def place_episodes(
    codebase_version: str | None,
    fps: float,
    timings: Mapping[int, EpisodeTiming],
    videos: Sequence[VideoFacts],
    table: EpisodesTable | None = None,
    *,
    tolerance_s: float = TOLERANCE_S,
) -> tuple[dict[tuple[int, str], Placement | str], list[str]]:
    """Where each (episode, camera)'s frames sit in its mp4 (or why they cannot be placed),
    and the findings that name no episode: v2.x one mp4 per episode, v3.0 a range of a
    concatenated mp4 (docs/sync.md). The timeline places its cameras with it too."""
    cameras = sorted({video.camera for video in videos})
    if (codebase_version or "").startswith("v3") and cameras:
        placed, general = _v3_placements(cameras, videos, table, timings, fps, tolerance_s)
        return placed, _table_problems(table, timings) + general
    return _v2_placements(videos)
