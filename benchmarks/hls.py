"""Stage `hls`: what the adaptive ladder costs, and what the transcode adds to bare FFmpeg.

- **ladder_cpu** — CPU seconds (FFmpeg's user + system) to transcode one 640x480 30 fps camera
  recorded as LeRobot records (AV1, the sample writer's test pattern). Ours: the default ladder,
  one FFmpeg invocation writing the baseline, every rung that fits the source (240p here) and the
  poster. Baseline: today's single rendition, the same command with the baseline alone. Target:
  at most 1.5x. CPU, not wall time: the machines are shared, and the cost is what a task pays.
- **storyboard_cpu** — CPU seconds of the same camera's production invocation (the default
  ladder, the poster and the storyboard sprite: one more branch of the same decode) against the
  same invocation without the storyboard. Target: at most 1.05x.
- **transcode_wall** — wall seconds for a multi-camera episode. Ours: the transcode program as
  the ECS task runs it (`program.run_episode`: every camera downloaded from S3, probed in a PyAV
  child, one FFmpeg per camera with cameras in parallel, segments uploaded while encoding,
  playlists checked, master and poster written) against the local stack's S3. Baseline: bare
  FFmpeg, the same ladder commands on the same local files, one camera after another, nothing
  else (no S3, no probe, no checks).

Both sides of each figure run interleaved (A B A B ...) on the same files; medians are reported.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import BenchContext, Result, median, median_of, seconds_result
from episode_pipeline.config.settings import AwsSettings, VideoSettings
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.samples.writer import SampleSpec, write_dataset
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.transcode.job import CameraJob, TranscodeJob
from episode_pipeline.transcode.program import camera_command, run_episode
from episode_pipeline.video.ladder import plan_renditions
from episode_pipeline.video.probe import probe
from episode_pipeline.video.storyboard import plan_storyboard

NAME = "hls"
WIDTH, HEIGHT, FPS = 640, 480, 30
TARGET_CPU_RATIO = 1.5
TARGET_WALL_RATIO = 1.1  # issue 11: the transcode step vs bare FFmpeg
TARGET_STORYBOARD_RATIO = 1.05  # issue 35: the storyboard branch vs the same pass without it


def _sizes(quick: bool) -> dict[str, Any]:
    """Cameras and seconds for the episode figure; the CPU figure encodes its first camera."""
    if quick:
        return {"cameras": 1, "episode_seconds": 2.0}
    return {"cameras": 3, "episode_seconds": 10.0}


def _camera_videos(workdir: Path, cameras: int, seconds: float) -> list[Path]:
    """One AV1 640x480 mp4 per camera, written by the sample writer (v3.0 layout)."""
    spec = SampleSpec(
        codebase_version="v3.0",
        codec="av1",
        cameras=cameras,
        seconds=seconds,
        fps=FPS,
        width=WIDTH,
        height=HEIGHT,
    )
    root = workdir / f"dataset-{cameras}x{seconds:g}s"
    write_dataset(root, spec)
    return sorted(root.glob("videos/*/chunk-*/*.mp4"))


# One FFmpeg invocation of a benchmark camera takes seconds; a hung one ends the stage, named.
FFMPEG_TIMEOUT_SECONDS = 600


def _command(
    source: Path, out_dir: Path, ladder: tuple[str, ...], poster: bool, storyboard: bool = False
) -> list[str]:
    """The transcode's FFmpeg invocation for one camera (`ladder=()`: today's single rendition;
    `storyboard`: with the sprite, as the transcode program plans it from the probe)."""
    video = VideoSettings(ladder=ladder)
    probed = probe(source)
    board = (
        plan_storyboard(probed.duration_ms / 1000, probed.fps, probed.width, probed.height)
        if storyboard
        else None
    )
    return camera_command(video, source, out_dir, probed, poster=poster, storyboard=board)[1]


def _ffmpeg_cpu(command: list[str], out_dir: Path) -> float:
    """CPU seconds (user + system) of one FFmpeg run, from this process's reaped children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, check=True, capture_output=True, timeout=FFMPEG_TIMEOUT_SECONDS)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(out_dir, ignore_errors=True)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _cpu_result(
    metric: str,
    ours: list[float],
    base: list[float],
    baseline_name: str,
    details: dict[str, Any],
    target: float,
    target_text: str,
) -> Result:
    """A CPU-seconds figure of two FFmpeg commands run interleaved on the same source."""
    result = Result(
        stage=NAME,
        metric=metric,
        ours=round(median(ours), 3),
        baseline=round(median(base), 3),
        unit="cpu s",
        better="lower",
        repeats=len(ours),
        details=details,
        baseline_name=baseline_name,
        ours_samples=[round(s, 3) for s in ours],
        baseline_samples=[round(s, 3) for s in base],
    )
    return result.expect_factor(1 / target, target_text)


def _source_label(source: Path) -> str:
    return f"{WIDTH}x{HEIGHT} {FPS} fps AV1, {probe(source).duration_ms / 1000:g} s"


def ladder_cpu(ctx: BenchContext, source: Path, ladder: tuple[str, ...]) -> Result:
    scratch = ctx.workdir / "ladder-cpu"

    def run(rungs: tuple[str, ...], poster: bool) -> float:
        out = scratch / uuid.uuid4().hex[:8]
        return _ffmpeg_cpu(_command(source, out, rungs, poster), out)

    ours, base = median_of(ctx.config.repeats, lambda: run(ladder, True), lambda: run((), False))
    renditions = plan_renditions(WIDTH, HEIGHT, FPS, ladder)
    details = {
        "source": _source_label(source),
        "ladder": ",".join(ladder),
        "renditions": [f"{r.name} {r.resolution} {r.profile}" for r in renditions],
        "preset": VideoSettings().preset,
    }
    return _cpu_result(
        "ladder_cpu",
        ours,
        base,
        "today's single baseline rendition",
        details,
        TARGET_CPU_RATIO,
        f"<= {TARGET_CPU_RATIO}x today's CPU",
    )


def storyboard_cpu(ctx: BenchContext, source: Path, ladder: tuple[str, ...]) -> Result:
    scratch = ctx.workdir / "storyboard-cpu"

    def run(storyboard: bool) -> float:
        out = scratch / uuid.uuid4().hex[:8]
        return _ffmpeg_cpu(_command(source, out, ladder, True, storyboard=storyboard), out)

    ours, base = median_of(ctx.config.repeats, lambda: run(True), lambda: run(False))
    probed = probe(source)
    board = plan_storyboard(probed.duration_ms / 1000, probed.fps, probed.width, probed.height)
    details = {
        "source": _source_label(source),
        "storyboard": f"{board.tiles} tiles of {board.tile_width}x{board.tile_height}, "
        f"one every {board.interval} s",
    }
    return _cpu_result(
        "storyboard_cpu",
        ours,
        base,
        "the same invocation without the storyboard",
        details,
        TARGET_STORYBOARD_RATIO,
        f"<= {TARGET_STORYBOARD_RATIO}x without it",
    )


def transcode_wall(ctx: BenchContext, videos: list[Path], ladder: tuple[str, ...]) -> Result:
    info = ctx.stack()
    bucket = Bucket(info.bucket, AwsSettings.from_env(info.env))
    ref = EpisodeRef("bench-org", f"hls-{uuid.uuid4().hex[:8]}")
    cameras = []
    for index, video in enumerate(videos):
        key = f"{ref.processed_prefix}videos/cam{index}/file-000.mp4"
        bucket.upload_file(video, key)
        cameras.append(CameraJob(f"cam{index}", [key], ref.hls_prefix(f"cam{index}")))
    job = TranscodeJob(bucket=bucket.name, cameras=cameras, video=VideoSettings(ladder=ladder))

    def ours() -> float:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=ctx.workdir) as tmp:
            results = run_episode(job, bucket, Path(tmp), report=lambda _: None, log=lambda _: None)
        elapsed = time.perf_counter() - started
        failed = [f.error for r in results for f in r.failed]
        if failed:
            raise RuntimeError(f"{NAME}: the transcode failed: {failed[:3]}")
        return elapsed

    def bare() -> float:
        started = time.perf_counter()
        for video in videos:
            out = ctx.workdir / "bare" / uuid.uuid4().hex[:8]
            command = _command(video, out, ladder, True, storyboard=True)
            subprocess.run(command, check=True, capture_output=True, timeout=FFMPEG_TIMEOUT_SECONDS)
            shutil.rmtree(out, ignore_errors=True)
        return time.perf_counter() - started

    ours_s, base_s = median_of(ctx.config.repeats, ours, bare)
    bucket.delete_prefix(ref.prefix)
    return seconds_result(
        NAME,
        "transcode_wall",
        ours_s,
        base_s,
        baseline_name="bare FFmpeg, the same commands, cameras one after another",
        details={"cameras": len(videos), "seconds_per_camera": probe(videos[0]).duration_ms / 1000},
    ).expect_factor(1 / TARGET_WALL_RATIO, f"<= {TARGET_WALL_RATIO}x bare FFmpeg")


def run(ctx: BenchContext) -> list[Result]:
    sizes = _sizes(ctx.config.quick)
    ladder = VideoSettings().ladder  # the default, as production runs it
    with ctx.phase("set-up: sources"):
        episode = _camera_videos(ctx.workdir, sizes["cameras"], sizes["episode_seconds"])
    ladder_source = episode[0]
    with ctx.phase("ladder"):
        ladder_result = ladder_cpu(ctx, ladder_source, ladder)
    with ctx.phase("storyboard"):
        storyboard_result = storyboard_cpu(ctx, ladder_source, ladder)
    with ctx.phase("transcode"):
        return [ladder_result, storyboard_result, transcode_wall(ctx, episode, ladder)]
