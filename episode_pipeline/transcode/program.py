"""The transcode program: an episode's cameras from S3 → FFmpeg → checked HLS renditions → S3.

Runs as `python -m episode_pipeline.transcode` under Dagster Pipes: the job (every camera of one
episode) comes in the Pipes extras, and each camera's result goes back as a custom message as
soon as that camera is done. Every camera starts at once (download, probe); their FFmpegs run up
to the CPUs this process may use at a time (or TRANSCODE_CAMERA_WORKERS), so a waiting camera's
download and probe overlap the others' encodes and its FFmpeg starts the moment a slot frees.
The bucket is in the job; the S3 endpoint and credentials come from the environment (the
parent's resource locally; the task role on AWS). This module imports `dagster_pipes` and the
core only, never `dagster`: it starts in a fraction of the time.

Per camera:
1. the old objects under `hls/<camera>/` are deleted, so nothing of an earlier run mixes in;
2. every source is downloaded, then all are probed in one PyAV child under a deadline;
3. when an FFmpeg slot is free, one FFmpeg invocation (under a deadline, killed with its process
   group when late) writes every rendition and the poster; finished segments are uploaded while
   it runs;
4. each rendition's playlist is checked, the master is written from what was made (peak
   bandwidth, codecs from the stream), the poster and the playlists go up, the master last.

Outcomes: a source that cannot be downloaded or probed is left out and reported; FFmpeg failing
or running late, a bad playlist or an upload failing ends that camera alone: it is reported
failed, its folder is emptied (what S3 holds always matches the latest run), and the other
cameras go on. The program exits 0 unless it cannot do or report its job at all (bad extras):
then Pipes reports the exception and the process exits non-zero.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import Any

from episode_pipeline.config.settings import AwsSettings, VideoSettings
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.transcode.job import (
    CameraJob,
    FailedVideo,
    RenditionResult,
    SourceVideo,
    TranscodeJob,
    TranscodeResult,
)
from episode_pipeline.transcode.uploads import SegmentUploader
from episode_pipeline.video import ffmpeg_exe
from episode_pipeline.video.hls import (
    POSTER_NAME,
    SEGMENT_SECONDS,
    EncodeSettings,
    Rendition,
    concat_list,
    hls_command,
)
from episode_pipeline.video.ladder import (
    AAC_LC,
    MASTER_NAME,
    VariantStream,
    avc1_codec,
    average_bandwidth,
    master_playlist,
    peak_bandwidth,
    plan_renditions,
)
from episode_pipeline.video.playlist import PlaylistError, check_playlist, parse_playlist
from episode_pipeline.video.probe import VideoProbe, probe_files
from episode_pipeline.video.process import (
    DeadlineExceeded,
    available_cpus,
    kill_running_children,
    run_with_deadline,
)

STDERR_TAIL = 2000
SPS_SEARCH_BYTES = 64 * 1024

Log = Callable[[str], Any]


class TranscodeError(RuntimeError):
    """FFmpeg failed, or wrote a rendition that breaks the contract."""


def fetch_sources(
    job: TranscodeJob, camera: CameraJob, bucket: Bucket, workdir: Path, log: Log
) -> tuple[list[tuple[Path, SourceVideo]], list[FailedVideo]]:
    """Download every source, then probe them all; unreadable ones are failures, in order."""
    downloaded: list[tuple[str, Path]] = []
    failed: list[FailedVideo] = []

    def fail(key: str, detail: str) -> None:
        message = f"s3://{job.bucket}/{key}: {detail}"
        log(f"skipping {message}")
        failed.append(FailedVideo(key=key, error=message))

    for index, key in enumerate(camera.sources):
        local = workdir / f"source_{index:04d}.mp4"
        try:
            bucket.download_file(key, local)
        except Exception as error:
            fail(key, f"download failed: {error}")
            continue
        downloaded.append((key, local))
    probes = probe_files([local for _, local in downloaded], job.video.probe_deadline_seconds)
    usable: list[tuple[Path, SourceVideo]] = []
    for (key, local), probed in zip(downloaded, probes, strict=True):
        if isinstance(probed, VideoProbe):
            usable.append((local, SourceVideo(key=key, probe=probed)))
        else:
            fail(key, str(probed).replace(f"{local}: ", "") or type(probed).__name__)
    return usable, failed


def camera_command(
    video: VideoSettings,
    source: Path,
    out_dir: Path,
    first: VideoProbe,
    *,
    segment_seconds: int = SEGMENT_SECONDS,
    has_audio: bool = False,
    concat: bool = False,
    poster: bool = True,
) -> tuple[list[Rendition], list[str]]:
    """The renditions a camera gets (from its first source's probe) and the one FFmpeg
    invocation writing them and the poster under `out_dir`, their folders made. The transcode
    runs it; the benchmarks run it bare, so both sides of a comparison share one command."""
    baseline = EncodeSettings(segment_seconds=segment_seconds, preset=video.preset)
    renditions = plan_renditions(
        first.width,
        first.height,
        first.fps,
        video.ladder,
        baseline=baseline,
        ladder_preset=video.ladder_preset,
    )
    for rendition in renditions:
        (out_dir / rendition.folder).mkdir(parents=True, exist_ok=True)
    command = hls_command(
        video.ffmpeg or ffmpeg_exe(),
        source,
        out_dir,
        renditions,
        source_width=first.width,
        source_height=first.height,
        source_fps=first.fps,
        has_audio=has_audio,
        concat=concat,
        poster=poster,
        settings=baseline,
    )
    return renditions, command


def ffmpeg_input(sources: list[tuple[Path, SourceVideo]], workdir: Path) -> tuple[Path, bool]:
    """What FFmpeg reads: the one mp4, or an ffconcat list playing several back to back."""
    if len(sources) == 1:
        return sources[0][0], False
    listing = workdir / "sources.ffconcat"
    listing.write_text(concat_list([path.name for path, _ in sources]))
    return listing, True


def encode(
    job: TranscodeJob,
    camera: CameraJob,
    sources: list[tuple[Path, SourceVideo]],
    command: list[str],
) -> float:
    """Run the camera's one FFmpeg invocation under its deadline; returns FFmpeg's wall time."""
    source_seconds = sum(s.probe.duration_ms for _, s in sources) / 1000
    started = time.monotonic()
    done = run_with_deadline(
        command,
        job.video.ffmpeg_deadline(source_seconds),
        what=f"ffmpeg for camera {camera.camera}",
    )
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise TranscodeError(
            f"ffmpeg exited {done.returncode} for camera {camera.camera}: "
            f"{done.stderr.strip()[-STDERR_TAIL:]}"
        )
    return elapsed


def describe_rendition(
    job: TranscodeJob, camera: CameraJob, rendition: Rendition, out_dir: Path, has_audio: bool
) -> tuple[RenditionResult, VariantStream, set[str]]:
    """Check one written rendition and measure what the master says about it; also the keys
    of the segments its playlist lists."""
    folder = out_dir / rendition.folder
    path = out_dir / rendition.playlist
    playlist = parse_playlist(path.read_text(), source=f"{camera.camera}/{rendition.playlist}")
    problems = check_playlist(playlist, os.listdir(folder), segment_seconds=job.segment_seconds)
    if problems:
        raise TranscodeError(
            f"camera {camera.camera}: bad playlist {rendition.playlist}: {'; '.join(problems)}"
        )
    sizes = [((folder / s.uri).stat().st_size, s.duration) for s in playlist.segments]
    with (folder / playlist.segments[0].uri).open("rb") as first_segment:
        codecs = avc1_codec(first_segment.read(SPS_SEARCH_BYTES))
    if has_audio:
        codecs += f",{AAC_LC}"
    result = RenditionResult(
        name=rendition.name,
        playlist_key=camera.output_prefix + rendition.playlist,
        width=rendition.width,
        height=rendition.height,
        fps=rendition.fps,
        codecs=codecs,
        bandwidth=peak_bandwidth(sizes, job.segment_seconds),
        average_bandwidth=average_bandwidth(sizes),
        segments=len(playlist.segments),
        seconds=round(playlist.seconds, 3),
    )
    variant = VariantStream(
        uri=rendition.playlist,
        bandwidth=result.bandwidth,
        average_bandwidth=result.average_bandwidth,
        width=rendition.width,
        height=rendition.height,
        fps=rendition.fps,
        codecs=codecs,
    )
    keys = {f"{camera.output_prefix}{rendition.folder}{s.uri}" for s in playlist.segments}
    return result, variant, keys


def publish(
    job: TranscodeJob,
    camera: CameraJob,
    sources: list[tuple[Path, SourceVideo]],
    bucket: Bucket,
    workdir: Path,
    ffmpeg_slots: threading.Semaphore,
) -> tuple[list[RenditionResult], float]:
    """Encode in a free FFmpeg slot, upload segments as they come, check, then the poster,
    playlists and master (the slot is already free for the next camera by then)."""
    out_dir = workdir / "hls"
    source, concat = ffmpeg_input(sources, workdir)
    has_audio = all(s.probe.has_audio for _, s in sources)
    renditions, command = camera_command(
        job.video,
        source,
        out_dir,
        sources[0][1].probe,
        segment_seconds=job.segment_seconds,
        has_audio=has_audio,
        concat=concat,
    )
    with SegmentUploader(
        bucket, out_dir, camera.output_prefix, [r.folder for r in renditions]
    ) as uploader:
        with ffmpeg_slots:
            ffmpeg_seconds = encode(job, camera, sources, command)
        uploaded = uploader.finish()
    described = [describe_rendition(job, camera, r, out_dir, has_audio) for r in renditions]
    listed = set().union(*(keys for _, _, keys in described))
    if listed - uploaded:
        raise TranscodeError(
            f"camera {camera.camera}: segments not uploaded: {sorted(listed - uploaded)[:5]}"
        )
    (out_dir / MASTER_NAME).write_text(master_playlist([variant for _, variant, _ in described]))
    # Last: the poster, the ladder's playlists, the baseline the application plays, the master.
    finals = [POSTER_NAME, *[r.playlist for r in renditions if not r.is_baseline]]
    finals += [renditions[0].playlist, MASTER_NAME]
    for name in finals:
        bucket.upload_file(out_dir / name, camera.output_prefix + name)
    return [result for result, _, _ in described], ffmpeg_seconds


def run_camera(
    job: TranscodeJob,
    camera: CameraJob,
    bucket: Bucket,
    workdir: Path,
    log: Log,
    ffmpeg_slots: threading.Semaphore,
) -> TranscodeResult:
    """Do one camera in `workdir`, its FFmpeg in one of `ffmpeg_slots`; see the module docstring
    for what fails how."""
    started = time.time()
    workdir.mkdir(parents=True)
    bucket.delete_prefix(camera.output_prefix)
    sources, failed = fetch_sources(job, camera, bucket, workdir, log)
    result = TranscodeResult(
        camera=camera.camera,
        playlist_key=None,
        sources=[s for _, s in sources],
        failed=failed,
        error=None if sources else "no usable source",
        started_at=started,
    )
    if sources:
        try:
            renditions, ffmpeg_seconds = publish(
                job, camera, sources, bucket, workdir, ffmpeg_slots
            )
        except (TranscodeError, DeadlineExceeded, PlaylistError, OSError, ValueError) as error:
            log(f"camera {camera.camera}: {error}")
            bucket.delete_prefix(camera.output_prefix)
            result = replace(result, error=str(error))
        else:
            result = replace(
                result,
                playlist_key=renditions[0].playlist_key,
                master_key=camera.output_prefix + MASTER_NAME,
                poster_key=camera.output_prefix + POSTER_NAME,
                renditions=renditions,
                seconds=renditions[0].seconds,
                ffmpeg_seconds=round(ffmpeg_seconds, 3),
            )
    return replace(result, finished_at=time.time())


def run_episode(
    job: TranscodeJob,
    bucket: Bucket,
    workdir: Path,
    report: Callable[[TranscodeResult], Any],
    log: Log,
) -> list[TranscodeResult]:
    """Every camera of the job at once, FFmpeg up to the CPUs at a time; `report` gets each
    camera as it finishes.

    A camera waits for its FFmpeg slot after its download and probe, not before: with more
    cameras than CPUs the next camera's fetch (a probe child, 0.3-2 s with the cores busy) no
    longer sits between one FFmpeg's end and the next one's start. A camera that fails in a way
    `run_camera` does not foresee (an S3 error) is reported failed with that error; the others
    go on.
    """
    slots = threading.BoundedSemaphore(max(1, job.video.camera_workers or available_cpus()))
    results = []
    cameras = max(1, len(job.cameras))
    with ThreadPoolExecutor(max_workers=cameras, thread_name_prefix="camera") as pool:
        futures = {
            # A camera name is one path component (docs/contract.md#camera-names).
            pool.submit(
                run_camera, job, camera, bucket, workdir / f"{i:03d}-{camera.camera}", log, slots
            ): camera
            for i, camera in enumerate(job.cameras)
        }
        for future in as_completed(futures):
            camera = futures[future]
            try:
                result = future.result()
            except Exception as error:
                log(f"camera {camera.camera}: transcode failed: {error}")
                result = TranscodeResult(
                    camera=camera.camera, playlist_key=None, error=f"transcode failed: {error}"
                )
            report(result)
            results.append(result)
    return results


def main() -> int:
    """The Pipes entry point: read the job, do it, report each camera."""
    from dagster_pipes import open_dagster_pipes

    # Stopped (the step's deadline, a cancelled run): FFmpeg runs in sessions of its own, out of
    # reach of a signal to this process's group, so end them before going; `os._exit` skips
    # the `with` below, so the scratch folder goes here too.
    scratch: list[str] = []

    def stop(signum: int, frame: Any) -> None:
        kill_running_children()
        for folder in scratch:
            shutil.rmtree(folder, ignore_errors=True)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    with open_dagster_pipes() as pipes:
        job = TranscodeJob.from_extras(pipes.extras)
        lock = threading.Lock()  # Pipes writes one message at a time; cameras run in threads

        def log(message: str) -> None:
            with lock:
                pipes.log.warning(message)

        def report(result: TranscodeResult) -> None:
            with lock:
                pipes.report_custom_message(result.to_message())
                pipes.log.info(
                    f"camera {result.camera}: {len(result.renditions)} rendition(s), "
                    f"{result.segments} segment(s), {result.seconds} s, ffmpeg "
                    f"{result.ffmpeg_seconds} s, {len(result.failed)} failed source(s)"
                )

        pipes.log.info(
            f"transcoding {len(job.cameras)} camera(s) on {available_cpus()} CPU(s): "
            + ", ".join(f"{c.camera} ({len(c.sources)} source(s))" for c in job.cameras)
        )
        # The environment names the S3 endpoint and keys: the parent's locally, the task role's
        # on ECS.
        bucket = Bucket(job.bucket, AwsSettings.from_env(os.environ))
        with tempfile.TemporaryDirectory(prefix="transcode-") as tmp:
            scratch.append(tmp)
            run_episode(job, bucket, Path(tmp), report, log)
    return 0
