"""The transcode program: an episode's cameras from S3 → FFmpeg → checked HLS renditions → S3.

Runs as `python -m episode_pipeline.transcode` under Dagster Pipes: the job (every camera of one
episode) comes in the Pipes extras, and each camera's result goes back as a custom message as
soon as that camera is done. Every camera starts at once (download, probe); their FFmpegs run up
to the CPUs this process may use at a time (or TRANSCODE_CAMERA_WORKERS), so a waiting camera's
download and probe overlap the others' encodes and its FFmpeg starts the moment a slot frees.
The bucket is in the job; the S3 endpoint and credentials come from the environment (the
parent's resource locally; the task role on AWS). This module imports `dagster_pipes` and the
core only, never `dagster`: it starts in a fraction of the time.

Per camera (nothing is deleted first: an earlier run's video stays whole until this one's
replaces it, docs/contract.md#hls-renditions, "Upload order"):
1. every source is downloaded, then all are probed in one PyAV child under a deadline;
2. when an FFmpeg slot is free, one FFmpeg invocation (under a deadline, killed with its process
   group when late) writes every rendition, the poster and the storyboard sprite; finished
   segments are uploaded while it runs, over the same names (`segment_%05d.ts`) an earlier run
   used;
3. each rendition's playlist is checked, the master is written from what was made (peak
   bandwidth, codecs from the stream), the storyboard's VTT is computed from its plan, the
   poster, the storyboard and the playlists go up, the master last;
4. only then are the objects under `hls/<camera>/` this run did not write deleted (a longer
   earlier upload's extra segments, a rung no longer made).

Outcomes (`job.describe_failure`): a source that cannot be probed is left out and reported.
The file's own bad content — FFmpeg failing or running past its deadline, no source probing, a
bad playlist — ends that camera alone: it is reported failed (`content`), its folder is emptied
(what S3 holds always matches the latest upload), and the other cameras go on. Anything else —
an S3 call failing once botocore's retries ran out (a download included), the local disk, an
error nobody foresaw — is reported `infrastructure` with the S3 key, the error code and the
`Retry-After` S3 sent, and nothing of the camera is removed: the asset fails the step, which is
retried. The program exits 0 unless it cannot do or report its job at all (bad extras): then
Pipes reports the exception and the process exits non-zero.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from episode_pipeline.config.settings import AwsSettings, VideoSettings
from episode_pipeline.storage.aws import aws_fault
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.transcode.job import (
    CONTENT,
    CameraJob,
    FailedVideo,
    RenditionResult,
    SourceVideo,
    StoryboardFacts,
    TranscodeError,
    TranscodeJob,
    TranscodeResult,
    describe_failure,
    leftover_keys,
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
from episode_pipeline.video.playlist import check_playlist, parse_playlist
from episode_pipeline.video.probe import VideoProbe, probe_files
from episode_pipeline.video.process import (
    available_cpus,
    kill_running_children,
    run_with_deadline,
)
from episode_pipeline.video.storyboard import STORYBOARD_VTT, Storyboard, plan_storyboard

STDERR_TAIL = 2000
SPS_SEARCH_BYTES = 64 * 1024

Log = Callable[[str], Any]


class StorageCallFailed(RuntimeError):
    """An S3 call on one key failed; raised from the AWS error, which `describe_failure` finds."""


@contextmanager
def s3_call(what: str) -> Iterator[None]:
    """Name the object (`upload of s3://…/key`) in an AWS error raised inside."""
    try:
        yield
    except Exception as error:
        if aws_fault(error) is None:
            raise
        raise StorageCallFailed(f"{what}: {error}") from error


def fetch_sources(
    job: TranscodeJob, camera: CameraJob, bucket: Bucket, workdir: Path, log: Log
) -> tuple[list[tuple[Path, SourceVideo]], list[FailedVideo]]:
    """Download every source, then probe them all; the ones that do not probe are failures, in
    order. A download that fails raises: S3 failing is not the file's fault."""
    downloaded: list[tuple[str, Path]] = []
    failed: list[FailedVideo] = []

    def fail(key: str, detail: str) -> None:
        message = f"s3://{job.bucket}/{key}: {detail}"
        log(f"skipping {message}")
        failed.append(FailedVideo(key=key, error=message))

    for index, key in enumerate(camera.sources):
        local = workdir / f"source_{index:04d}.mp4"
        with s3_call(f"download of {bucket.uri(key)}"):
            bucket.download_file(key, local)
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
    storyboard: Storyboard | None = None,
) -> tuple[list[Rendition], list[str]]:
    """The renditions a camera gets (from its first source's probe) and the one FFmpeg
    invocation writing them, the poster and the storyboard under `out_dir`, their folders made.
    The transcode runs it; the benchmarks run it bare, so both sides of a comparison share one
    command."""
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
        storyboard=storyboard,
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


def camera_storyboard(sources: list[SourceVideo]) -> Storyboard:
    """The storyboard of a camera's sources played back to back (size and rate: the first's)."""
    first = sources[0].probe
    seconds = sum(s.probe.duration_ms for s in sources) / 1000
    return plan_storyboard(seconds, first.fps, first.width, first.height)


def publish(
    job: TranscodeJob,
    camera: CameraJob,
    sources: list[tuple[Path, SourceVideo]],
    bucket: Bucket,
    workdir: Path,
    ffmpeg_slots: threading.Semaphore,
) -> tuple[list[RenditionResult], Storyboard, float, set[str]]:
    """Encode in a free FFmpeg slot, upload segments as they come, check, then the poster,
    storyboard, playlists and master (the slot is already free for the next camera by then).
    Returns the renditions, the storyboard, FFmpeg's wall time and every key written."""
    out_dir = workdir / "hls"
    source, concat = ffmpeg_input(sources, workdir)
    has_audio = all(s.probe.has_audio for _, s in sources)
    storyboard = camera_storyboard([s for _, s in sources])
    renditions, command = camera_command(
        job.video,
        source,
        out_dir,
        sources[0][1].probe,
        segment_seconds=job.segment_seconds,
        has_audio=has_audio,
        concat=concat,
        storyboard=storyboard,
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
    (out_dir / STORYBOARD_VTT).write_text(storyboard.vtt())
    # Last: the poster, the storyboard, the ladder's playlists, the baseline the application
    # plays, the master.
    finals = [POSTER_NAME, storyboard.image, STORYBOARD_VTT]
    finals += [r.playlist for r in renditions if not r.is_baseline]
    finals += [renditions[0].playlist, MASTER_NAME]
    for name in finals:
        key = camera.output_prefix + name
        with s3_call(f"upload of {bucket.uri(key)}"):
            bucket.upload_file(out_dir / name, key)
        uploaded.add(key)
    return [result for result, _, _ in described], storyboard, ffmpeg_seconds, uploaded


def remove_leftovers(bucket: Bucket, prefix: str, written: set[str]) -> int:
    """After the master is up: delete what is under `prefix` that this run did not write."""
    with s3_call(f"cleaning {bucket.uri(prefix)}"):
        return bucket.delete_keys(leftover_keys(bucket.list_keys(prefix), written, prefix), prefix)


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
    result = TranscodeResult(camera=camera.camera, playlist_key=None, started_at=started)
    try:
        sources, failed = fetch_sources(job, camera, bucket, workdir, log)
        result = replace(result, sources=[s for _, s in sources], failed=failed)
        if not sources:
            raise TranscodeError("no usable source")
        renditions, storyboard, ffmpeg_seconds, written = publish(
            job, camera, sources, bucket, workdir, ffmpeg_slots
        )
        removed = remove_leftovers(bucket, camera.output_prefix, written)
        if removed:
            log(f"camera {camera.camera}: removed {removed} object(s) this upload no longer has")
        result = replace(
            result,
            playlist_key=renditions[0].playlist_key,
            master_key=camera.output_prefix + MASTER_NAME,
            poster_key=camera.output_prefix + POSTER_NAME,
            storyboard=StoryboardFacts(
                image_key=camera.output_prefix + storyboard.image,
                vtt_key=camera.output_prefix + STORYBOARD_VTT,
                interval=storyboard.interval,
                tiles=storyboard.tiles,
                tile_width=storyboard.tile_width,
                tile_height=storyboard.tile_height,
            ),
            renditions=renditions,
            seconds=renditions[0].seconds,
            ffmpeg_seconds=round(ffmpeg_seconds, 3),
        )
    except Exception as error:
        facts = describe_failure(error)
        log(f"camera {camera.camera} ({facts.kind}): {facts.message}")
        if facts.kind == CONTENT:
            # This upload has no video for the camera: S3 must not keep an earlier one's.
            try:
                with s3_call(f"emptying {bucket.uri(camera.output_prefix)}"):
                    bucket.delete_prefix(camera.output_prefix)
            except Exception as cleanup_error:
                facts = describe_failure(cleanup_error)
        result = replace(
            result,
            error=facts.message,
            error_kind=facts.kind,
            error_code=facts.code,
            retry_after_seconds=facts.retry_after_seconds,
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
    `run_camera` does not foresee is reported failed with that error (`infrastructure`); the
    others go on.
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
                facts = describe_failure(error)
                log(f"camera {camera.camera}: transcode failed: {facts.message}")
                result = TranscodeResult(
                    camera=camera.camera,
                    playlist_key=None,
                    error=f"transcode failed: {facts.message}",
                    error_kind=facts.kind,
                    error_code=facts.code,
                    retry_after_seconds=facts.retry_after_seconds,
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
        bucket = Bucket(job.bucket, AwsSettings.from_env(os.environ), job.s3_deadlines)
        with tempfile.TemporaryDirectory(prefix="transcode-") as tmp:
            scratch.append(tmp)
            run_episode(job, bucket, Path(tmp), report, log)
    return 0
