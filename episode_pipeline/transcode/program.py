"""The transcode program: one camera's mp4s from S3 → FFmpeg → checked HLS rendition → S3.

Runs as `python -m episode_pipeline.transcode` under Dagster Pipes: the job comes in the Pipes
extras, the result goes back as one custom message. The bucket is in the job; the S3 endpoint and
credentials come from the environment (the parent's resource locally; the task role on AWS).
This module imports `dagster_pipes` and the core only, never `dagster`: it starts in a fraction
of the time.

Outcomes:
- a source that cannot be downloaded or probed, or FFmpeg failing on the camera's sources, is a
  *reported* failure: the result lists it, the camera's old rendition is removed (what S3 holds
  always matches the latest run) and the program exits 0: a video error is logged and the
  episode is still processed (docs/contract.md#failure-semantics);
- anything that stops the program from doing or reporting its job (bad extras, S3 errors while
  uploading) raises: Pipes reports the exception and the process exits non-zero.

Upload order: stale objects under the prefix are deleted, then the segments go up in parallel,
then the playlist last, so a reader never sees a playlist whose segments are missing.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from episode_pipeline.bucket import Bucket
from episode_pipeline.settings import AwsSettings
from episode_pipeline.transcode.job import FailedVideo, SourceVideo, TranscodeJob, TranscodeResult
from episode_pipeline.video import ffmpeg_exe
from episode_pipeline.video.hls import (
    PLAYLIST_NAME,
    EncodeSettings,
    concat_list,
    ffmpeg_command,
    fit_level_30,
)
from episode_pipeline.video.playlist import PlaylistError, check_playlist, parse_playlist
from episode_pipeline.video.probe import ProbeError, probe

STDERR_TAIL = 2000
UPLOAD_WORKERS = 8

Log = Callable[[str], Any]


class TranscodeError(RuntimeError):
    """FFmpeg failed, or wrote a rendition that breaks the contract."""


def fetch_sources(
    job: TranscodeJob, bucket: Bucket, workdir: Path, log: Log
) -> tuple[list[tuple[Path, SourceVideo]], list[FailedVideo]]:
    """Download and probe each source; unreadable ones are failures, the rest keep their order."""
    usable: list[tuple[Path, SourceVideo]] = []
    failed: list[FailedVideo] = []
    for index, key in enumerate(job.sources):
        local = workdir / f"source_{index:04d}.mp4"
        try:
            bucket.download_file(key, local)
            probed = probe(local)
            if probed.duration_ms <= 0 or probed.frames <= 0:
                raise ProbeError(f"{local}: no frames")
        except Exception as error:
            detail = str(error).replace(f"{local}: ", "") or type(error).__name__
            message = f"s3://{job.bucket}/{key}: {detail}"
            log(f"skipping {message}")
            failed.append(FailedVideo(key=key, error=message))
            continue
        usable.append((local, SourceVideo(key=key, probe=probed)))
    return usable, failed


def encode(
    job: TranscodeJob, sources: list[tuple[Path, SourceVideo]], workdir: Path
) -> tuple[Path, float]:
    """Run FFmpeg into `workdir/hls`; returns the folder and FFmpeg's wall time."""
    out_dir = workdir / "hls"
    out_dir.mkdir()
    first = sources[0][1].probe
    if len(sources) > 1:
        listing = workdir / "sources.ffconcat"
        listing.write_text(concat_list([path.name for path, _ in sources]))
        source, concat = listing, True
    else:
        source, concat = sources[0][0], False
    command = ffmpeg_command(
        ffmpeg_exe(),
        source,
        out_dir,
        width=first.width,
        height=first.height,
        fps=first.fps,
        has_audio=all(s.probe.has_audio for _, s in sources),
        concat=concat,
        settings=EncodeSettings(segment_seconds=job.segment_seconds, preset=job.preset),
    )
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise TranscodeError(
            f"ffmpeg exited {done.returncode} for camera {job.camera}: "
            f"{done.stderr.strip()[-STDERR_TAIL:]}"
        )
    return out_dir, elapsed


def run_job(job: TranscodeJob, bucket: Bucket, workdir: Path, log: Log) -> TranscodeResult:
    """Do the whole job in `workdir`; see the module docstring for what fails how."""
    sources, failed = fetch_sources(job, bucket, workdir, log)
    if sources:
        try:
            out_dir, ffmpeg_seconds = encode(job, sources, workdir)
            playlist_path = out_dir / PLAYLIST_NAME
            playlist = parse_playlist(playlist_path.read_text(), source=str(playlist_path))
            problems = check_playlist(
                playlist, os.listdir(out_dir), segment_seconds=job.segment_seconds
            )
            if problems:
                raise TranscodeError(f"camera {job.camera}: bad playlist: {'; '.join(problems)}")
        except (TranscodeError, PlaylistError, OSError) as error:
            log(f"camera {job.camera}: {error}")
            failed += [FailedVideo(key=s.key, error=str(error)) for _, s in sources]
            sources = []
    if not sources:
        bucket.delete_prefix(job.output_prefix)
        return TranscodeResult(camera=job.camera, playlist_key=None, failed=failed)

    bucket.delete_prefix(job.output_prefix)
    segment_keys = [job.output_prefix + s.uri for s in playlist.segments]
    bucket.upload_files(
        [(out_dir / s.uri, key) for s, key in zip(playlist.segments, segment_keys, strict=True)],
        max_workers=UPLOAD_WORKERS,
    )
    playlist_key = job.output_prefix + PLAYLIST_NAME
    bucket.upload_file(playlist_path, playlist_key)  # last: its segments are all there now
    first = sources[0][1].probe
    output = fit_level_30(first.width, first.height, first.fps)
    return TranscodeResult(
        camera=job.camera,
        playlist_key=playlist_key,
        segment_keys=segment_keys,
        seconds=round(playlist.seconds, 3),
        output_resolution=output.resolution,
        sources=[s for _, s in sources],
        failed=failed,
        ffmpeg_seconds=round(ffmpeg_seconds, 3),
    )


def main() -> int:
    """The Pipes entry point: read the job, do it, report the result."""
    from dagster_pipes import open_dagster_pipes

    with open_dagster_pipes() as pipes:
        job = TranscodeJob.from_extras(pipes.extras)
        pipes.log.info(f"transcoding camera {job.camera}: {len(job.sources)} source(s)")
        # The environment names the S3 endpoint and keys: the parent's locally, the task role's
        # on ECS.
        bucket = Bucket(job.bucket, AwsSettings.from_env(os.environ))
        with tempfile.TemporaryDirectory(prefix=f"transcode-{job.camera}-") as tmp:
            result = run_job(job, bucket, Path(tmp), pipes.log.warning)
        pipes.report_custom_message(result.to_message())
        pipes.log.info(
            f"camera {job.camera}: {len(result.segment_keys)} segment(s), {result.seconds} s, "
            f"ffmpeg {result.ffmpeg_seconds} s, {len(result.failed)} failed source(s)"
        )
    return 0
