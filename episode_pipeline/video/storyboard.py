"""A camera's storyboard: a sprite of small frames and the WebVTT map of it (pure).

Players and the viewer show the tile under the cursor while scrubbing, before the video loads
(Mux, MediaConvert and JW Player do the same). The sprite comes out of the camera's one FFmpeg
invocation (`hls.hls_command`): one more branch of the decoded stream keeps a frame every
`interval` seconds (`select`, by time, so the tile count is known here), scales it to the tile
size and lays the tiles out row by row (`tile`). The VTT is computed here from the same plan,
so it never needs the image: cue `i` spans `[i * interval, (i + 1) * interval)` (the last one
ends with the video) and points at tile `i` (`storyboard.jpg#xywh=x,y,w,h`).

The interval is the smallest of `INTERVALS` that keeps an episode at most `MAX_TILES` tiles,
so a 68 s episode gets a tile per second and a 10-minute one a tile every 10 s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from episode_pipeline.video.hls import even_down

STORYBOARD_IMAGE = "storyboard.jpg"
STORYBOARD_VTT = "storyboard.vtt"
TILE_WIDTH = 160
MAX_TILES = 100
MAX_COLUMNS = 10  # a sprite at most 1,600 px wide: any browser decodes it
INTERVALS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)
# FFmpeg's MJPEG quantiser scale (2 best .. 31): tiles are looked at while moving, small wins.
JPEG_QSCALE = 5


@dataclass(frozen=True)
class Cue:
    start: float
    end: float
    x: int
    y: int
    width: int
    height: int


def _timestamp(seconds: float) -> str:
    """WebVTT's `hh:mm:ss.ttt`."""
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    return f"{hours:02d}:{minutes:02d}:{millis // 1000:02d}.{millis % 1000:03d}"


@dataclass(frozen=True)
class Storyboard:
    """The plan of one camera's sprite: which frames, how big, where each tile sits."""

    seconds: float  # the camera's length (its sources back to back)
    interval: int  # seconds between tiles
    tiles: int
    columns: int
    rows: int
    tile_width: int
    tile_height: int
    image: str = STORYBOARD_IMAGE
    qscale: int = JPEG_QSCALE

    @property
    def width(self) -> int:
        return self.columns * self.tile_width

    @property
    def height(self) -> int:
        return self.rows * self.tile_height

    def filter_chain(self) -> str:
        """The FFmpeg filters from the decoded stream to the sprite (one frame, at EOF or when
        the grid is full). `selected_n` counts the frames kept so far: frame `i` is the first at
        or after `i * interval`, so late tiles never drift."""
        return (
            f"select='gte(t,selected_n*{self.interval})',"
            f"scale={self.tile_width}:{self.tile_height}:flags=bicubic,setsar=1,"
            f"tile={self.columns}x{self.rows},format=yuvj420p"
        )

    def cues(self) -> list[Cue]:
        cues = []
        for index in range(self.tiles):
            row, column = divmod(index, self.columns)
            start = index * self.interval
            cues.append(
                Cue(
                    start=start,
                    end=min(start + self.interval, self.seconds),
                    x=column * self.tile_width,
                    y=row * self.tile_height,
                    width=self.tile_width,
                    height=self.tile_height,
                )
            )
        return cues

    def vtt(self, image: str = STORYBOARD_IMAGE) -> str:
        """The WebVTT text; `image` is the sprite's address relative to the VTT (same folder)."""
        lines = ["WEBVTT", ""]
        for cue in self.cues():
            lines += [
                f"{_timestamp(cue.start)} --> {_timestamp(cue.end)}",
                f"{image}#xywh={cue.x},{cue.y},{cue.width},{cue.height}",
                "",
            ]
        return "\n".join(lines)


def choose_interval(seconds: float, max_tiles: int = MAX_TILES) -> int:
    """The smallest of `INTERVALS` giving at most `max_tiles` tiles (beyond them: evenly)."""
    for interval in INTERVALS:
        if math.ceil(seconds / interval) <= max_tiles:
            return interval
    return math.ceil(seconds / max_tiles)


def plan_storyboard(seconds: float, fps: float, width: int, height: int) -> Storyboard:
    """The sprite of a camera `seconds` long, `width`x`height` at `fps` (its first source's).

    Tiles: one per interval from 0 up to the last frame (at `seconds - 1/fps`), which is what
    the `select` above keeps from a constant-rate stream."""
    if width <= 0 or height <= 0:
        raise ValueError(f"video size must be positive, got {width}x{height}")
    seconds = max(0.0, seconds)
    interval = choose_interval(seconds)
    last_frame = max(0.0, seconds - (1 / fps if fps > 0 else 0.0))
    tiles = math.floor(last_frame / interval + 1e-6) + 1
    columns = min(tiles, MAX_COLUMNS)
    return Storyboard(
        seconds=round(seconds, 3),
        interval=interval,
        tiles=tiles,
        columns=columns,
        rows=math.ceil(tiles / columns),
        tile_width=TILE_WIDTH,
        tile_height=even_down(TILE_WIDTH * height / width),
    )
