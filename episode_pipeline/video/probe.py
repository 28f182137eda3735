"""What a video file really holds, read with PyAV (the bundled FFmpeg has no ffprobe).

LeRobot's info.json labels the codec but nobody checks the label
(docs/lerobot-archives.md#videos): the transcode decides from the probed stream, and a file
PyAV cannot open, cannot decode, or that holds fewer frames than its index claims is reported by
name.

PyAV runs FFmpeg's demuxers inside the calling process, where a hostile file could hang it
beyond reach. So the transcode and the checks never call `probe` directly: `examine` (and
`probe_files`) run this module as a child (`python -m episode_pipeline.video.probe`) under a
deadline (`video.process`), one JSON line per file on its stdout. The child answers its
requests on two threads per CPU: PyAV releases the GIL while it demuxes and decodes, so the HLS
check's three cameras decode side by side instead of one after another.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from episode_pipeline.video.process import DeadlineExceeded, available_cpus, run_with_deadline

PROBE = "probe"
COUNT_FRAMES = "count-frames"
THREADS_PER_CPU = 2  # requests the child answers at once, per CPU


class ProbeError(ValueError):
    """The file is not a readable video (corrupt, truncated, or without a video stream)."""


@dataclass(frozen=True)
class VideoProbe:
    """The facts the transcode needs: the first video stream's codec, size, rate and length."""

    codec: str  # canonical codec name: "av1", "h264", "hevc", ...
    width: int
    height: int
    duration_ms: int
    frames: int  # video packets in the file (one per frame), counted, not read from the header
    fps: float
    has_audio: bool = False
    # Presentation times of the first and last frame (seconds on the file's own timeline):
    # where a camera starts and ends, for the sync check (lerobot/sync.py). None: not probed.
    start_seconds: float | None = None
    last_frame_seconds: float | None = None

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


def _seconds(pts: int | None, time_base: Fraction | None) -> float | None:
    return None if pts is None or time_base is None else round(float(pts * time_base), 6)


def probe(path: str | Path) -> VideoProbe:
    """Open, demux every packet and decode the first frame of `path` (in this process).

    Counting packets reads the whole file but decodes only one frame: it is disk-bound, and it
    catches a file cut short (fewer packets than the index lists) that a header-only probe
    passes. Raises ProbeError naming the file on anything wrong.
    """
    import av  # PyAV loads FFmpeg's libraries: keep it out of module import time

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise ProbeError(f"{path}: no video stream")
            stream = container.streams.video[0]
            context = stream.codec_context
            width, height = int(context.width or 0), int(context.height or 0)
            if width <= 0 or height <= 0:
                raise ProbeError(f"{path}: video stream has no size ({width}x{height})")
            indexed = int(stream.frames or 0)
            packets, decoded = 0, False
            first_pts: int | None = None
            last_pts: int | None = None
            for packet in container.demux(stream):
                if packet.size:
                    packets += 1
                    if packet.pts is not None:
                        first_pts = packet.pts if first_pts is None else min(first_pts, packet.pts)
                        last_pts = packet.pts if last_pts is None else max(last_pts, packet.pts)
                if not decoded:  # the last, empty packet flushes the decoder
                    decoded = bool(packet.decode())
            if packets == 0 or not decoded:
                raise ProbeError(f"{path}: no decodable frames ({packets} packet(s))")
            if indexed > packets:
                raise ProbeError(
                    f"{path}: truncated: its index lists {indexed} frames, it holds {packets}"
                )
            rate = stream.average_rate or stream.guessed_rate or Fraction(0)
            return VideoProbe(
                codec=context.codec.canonical_name,
                width=width,
                height=height,
                duration_ms=_duration_ms(container, stream),
                frames=packets,
                fps=float(rate),
                has_audio=bool(container.streams.audio),
                start_seconds=_seconds(first_pts, stream.time_base),
                last_frame_seconds=_seconds(last_pts, stream.time_base),
            )
    except ProbeError:
        raise
    except (av.error.FFmpegError, OSError, ValueError) as error:
        reason = getattr(error, "strerror", None) or str(error)  # without the path again
        raise ProbeError(f"{path}: not a readable video ({reason})") from error


def decoded_frames(path: str | Path) -> int:
    """Decode every video frame of `path` (a file or an HLS playlist beside its segments)."""
    import av

    frames = 0
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise ProbeError(f"{path}: no video stream")
            for _ in container.decode(video=0):
                frames += 1
    except ProbeError:
        raise
    except (av.error.FFmpegError, OSError, ValueError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise ProbeError(f"{path}: decoding failed after {frames} frame(s) ({reason})") from error
    return frames


# -- the child and its callers ------------------------------------------------------------------

Answer = VideoProbe | int | ProbeError


def examine(
    requests: Sequence[tuple[str, str | Path]], seconds: float, python: str = sys.executable
) -> list[Answer]:
    """Answer (`PROBE` | `COUNT_FRAMES`, path) requests in one child with one deadline.

    A `VideoProbe` for a probe, a frame count for a count, or the ProbeError naming the file. A
    request the child had not answered when it died or ran out of time gets that reason.
    """
    if not requests:
        return []
    command = [python, "-m", __name__, *(str(part) for request in requests for part in request)]
    try:
        done = run_with_deadline(command, seconds, what=f"video probe of {len(requests)} file(s)")
        stdout, failure = done.stdout, None
        if done.returncode != 0:
            failure = f"video probe exited {done.returncode}: {done.stderr.strip()[-500:]}"
    except DeadlineExceeded as error:
        stdout, failure = error.stdout, str(error)
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    answers: list[Answer] = []
    for index, (_, path) in enumerate(requests):
        line = (
            lines[index] if index < len(lines) else {"error": f"{path}: {failure or 'no answer'}"}
        )
        if "probe" in line:
            answers.append(VideoProbe.from_dict(line["probe"]))
        elif "frames" in line:
            answers.append(int(line["frames"]))
        else:
            answers.append(ProbeError(line["error"]))
    return answers


def probe_files(
    paths: Sequence[str | Path], seconds_per_file: float, python: str = sys.executable
) -> list[VideoProbe | ProbeError]:
    """`probe` each file in one child; the child gets `seconds_per_file` per file, then dies."""
    answers = examine([(PROBE, path) for path in paths], seconds_per_file * len(paths), python)
    return [a if isinstance(a, VideoProbe | ProbeError) else ProbeError(str(a)) for a in answers]


def answer(mode: str, path: str) -> dict[str, Any]:
    """One request's JSON answer; a ProbeError is an answer too."""
    try:
        if mode == PROBE:
            return {"probe": asdict(probe(path))}
        if mode == COUNT_FRAMES:
            return {"frames": decoded_frames(path)}
        return {"error": f"{path}: unknown request {mode!r}"}
    except ProbeError as error:
        return {"error": str(error)}


def main(argv: Sequence[str]) -> int:
    """The child: `MODE PATH [MODE PATH ...]`, one JSON line per request, in order, each flushed
    as soon as it and those before it are answered.

    Requests run side by side, two per CPU: with one per CPU the last long decode (the third
    camera on 2 cores) runs alone on one core at the end. Three 60 s 640x480 baselines on 2
    cores: 2.9 s one after another, 2.0 s one per CPU, 1.8 s two per CPU.
    """
    requests = list(zip(argv[::2], argv[1::2], strict=True))
    workers = max(1, min(THREADS_PER_CPU * available_cpus(), len(requests)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for line in pool.map(lambda request: answer(*request), requests):
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
