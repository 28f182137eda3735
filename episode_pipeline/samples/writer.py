"""Write realistic LeRobot episode archives (v3.0, v2.1 or v2.0) for demos, tests and benchmarks.

The layout, info.json keys, task and episode tables follow what ``huggingface/lerobot`` writes
(see docs/lerobot-archives.md); the videos are real mp4s encoded by the FFmpeg bundled
with ``imageio-ffmpeg`` from a test pattern, so probing and transcoding see genuine streams.
Options off by default reproduce what datasets in the wild do differently (other state/action
names, nested feature names, videos outside the template's folder, wrong codec claims, stale
totals, fewer videos than data episodes).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from episode_pipeline.lerobot.layout import CODEBASE_VERSIONS
from episode_pipeline.video import ffmpeg_exe

CHUNKS_SIZE = 1000
JOINTS = (
    "shoulder_pan.pos",
    "shoulder_lift.pos",
    "elbow_flex.pos",
    "wrist_flex.pos",
    "wrist_roll.pos",
    "gripper.pos",
)
CAMERA_NAMES = ("front", "wrist", "top", "side", "left", "right")
V30_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V30_VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
V2_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V2_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
NAMES_STYLES = ("flat", "nested", "dict", "null")


class SampleError(RuntimeError):
    """The sample could not be written (usually: FFmpeg lacks the requested encoder)."""


@dataclass(frozen=True)
class SampleSpec:
    """What to generate. ``seconds`` and ``fps`` are per LeRobot episode."""

    codebase_version: Literal["v3.0", "v2.1", "v2.0"] = "v3.0"
    cameras: int = 2
    seconds: float = 4.0
    fps: int = 30
    codec: Literal["h264", "av1"] = "h264"
    episodes: int = 1
    width: int = 320
    height: int = 240
    task: str = "Pick up the red cube and place it in the bin"
    robot_type: str = "so101_follower"
    root_folder: str | None = "lerobot_episode"  # top-level folder in the tar; None: no folder
    tasks_index_name: str | None = None  # None → "__index_level_0__" (pre-2026 writers); or "task"
    seed: int = 0
    # What real datasets do differently; the defaults are what LeRobot writes.
    state_key: str | None = "observation.state"  # None: no state column or feature
    action_key: str | None = "action"  # None: no action column or feature
    names_style: Literal["flat", "nested", "dict", "null"] = "flat"  # vector features' `names`
    video_folder: str = "videos"  # where the mp4s go; info.json's video_path still says videos/
    claimed_codec: str | None = None  # the codec info.json claims (None: the one encoded)
    video_episodes: int | None = None  # LeRobot episodes that have videos (None: all)
    info_overrides: Mapping[str, Any] = field(default_factory=dict)  # e.g. a stale total_frames
    # Video and data out of step (docs/sync.md), by camera index / LeRobot episode index:
    short_cameras: Mapping[int, float] = field(default_factory=dict)  # fraction of frames cut
    late_cameras: Mapping[int, float] = field(default_factory=dict)  # seconds its frames start late
    dropped_rows: Sequence[tuple[int, int]] = ()  # (episode, frame_index) rows left out: a gap
    range_end_offsets: Mapping[int, float] = field(default_factory=dict)  # v3.0: to_timestamp +s

    @property
    def frames_per_episode(self) -> int:
        return round(self.fps * self.seconds)

    @property
    def episodes_with_video(self) -> int:
        """How many LeRobot episodes (the first ones) have videos."""
        return self.episodes if self.video_episodes is None else self.video_episodes

    @property
    def camera_keys(self) -> list[str]:
        names = [
            CAMERA_NAMES[i] if i < len(CAMERA_NAMES) else f"cam{i}" for i in range(self.cameras)
        ]
        return [f"observation.images.{name}" for name in names]

    def validate(self) -> None:
        if self.codebase_version not in CODEBASE_VERSIONS:
            raise SampleError(
                f"codebase_version must be one of {', '.join(CODEBASE_VERSIONS)}, "
                f"not {self.codebase_version}"
            )
        if self.names_style not in NAMES_STYLES:
            raise SampleError(f"names_style must be one of {', '.join(NAMES_STYLES)}")
        if not 1 <= self.episodes_with_video <= self.episodes:
            raise SampleError("video_episodes must be between 1 and episodes")
        if self.codec not in ("h264", "av1"):
            raise SampleError(f"codec must be h264 or av1, not {self.codec}")
        if self.cameras < 0 or self.episodes < 1 or self.fps < 1 or self.frames_per_episode < 1:
            raise SampleError("need cameras >= 0, episodes >= 1 and at least one frame")
        if self.width % 2 or self.height % 2:
            raise SampleError("width and height must be even (yuv420p)")
        cameras = {*self.short_cameras, *self.late_cameras}
        if not all(0 <= camera < self.cameras for camera in cameras):
            raise SampleError("short_cameras and late_cameras take camera indices")
        if not all(0 <= cut < 1 for cut in self.short_cameras.values()):
            raise SampleError("short_cameras: the fraction cut must be in [0, 1)")
        if not all(
            0 <= e < self.episodes and 0 <= i < self.frames_per_episode
            for e, i in self.dropped_rows
        ):
            raise SampleError("dropped_rows: (episode, frame_index) must exist")


@lru_cache(maxsize=1)
def available_encoders() -> frozenset[str]:
    """Encoder names the bundled FFmpeg offers (checked once, the build varies by platform)."""
    out = subprocess.run(
        [ffmpeg_exe(), "-hide_banner", "-encoders"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and len(parts[0]) == 6 and parts[0][0] == "V":
            names.add(parts[1])
    return frozenset(names)


def av1_encoder() -> str | None:
    """``libsvtav1`` (LeRobot's default) or ``libaom-av1``; ``None`` when neither exists."""
    encoders = available_encoders()
    return next((e for e in ("libsvtav1", "libaom-av1") if e in encoders), None)


def _codec_args(codec: str, fps: int) -> list[str]:
    if codec == "h264":
        return ["-c:v", "libx264", "-preset", "veryfast", "-crf", "28", "-g", str(fps)]
    encoder = av1_encoder()
    if encoder == "libsvtav1":
        return ["-c:v", "libsvtav1", "-preset", "12", "-crf", "40", "-g", str(fps),
                "-svtav1-params", "lp=2"]  # fmt: skip
    if encoder == "libaom-av1":
        return ["-c:v", "libaom-av1", "-cpu-used", "8", "-row-mt", "1", "-crf", "40",
                "-g", str(fps)]  # fmt: skip
    raise SampleError("the bundled FFmpeg has no AV1 encoder (libsvtav1 / libaom-av1)")


def _video_command(
    spec: SampleSpec, camera: int, frames: int, out: Path, episode: int = 0
) -> list[str]:
    # A different tint per camera (and v2.1 episode) so the streams are told apart when viewed.
    source = f"testsrc2=size={spec.width}x{spec.height}:rate={spec.fps}"
    hue = camera * 90 + episode * 37
    filters = f"hue=h={hue}" if hue else "null"
    frames = max(1, round(frames * (1 - spec.short_cameras.get(camera, 0.0))))
    late = spec.late_cameras.get(camera)
    offset = ["-output_ts_offset", f"{late:g}"] if late else []
    return [
        ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-nostdin", "-y",
        "-f", "lavfi", "-i", source, "-vf", filters, "-frames:v", str(frames), "-an",
        *_codec_args(spec.codec, spec.fps), "-pix_fmt", "yuv420p", *offset, str(out),
    ]  # fmt: skip


def _encode_videos(jobs: Iterable[list[str]]) -> None:
    """Run the FFmpeg jobs two at a time (the machines have 2 cores)."""
    jobs = list(jobs)
    for start in range(0, len(jobs), 2):
        running = [
            subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for cmd in jobs[start : start + 2]
        ]
        for process, cmd in zip(running, jobs[start : start + 2], strict=True):
            _, stderr = process.communicate()
            if process.returncode != 0:
                raise SampleError(
                    f"ffmpeg failed writing {cmd[-1]}: {stderr.decode(errors='replace')[-500:]}"
                )


def _vector_array(values: np.ndarray) -> pa.FixedSizeListArray:
    flat = pa.array(values.astype(np.float32).reshape(-1), type=pa.float32())
    return pa.FixedSizeListArray.from_arrays(flat, values.shape[1])


def _episode_table(spec: SampleSpec, episode: int, first_index: int) -> pa.Table:
    """One episode's frames, with the column types lerobot writes."""
    n = spec.frames_per_episode
    rng = np.random.default_rng(spec.seed + episode)
    t = np.arange(n) / spec.fps
    phase = rng.uniform(0, math.pi, size=len(JOINTS))
    state = 30.0 * np.sin(t[:, None] * 1.5 + phase[None, :])
    action = state + rng.normal(0, 0.5, size=state.shape)
    vectors = {spec.action_key: _vector_array(action), spec.state_key: _vector_array(state)}
    table = pa.table(
        {
            **{key: values for key, values in vectors.items() if key is not None},
            "timestamp": pa.array(t.astype(np.float32), type=pa.float32()),
            "frame_index": pa.array(np.arange(n), type=pa.int64()),
            "episode_index": pa.array(np.full(n, episode), type=pa.int64()),
            "index": pa.array(np.arange(first_index, first_index + n), type=pa.int64()),
            "task_index": pa.array(np.zeros(n), type=pa.int64()),
        }
    )
    dropped = {i for e, i in spec.dropped_rows if e == episode}
    return table.filter(pa.array([i not in dropped for i in range(n)])) if dropped else table


def _vector_names(style: str) -> object:
    """The ``names`` of a joint vector in the styles LeRobot versions and converters wrote."""
    joints = list(JOINTS)
    return {
        "flat": joints,
        "nested": [joints[:3], joints[3:]],
        "dict": {"motors": joints},
        "null": None,
    }[style]


def _features(spec: SampleSpec) -> dict:
    vector = {"dtype": "float32", "shape": [len(JOINTS)], "names": _vector_names(spec.names_style)}
    features: dict = {key: dict(vector) for key in (spec.action_key, spec.state_key) if key}
    for key in spec.camera_keys:
        features[key] = {
            "dtype": "video",
            "shape": [spec.height, spec.width, 3],
            "names": ["height", "width", "channels"],
            "info": {
                "video.height": spec.height,
                "video.width": spec.width,
                "video.codec": spec.claimed_codec or spec.codec,
                "video.pix_fmt": "yuv420p",
                "video.is_depth_map": False,
                "video.fps": spec.fps,
                "video.channels": 3,
                "has_audio": False,
            },
        }
    for name, dtype in (
        ("timestamp", "float32"),
        ("frame_index", "int64"),
        ("episode_index", "int64"),
        ("index", "int64"),
        ("task_index", "int64"),
    ):
        features[name] = {"dtype": dtype, "shape": [1], "names": None}
    return features


def _info(spec: SampleSpec) -> dict:
    total_frames = spec.frames_per_episode * spec.episodes - len(set(spec.dropped_rows))
    common = {
        "codebase_version": spec.codebase_version,
        "robot_type": spec.robot_type,
        "total_episodes": spec.episodes,
        "total_frames": total_frames,
        "total_tasks": 1,
    }
    if spec.codebase_version == "v3.0":
        info = {
            **common,
            "chunks_size": CHUNKS_SIZE,
            "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 500,
            "fps": spec.fps,
            "splits": {"train": f"0:{spec.episodes}"},
            "data_path": V30_DATA_PATH,
            "video_path": V30_VIDEO_PATH if spec.cameras else None,
            "features": _features(spec),
        }
        return {**info, **spec.info_overrides}
    info = {
        **common,
        "total_videos": spec.cameras * spec.episodes_with_video,
        "total_chunks": 1,
        "chunks_size": CHUNKS_SIZE,
        "fps": spec.fps,
        "splits": {"train": f"0:{spec.episodes}"},
        "data_path": V2_DATA_PATH,
        "video_path": V2_VIDEO_PATH if spec.cameras else None,
        "features": _features(spec),
    }
    return {**info, **spec.info_overrides}


def _stats(table: pa.Table, spec: SampleSpec) -> dict:
    stats = {}
    for name in (k for k in (spec.action_key, spec.state_key) if k):
        values = np.asarray(table.column(name).combine_chunks().flatten()).reshape(
            table.num_rows, -1
        )
        stats[name] = {
            "min": values.min(axis=0).tolist(),
            "max": values.max(axis=0).tolist(),
            "mean": values.mean(axis=0).tolist(),
            "std": values.std(axis=0).tolist(),
            "count": [table.num_rows],
        }
    return stats


def _write_tasks_parquet(path: Path, spec: SampleSpec) -> None:
    """As lerobot does: the task text is the pandas index, written through pandas."""
    frame = pd.DataFrame(
        {"task_index": [0]}, index=pd.Index([spec.task], name=spec.tasks_index_name)
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(path)


def _video_file(root: Path, spec: SampleSpec, relative: str) -> Path:
    """Where an mp4 goes: the template's path, under ``spec.video_folder`` instead of videos/."""
    path = root / spec.video_folder / relative.removeprefix("videos/")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _write_v30(root: Path, spec: SampleSpec) -> tuple[list[list[str]], list[pa.Table]]:
    n = spec.frames_per_episode
    tables = [_episode_table(spec, e, e * n) for e in range(spec.episodes)]
    data = root / V30_DATA_PATH.format(chunk_index=0, file_index=0)
    data.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(data, tables[0].schema) as writer:
        for table in tables:  # one row group per episode
            writer.write_table(table)
    jobs = []
    for camera, key in enumerate(spec.camera_keys):
        video = _video_file(
            root, spec, V30_VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0)
        )
        jobs.append(_video_command(spec, camera, n * spec.episodes_with_video, video))
    _write_tasks_parquet(root / "meta/tasks.parquet", spec)

    lengths = [table.num_rows for table in tables]
    ends = np.cumsum(lengths).tolist()
    episodes: dict[str, list] = {
        "episode_index": list(range(spec.episodes)),
        "tasks": [[spec.task]] * spec.episodes,
        "length": lengths,
        "data/chunk_index": [0] * spec.episodes,
        "data/file_index": [0] * spec.episodes,
        "dataset_from_index": [end - length for end, length in zip(ends, lengths, strict=True)],
        "dataset_to_index": ends,
    }
    for key in spec.camera_keys:
        episodes[f"videos/{key}/chunk_index"] = [0] * spec.episodes
        episodes[f"videos/{key}/file_index"] = [0] * spec.episodes
        episodes[f"videos/{key}/from_timestamp"] = [e * n / spec.fps for e in range(spec.episodes)]
        episodes[f"videos/{key}/to_timestamp"] = [
            (e + 1) * n / spec.fps + spec.range_end_offsets.get(e, 0.0)
            for e in range(spec.episodes)
        ]
    episodes["meta/episodes/chunk_index"] = [0] * spec.episodes
    episodes["meta/episodes/file_index"] = [0] * spec.episodes
    episodes_file = root / "meta/episodes/chunk-000/file-000.parquet"
    episodes_file.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(episodes), episodes_file)
    _write_stats_json(root, spec, tables)
    return jobs, tables


def _write_stats_json(root: Path, spec: SampleSpec, tables: list[pa.Table]) -> None:
    stats = _stats(pa.concat_tables(tables), spec)
    (root / "meta/stats.json").write_text(json.dumps(stats, indent=4))


def _write_v2(root: Path, spec: SampleSpec) -> tuple[list[list[str]], list[pa.Table]]:
    n = spec.frames_per_episode
    tables, jobs = [], []
    episodes_lines, stats_lines = [], []
    for episode in range(spec.episodes):
        chunk = episode // CHUNKS_SIZE
        table = _episode_table(spec, episode, episode * n)
        tables.append(table)
        data = root / V2_DATA_PATH.format(episode_chunk=chunk, episode_index=episode)
        data.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, data)
        for camera, key in enumerate(spec.camera_keys):
            if episode >= spec.episodes_with_video:
                break
            relative = V2_VIDEO_PATH.format(
                episode_chunk=chunk, video_key=key, episode_index=episode
            )
            jobs.append(_video_command(spec, camera, n, _video_file(root, spec, relative), episode))
        episodes_lines.append(
            {"episode_index": episode, "tasks": [spec.task], "length": table.num_rows}
        )
        stats_lines.append({"episode_index": episode, "stats": _stats(table, spec)})
    meta = root / "meta"
    meta.mkdir(parents=True, exist_ok=True)
    (meta / "tasks.jsonl").write_text(json.dumps({"task_index": 0, "task": spec.task}) + "\n")
    (meta / "episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in episodes_lines))
    if spec.codebase_version == "v2.0":  # one stats file; v2.1 moved to per-episode stats
        _write_stats_json(root, spec, tables)
    else:
        lines = "".join(json.dumps(x) + "\n" for x in stats_lines)
        (meta / "episodes_stats.jsonl").write_text(lines)
    return jobs, tables


def write_dataset(root: Path, spec: SampleSpec) -> dict:
    """Write the dataset folder itself (no archive) and return the facts a test compares."""
    spec.validate()
    root.mkdir(parents=True, exist_ok=True)
    writer = _write_v30 if spec.codebase_version == "v3.0" else _write_v2
    jobs, tables = writer(root, spec)
    (root / "meta").mkdir(exist_ok=True)
    (root / "meta/info.json").write_text(json.dumps(_info(spec), indent=4))
    _encode_videos(jobs)
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    return {
        "codebase_version": spec.codebase_version,
        "robot_type": spec.robot_type,
        "fps": spec.fps,
        "seconds": spec.seconds,
        "episodes": spec.episodes,
        "frames_per_episode": spec.frames_per_episode,
        "total_frames": sum(t.num_rows for t in tables),
        "codec": spec.codec,
        "cameras": spec.camera_keys,
        "task": spec.task,
        "files": files,
        "data_files": [f for f in files if f.startswith("data/")],
        "video_files": [f for f in files if f.endswith(".mp4")],
    }


def default_member_order(relative: str) -> tuple:
    """Sorted paths, which puts ``data/`` and ``meta/`` before ``videos/`` like a sorted tar."""
    return (relative,)


def pack_archive(
    folder: Path,
    out: Path | BinaryIO,
    *,
    root_folder: str | None,
    order: Callable[[str], tuple] = default_member_order,
    level: int = 3,
    extra_members: Sequence[tuple[str | bytes, bytes]] = (),
) -> list[str]:
    """Tar ``folder`` (under ``root_folder`` or flat) into a zstd-compressed ``out`` (a path, or
    a binary file written front to back and left open: a pipe into an upload).

    Returns the member paths in archive order. ``order`` lets tests put info.json last.
    ``extra_members`` (path relative to the root folder, content) are appended after the
    folder's files, as hostile archives have them: a path already written makes a duplicate
    member, a ``bytes`` path is written byte for byte (it need not be valid UTF-8).
    """
    files = sorted(
        (p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()), key=order
    )
    names = []
    target: contextlib.AbstractContextManager[BinaryIO] = contextlib.nullcontext(out)  # type: ignore[arg-type]
    if isinstance(out, Path):
        out.parent.mkdir(parents=True, exist_ok=True)
        target = out.open("wb")
    with target as raw:
        compressor = zstandard.ZstdCompressor(level=level)
        with (
            compressor.stream_writer(raw, closefd=False) as compressed,
            tarfile.open(fileobj=compressed, mode="w|", format=tarfile.PAX_FORMAT) as tar,
        ):
            for relative in files:
                name = f"{root_folder}/{relative}" if root_folder else relative
                info = tar.gettarinfo(str(folder / relative), arcname=name)
                info.uid = info.gid = 0
                info.uname = info.gname = "robot"
                with (folder / relative).open("rb") as handle:
                    tar.addfile(info, handle)
                names.append(name)
            for path, data in extra_members:
                if isinstance(path, bytes):  # tarfile writes surrogate escapes back as the bytes
                    path = path.decode("utf-8", "surrogateescape")
                name = f"{root_folder}/{path}" if root_folder else path
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.uname = info.gname = "robot"
                tar.addfile(info, io.BytesIO(data))
                names.append(name)
    return names


def write_sample(out: Path, spec: SampleSpec) -> dict:
    """Write a ``.tar.zst`` LeRobot archive to ``out`` and return a JSON-serialisable summary."""
    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="lerobot-sample-") as tmp:
        folder = Path(tmp) / (spec.root_folder or "dataset")
        summary = write_dataset(folder, spec)
        members = pack_archive(folder, out, root_folder=spec.root_folder)
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "archive": str(out),
        "archive_bytes": out.stat().st_size,
        "root_folder": spec.root_folder,
        "members": members,
        **summary,
    }
