"""Stage `end_to_end`: a 3-camera 60-second episode from upload to `processed`, as in production.

The episode is uploaded as a robot does (episode row, then the object); the bucket notification
queues the S3 event; the Dagster daemon ticks the SQS sensor, which requests a run; the run
queue launches it (a run worker process); the run extracts, transcodes, loads the frames and
marks the episode `processed`. Timed from the start of the upload to the moment the episode row
says `processed`, and split with the run record and its events:

- sensor: upload start → the run exists (S3 event, queue, sensor interval, tick);
- launch: the run exists → it started (run queue, run worker process start, code load);
- the steps' work until `processed` (STEP_SUCCESS durations), and Dagster's overhead around
  them, up to the moment the row reads `processed` (polled every 0.2 s);
- within `hls_renditions` (`transcode_split_s`): until the transcode program started, until its
  first FFmpeg, the cameras' FFmpeg span, and after the last camera; and the CPU seconds each
  kind of process used during the step (`cpu_during_transcode_s`: FFmpeg, or the daemon, code
  server, run worker, moto... around it), from /proc sampled every second.

Limit: the sum of the stage limits, measured in the same run on the same episode: S3 alone for
extraction (its kept members uploaded from the page cache, no decompression), bare FFmpeg for
the transcode (every camera at once), the server's own COPY of the frame rows. The daemon works on
a stack of its own (never a shared one: it would act on that stack's queue and runs).
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from benchmarks.common import (
    BenchContext,
    Result,
    median,
    private_stack,
    run_child,
    seconds_result,
)
from episode_pipeline.episodes.keys import EpisodeRef

NAME = "end_to_end"
TARGET_FACTOR = 1.3
POLL_SECONDS = 0.2
DEADLINE_SECONDS = 900
HLS_STEP = "hls_renditions"
CAMERA_DONE = re.compile(r"^camera \S+: .* ffmpeg ([0-9.]+) s")  # the transcode's per-camera log
CPU_SAMPLE_SECONDS = 1.0  # one sample costs ~9 ms of CPU
# Who a process is, by its command line, first match wins (the rest of the machine: `other`).
PROCESS_KINDS = (
    ("ffmpeg", "ffmpeg"),
    ("episode_pipeline.video.probe", "probe child"),
    ("episode_pipeline.transcode", "transcode program"),
    ("dagster-daemon", "daemon"),
    ("dagster api grpc", "code server"),
    ("dagster code-server", "code server"),
    ("multiprocessing", "run worker"),
    ("dagster api execute_run", "run worker"),
    ("moto", "moto"),
    ("postgres", "postgres"),
    ("benchmarks", "benchmark"),
)


@contextmanager
def daemon(info: Any, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`dagster-daemon run` on the stack (as `episode-pipeline demo` runs it)."""
    from episode_pipeline.local.dev import SHUTDOWN_GRACE_SECONDS, WORKSPACE_FILE

    executable = Path(sys.executable).parent / "dagster-daemon"
    command = [str(executable), "run", "-w", str(WORKSPACE_FILE)]
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            command, env={**os.environ, **info.env}, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(SHUTDOWN_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_daemon(instance: Any, process: subprocess.Popen[bytes], log: Path) -> None:
    """Until the daemon's sensor loop has sent a heartbeat (it ticks sensors from then on)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{NAME}: the daemon exited: {log.read_text()[-2000:]}")
        if "SENSOR" in instance.get_daemon_heartbeats():
            return
        time.sleep(0.5)
    raise RuntimeError(f"{NAME}: no sensor daemon heartbeat within 120 s ({log})")


def upload_and_wait(settings: Any, archive: Path, ref: EpisodeRef) -> tuple[float, float]:
    """Upload like a robot; returns (upload start, `processed` seen), both time.time()."""
    from episode_pipeline.db.connection import connect
    from episode_pipeline.db.episodes import episode_row
    from episode_pipeline.local.upload import upload_episode

    started = time.time()
    upload_episode(archive, ref, settings)
    deadline = time.monotonic() + DEADLINE_SECONDS
    with connect(settings.database, autocommit=True) as conn:
        while time.monotonic() < deadline:
            status = (episode_row(conn, ref) or {}).get("status")
            if status == "processed":
                return started, time.time()
            if status == "failed":
                raise RuntimeError(f"{NAME}: {ref} failed; see `episode-pipeline status {ref}`")
            time.sleep(POLL_SECONDS)
    raise RuntimeError(f"{NAME}: {ref} not processed within {DEADLINE_SECONDS} s")


def breakdown(instance: Any, ref: EpisodeRef, started: float, done: float) -> dict[str, Any]:
    """Where the time from upload to `processed` went, from the run record and its events.

    The run goes on after the row says `processed` (the metadata step and its check): those
    steps are listed but not counted in the split of the time to `processed`.
    """
    from dagster import RunsFilter

    from episode_pipeline.instance.run_tags import PARTITION_TAG

    runs = RunsFilter(tags={PARTITION_TAG: ref.partition_key})
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        [record] = instance.get_run_records(runs, limit=1)
        if record.end_time is not None or time.monotonic() > deadline:
            break
        time.sleep(POLL_SECONDS)
    steps: dict[str, float] = {}
    before_processed = 0.0
    for entry in instance.all_logs(record.dagster_run.run_id):
        event = entry.dagster_event
        if event is not None and event.event_type_value == "STEP_SUCCESS":
            seconds = event.event_specific_data.duration_ms / 1000
            steps[entry.step_key or "?"] = seconds
            if entry.timestamp - seconds < done:
                before_processed += min(seconds, done - (entry.timestamp - seconds))
    created = record.create_timestamp.timestamp()
    run_started = record.start_time or created
    return {
        "transcode": transcode_split(instance, record.dagster_run.run_id),
        "total": done - started,
        "sensor": created - started,
        "launch": run_started - created,
        "steps_before_processed": before_processed,
        "dagster_overhead": (done - run_started) - before_processed,
        "steps": steps,
    }


class CpuSampler:
    """Every process's CPU time, sampled from /proc every second on a thread, so that a window
    (the transcode step) can be charged to who used the 2 cores: FFmpeg, or the processes
    around it. A process living less than one interval between samples is missed; kinds go by
    command line, so another run's processes of the same kinds on the machine count too."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, dict[int, tuple[str, float]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._kinds: dict[tuple[int, str], str] = {}  # (pid, start time) → kind

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), self._read()))
            self._stop.wait(CPU_SAMPLE_SECONDS)

    def _read(self) -> dict[int, tuple[str, float]]:
        found = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text()
                fields = stat[stat.rfind(")") + 2 :].split()
                key = (int(entry.name), fields[19])  # a pid and its start time: one process
                if key not in self._kinds:
                    command = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ")
                    self._kinds[key] = process_kind(command.decode(errors="replace"))
            except OSError:
                continue
            seconds = (int(fields[11]) + int(fields[12])) / self._ticks  # utime + stime
            found[key[0]] = (self._kinds[key], seconds)
        return found

    def cpu_by_kind(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds each kind of process used between `start` and `end` (time.time())."""
        used: Counter[str] = Counter()
        window = [s for s in self.samples if start <= s[0] <= end]
        for (_, before), (_, after) in itertools.pairwise(window):
            for pid, (kind, seconds) in after.items():
                earlier = before.get(pid)
                used[kind] += seconds - (earlier[1] if earlier and earlier[0] == kind else 0.0)
        return {kind: round(seconds, 2) for kind, seconds in used.most_common()}


def process_kind(command: str) -> str:
    return next((kind for pattern, kind in PROCESS_KINDS if pattern in command), "other")


def transcode_split(instance: Any, run_id: str) -> dict[str, float]:
    """The `hls_renditions` step from its events and the transcode's logs: until the program
    said it started, the cameras' FFmpeg span (first start to last end, each camera's start
    being its end less its FFmpeg seconds), and after the last camera until the step's end."""
    start = end = ready = None
    cameras: list[tuple[float, float]] = []  # (logged at, ffmpeg seconds)
    for entry in instance.all_logs(run_id):
        if entry.step_key != HLS_STEP:
            continue
        event = entry.dagster_event
        kind = event.event_type_value if event is not None else None
        if kind == "STEP_START":
            start = entry.timestamp
        elif kind == "STEP_SUCCESS":
            end = entry.timestamp
        elif entry.user_message.startswith("transcoding ") and ready is None:
            ready = entry.timestamp
        elif match := CAMERA_DONE.match(entry.user_message):
            cameras.append((entry.timestamp, float(match[1])))
    if start is None or end is None or ready is None or not cameras:
        return {}
    first_ffmpeg = min(done - ffmpeg for done, ffmpeg in cameras)
    last_done = max(done for done, _ in cameras)
    return {
        "step": end - start,
        "to_program_start": ready - start,
        "program_start_to_first_ffmpeg": first_ffmpeg - ready,
        "ffmpeg_span": last_done - first_ffmpeg,
        "after_last_camera": end - last_done,
        "window": (start, end),  # dropped from the details; for the CPU sampler
    }


def stage_limits(ctx: BenchContext, info: Any, archive: Path, sample: dict[str, Any]) -> dict:
    """The machine's limit for each stage on this episode, in seconds."""
    from benchmarks import extraction, frames_load

    env = {**os.environ, **info.env}
    with extraction.bench_bucket(info) as bucket:
        key = extraction.upload_archive(bucket, archive)
        scratch = ctx.workdir / "e2e-limits"
        scratch.mkdir(parents=True, exist_ok=True)
        old = run_child(extraction.NAME_MODULE, ["old", bucket.name, key, str(scratch)], env=env)
    limits = {"extraction_s3": old["upload_seconds"]}
    limits["transcode_ffmpeg"] = transcode_limit(ctx, archive)
    limits["frames_copy"] = frames_load.copy_limit_seconds(info, archive, scratch)
    return limits


def transcode_limit(ctx: BenchContext, archive: Path) -> float:
    """Bare FFmpeg with the pipeline's commands, every camera at once (as the transcode runs
    them), on the episode's mp4s already on local disk: no S3, no probe child, no checks."""
    from benchmarks.hls import _command as transcode_command
    from episode_pipeline.archive.stream import ArchiveReader
    from episode_pipeline.config.settings import VideoSettings

    folder = ctx.workdir / "e2e-ffmpeg" / uuid.uuid4().hex[:8]
    videos = []
    with archive.open("rb") as raw:
        for member in ArchiveReader(raw, name=str(archive)):
            if member.path.endswith(".mp4"):
                target = folder / "in" / f"{len(videos)}.mp4"
                target.parent.mkdir(parents=True, exist_ok=True)
                with target.open("wb") as handle:
                    shutil.copyfileobj(member.fileobj, handle, 1 << 20)
                videos.append(target)
    ladder = VideoSettings().ladder
    commands = [
        transcode_command(video, folder / "out" / video.stem, ladder, True) for video in videos
    ]
    started = time.perf_counter()
    running = [
        subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for c in commands
    ]
    if any(process.wait() != 0 for process in running):
        raise RuntimeError(f"{NAME}: bare FFmpeg failed on {archive}")
    seconds = time.perf_counter() - started
    shutil.rmtree(folder, ignore_errors=True)
    return seconds


def medians(dicts: list[dict[str, float]]) -> dict[str, float]:
    """Key by key, the median over the repeats (a key missing in one counts as 0)."""
    keys = dict.fromkeys(key for d in dicts for key in d)
    return {key: round(median([d.get(key, 0.0) for d in dicts]), 3) for key in keys}


def run(ctx: BenchContext) -> list[Result]:
    from dagster import DagsterInstance

    from episode_pipeline.config.settings import Settings
    from episode_pipeline.samples.writer import SampleSpec, write_sample

    config = ctx.config
    folder = ctx.workdir / "e2e"
    folder.mkdir(parents=True, exist_ok=True)
    spec = SampleSpec(
        cameras=config.e2e_cameras,
        seconds=config.e2e_seconds,
        width=config.e2e_width,
        height=config.e2e_height,
    )
    archive = folder / "episode.tar.zst"
    parts: list[dict[str, Any]] = []
    limits: list[dict[str, float]] = []
    with ExitStack() as on_stack, ExitStack() as with_daemon:
        # The sample's encodes (FFmpeg) overlap the stack's and the daemon's start (waiting).
        with ctx.phase("set-up: sample, stack, daemon"), ThreadPoolExecutor(1) as pool:
            writing = pool.submit(write_sample, archive, spec)
            info = on_stack.enter_context(private_stack(ctx, "e2e-stack-home"))
            settings = Settings.from_env(info.env)
            log = folder / "daemon.log"
            process = with_daemon.enter_context(daemon(info, log))
            instance = with_daemon.enter_context(
                DagsterInstance.from_config(info.env["DAGSTER_HOME"])
            )
            wait_for_daemon(instance, process, log)
            sample = writing.result()
        with CpuSampler() as sampler, ctx.phase("ours: upload to processed"):
            for _ in range(config.repeats):
                ref = EpisodeRef("bench-e2e", f"ep-{uuid.uuid4().hex[:8]}")
                started, done = upload_and_wait(settings, archive, ref)
                parts.append(breakdown(instance, ref, started, done))
        for part in parts:
            window = part["transcode"].pop("window", None)
            part["cpu"] = sampler.cpu_by_kind(*window) if window else {}
        with_daemon.close()  # the daemon stops before the limits use the stack
        with ctx.phase("limits"):
            for _ in range(config.repeats):
                limits.append(stage_limits(ctx, info, archive, sample))
    totals = [p["total"] for p in parts]
    sums = [sum(limit.values()) for limit in limits]
    details = {
        "episode": f"{spec.cameras} cameras, {spec.seconds:g} s, {spec.width}x{spec.height} "
        f"H.264, {sample['archive_bytes'] / (1 << 20):.1f} MiB archive",
        "breakdown_s": {
            key: round(median([p[key] for p in parts]), 3)
            for key in ("sensor", "launch", "steps_before_processed", "dagster_overhead")
        },
        "steps_s": {
            key: round(median([p["steps"].get(key, 0.0) for p in parts]), 3)
            for key in parts[0]["steps"]
        },
        "limits_s": {key: round(median([lim[key] for lim in limits]), 3) for key in limits[0]},
        # hls_renditions' own split, and the CPU seconds each kind of process used meanwhile
        "transcode_split_s": medians([p["transcode"] for p in parts]),
        "cpu_during_transcode_s": medians([p["cpu"] for p in parts]),
    }
    return [
        seconds_result(
            NAME, "upload_to_processed", totals, sums,
            baseline_name="limit: the sum of the stage limits (S3, FFmpeg, COPY)",
            details=details,
        ).expect_factor(1 / TARGET_FACTOR, f"≤ {TARGET_FACTOR}x the sum of the stage limits")
    ]  # fmt: skip
