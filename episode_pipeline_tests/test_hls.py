"""`hls_renditions` end to end on the real stack: moto S3, the bundled FFmpeg, Dagster Pipes.

The transcode runs as a real `python -m episode_pipeline.transcode` process: a subprocess, or
(the ECS tests) an "ECS task" whose only fake part is the container itself — a hand-written ECS
client that starts the task definition's command locally and ships its output to moto's
CloudWatch Logs, where `PipesECSClient` reads the Pipes messages as it does in production.
FFmpeg misbehaving (exiting non-zero, hanging) is played by a shell stand-in that the
`ffmpeg` setting points at; every other FFmpeg run is the real one. Clips are 1-2 s long.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import av
import botocore.exceptions
import psutil
import pytest
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, materialize
from dagster_aws.ecs import EcsRunLauncher

from episode_pipeline.config.settings import TranscodeSettings
from episode_pipeline.definitions import build_definitions, build_resources
from episode_pipeline.defs.assets.archive import extracted_files, raw_archive
from episode_pipeline.defs.assets.hls_renditions import hls_renditions
from episode_pipeline.defs.checks.hls import HLS_CHECKS
from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME
from episode_pipeline.defs.resources.transcoder import HlsTranscoder
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_tags import (
    ECS_CPU_TAG,
    ECS_MEMORY_TAG,
    EPISODE_JOB_NAME,
    TRANSCODER_TAG,
)
from episode_pipeline.local import aws_setup
from episode_pipeline.local.upload import upload_episode
from episode_pipeline.orchestration import upload_runs
from episode_pipeline.orchestration.run_errors import StepError, run_errors
from episode_pipeline.samples.writer import SampleSpec, pack_archive, write_dataset, write_sample
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.transcode.job import task_size
from episode_pipeline.uploads.upload_queue import UploadQueue
from episode_pipeline.video import ffmpeg_exe
from episode_pipeline.video.playlist import (
    check_master,
    check_playlist,
    parse_master,
    parse_playlist,
)
from episode_pipeline_tests.leftovers import session_env
from episode_pipeline_tests.support import new_ref
from episode_pipeline_tests.support.dagster_internals import (
    PARTITION_NAME_TAG,
    InProcessCodeLocationOrigin,
    LaunchRunContext,
    LoadableTargetOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from episode_pipeline_tests.support.processes import gone

pytestmark = pytest.mark.integration

SEGMENT_LIMIT = 4.1  # seconds: 4 s segments cut on frame boundaries
CHECK_NAMES = {key.name for checks in HLS_CHECKS for key in checks.check_keys}


class CountingTranscoder(HlsTranscoder):
    """Counts how many transcode processes the asset starts."""

    processes: ClassVar[int] = 0

    def _run_subprocess(self, *args: Any, **kwargs: Any) -> Any:
        CountingTranscoder.processes += 1
        return super()._run_subprocess(*args, **kwargs)


@dataclass
class Run:
    metadata: dict[str, Any]
    checks: dict[str, Any]  # check name → evaluation

    def table(self, name: str) -> list[dict[str, Any]]:
        return [dict(record.data) for record in self.metadata[name].records]

    def cameras(self) -> dict[str, dict[str, Any]]:
        return {row["camera"]: row for row in self.table("per_camera")}

    def check_rows(self, check: str) -> dict[str, dict[str, Any]]:
        records = self.checks[check].metadata["per_camera"].value.records
        return {r.data["camera"]: dict(r.data) for r in records}


def run_hls(
    instance,
    settings,
    ref: EpisodeRef,
    transcoder: HlsTranscoder | None = None,
    tags: dict[str, str] | None = None,
) -> Run:
    """Materialize extracted_files + hls_renditions (+ its checks) for the episode's partition."""
    if not instance.has_dynamic_partition(EPISODES_PARTITION_NAME, ref.partition_key):
        instance.add_dynamic_partitions(EPISODES_PARTITION_NAME, [ref.partition_key])
    result = materialize(
        [raw_archive, extracted_files, hls_renditions, *HLS_CHECKS],
        selection=[extracted_files, hls_renditions],
        partition_key=ref.partition_key,
        instance=instance,
        tags=tags,
        resources={
            **build_resources(settings),
            "transcoder": transcoder or HlsTranscoder(mode="subprocess"),
        },
    )
    assert result.success
    (materialization,) = list(result.asset_materializations_for_node("hls_renditions"))
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert set(checks) == CHECK_NAMES
    # Each result carries the severity its check declared (`family.check(severity=...)`).
    declared = {spec.name: spec.metadata["severity"] for c in HLS_CHECKS for spec in c.check_specs}
    assert {name: e.severity.value for name, e in checks.items()} == declared
    return Run(metadata={k: v.value for k, v in materialization.metadata.items()}, checks=checks)


def run_hls_failing(
    instance,
    settings,
    ref: EpisodeRef,
    transcoder: HlsTranscoder,
    tags: dict[str, str] | None = None,
) -> tuple[StepError, list[float | None]]:
    """As `run_hls` for a transcode that fails on infrastructure: the step's error and the wait
    before each of its retries (seconds, as the step asked for them)."""
    if not instance.has_dynamic_partition(EPISODES_PARTITION_NAME, ref.partition_key):
        instance.add_dynamic_partitions(EPISODES_PARTITION_NAME, [ref.partition_key])
    result = materialize(
        [raw_archive, extracted_files, hls_renditions, *HLS_CHECKS],
        selection=[extracted_files, hls_renditions],
        partition_key=ref.partition_key,
        instance=instance,
        tags=tags,
        raise_on_error=False,
        resources={**build_resources(settings), "transcoder": transcoder},
    )
    assert not result.success
    assert not list(result.asset_materializations_for_node("hls_renditions"))
    (error,) = run_errors(instance, result.run_id)
    assert error.step == "hls_renditions"
    retried = instance.get_records_for_run(
        result.run_id, of_type=DagsterEventType.STEP_UP_FOR_RETRY
    ).records
    waits = [
        record.event_log_entry.dagster_event.event_specific_data.seconds_to_wait
        for record in retried
    ]
    return error, waits


def earlier_hls(s3_client, bucket: str, ref: EpisodeRef, cameras: list[str]) -> dict[str, str]:
    """What an earlier run left under each camera's folder (stand-ins), by key → ETag."""
    for camera in cameras:
        for name in ("master.m3u8", "playlist.m3u8", "segment_00000.ts", "720p/playlist.m3u8"):
            s3_client.put_object(Bucket=bucket, Key=ref.hls_prefix(camera) + name, Body=b"earlier")
    objects = hls_objects(s3_client, bucket, ref)
    assert len(objects) == 4 * len(cameras)
    return objects


def hls_objects(s3_client, bucket: str, ref: EpisodeRef) -> dict[str, str]:
    prefix = ref.hls_root
    objects = {}
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            objects[item["Key"][len(prefix) :]] = item["ETag"]
    return objects


def stream_facts(path: Path) -> tuple[str, str, int, int, int, int]:
    """codec, profile, level, width, height and decoded frames of one file."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = sum(1 for _ in container.decode(video=0))
        context = stream.codec_context
        return context.name, context.profile, context.level, context.width, context.height, frames


def get_text(s3_client, bucket: str, key: str) -> str:
    return s3_client.get_object(Bucket=bucket, Key=key)["Body"].read().decode()


def check_camera(s3_client, bucket, ref, camera, tmp_path, expected_seconds) -> dict[str, Any]:
    """Download a camera's whole output; assert the contract; return what was found."""
    prefix = ref.hls_prefix(camera)
    names = {
        k[len(camera) + 1 :]
        for k in hls_objects(s3_client, bucket, ref)
        if k.startswith(camera + "/")
    }
    variants = parse_master(get_text(s3_client, bucket, prefix + "master.m3u8"))
    assert check_master(variants, "playlist.m3u8") == []
    found: dict[str, Any] = {"variants": variants, "names": names}
    listed = {"master.m3u8", "poster.jpg", "storyboard.jpg", "storyboard.vtt"}
    for variant in variants:
        playlist = parse_playlist(get_text(s3_client, bucket, prefix + variant.uri))
        folder = variant.uri.rsplit("/", 1)[0] + "/" if "/" in variant.uri else ""
        present = {n[len(folder) :] for n in names if n.startswith(folder)}
        assert check_playlist(playlist, present) == []
        listed |= {variant.uri, *(folder + s.uri for s in playlist.segments)}
        frames = 0
        for segment in playlist.segments:
            local = tmp_path / f"{camera}-{folder.strip('/') or 'base'}-{segment.uri}"
            s3_client.download_file(bucket, prefix + folder + segment.uri, str(local))
            codec, profile, level, width, height, count = stream_facts(local)
            assert codec == "h264"
            assert (width, height) == variant.resolution
            if variant.uri == "playlist.m3u8":
                assert (profile, level) == ("Constrained Baseline", 30)
            else:
                assert profile == "High"
            frames += count
        assert [s.duration <= SEGMENT_LIMIT for s in playlist.segments[:-1]] == [True] * (
            len(playlist.segments) - 1
        )
        assert playlist.seconds == pytest.approx(expected_seconds, abs=0.1)
        found[variant.uri] = frames
    assert names == listed  # nothing stale, nothing missing
    poster = tmp_path / f"{camera}-poster.jpg"
    s3_client.download_file(bucket, prefix + "poster.jpg", str(poster))
    codec, _, _, width, _, _ = stream_facts(poster)
    found["poster"] = (codec, width)
    return found


def test_three_cameras_in_one_process_ladder_poster_and_green_checks(
    tmp_path, stack, settings, instance, s3_client
):
    """3 cameras of 640x480 → per camera the baseline (640x480), a 240p rung, a master, a
    poster; one transcode process; every check green."""
    ref = new_ref()
    archive = tmp_path / "three.tar.zst"
    spec = SampleSpec(
        codebase_version="v3.0", codec="av1", cameras=3, seconds=1.5, width=640, height=480
    )
    summary = write_sample(archive, spec)
    upload_episode(archive, ref)
    CountingTranscoder.processes = 0

    run = run_hls(instance, settings, ref, CountingTranscoder(mode="subprocess"))

    assert CountingTranscoder.processes == 1
    cameras = summary["cameras"]
    assert set(run.cameras()) == set(cameras)
    assert run.metadata["failed_videos"] == []
    for camera in cameras:
        row = run.cameras()[camera]
        assert row["status"] == "ok"
        assert (row["source_codec"], row["source_resolution"]) == ("av1", "640x480")
        assert row["source_frames"] == 45
        assert row["renditions"] == "baseline 640x480, 240p 320x240"
        found = check_camera(s3_client, stack.bucket, ref, camera, tmp_path, 1.5)
        by_uri = {v.uri: v for v in found["variants"]}
        assert set(by_uri) == {"playlist.m3u8", "240p/index.m3u8"}
        assert by_uri["playlist.m3u8"].codecs == "avc1.42C01E"
        assert by_uri["240p/index.m3u8"].codecs.startswith("avc1.6400")
        assert by_uri["240p/index.m3u8"].frame_rate == 30
        assert found["playlist.m3u8"] == found["240p/index.m3u8"] == 45
        assert found["poster"] == ("mjpeg", 320)
        assert (
            camera in run.metadata["posters"]
            and "data:image/jpeg;base64," in run.metadata["posters"]
        )
    sources = run.table("sources")
    assert {(s["camera"], s["codec"], s["frames"], s["error"]) for s in sources} == {
        (c, "av1", 45, None) for c in cameras
    }
    assert {name: check.passed for name, check in run.checks.items()} == dict.fromkeys(
        CHECK_NAMES, True
    )


def test_corrupt_sources_are_reported_by_name_and_the_rest_is_transcoded(
    tmp_path, stack, settings, instance, s3_client
):
    """front: its second mp4 is zeros → a rendition of the first, the sources check names the
    file; wrist: both episodes back to back; top: both unreadable → no rendition."""
    ref = new_ref()
    folder = tmp_path / "dataset"
    spec = SampleSpec(codebase_version="v2.1", codec="h264", cameras=3, episodes=2, seconds=1.0)
    summary = write_dataset(folder, spec)
    front, wrist, top = summary["cameras"]
    zeros = f"videos/chunk-000/{front}/episode_000001.mp4"
    broken = [f"videos/chunk-000/{top}/episode_00000{i}.mp4" for i in (0, 1)]
    (folder / zeros).write_bytes(bytes(3 << 20))
    for relative in broken:
        (folder / relative).write_bytes(b"\x00\x00\x00\x18ftypisom" + os.urandom(2000))
    archive = tmp_path / "v21.tar.zst"
    pack_archive(folder, archive, root_folder="lerobot_episode")
    upload_episode(archive, ref)

    run = run_hls(instance, settings, ref)

    failed = {
        (f["camera"], f["key"].rsplit("lerobot_episode/", 1)[1])
        for f in run.metadata["failed_videos"]
    }
    assert failed == {(front, zeros), (top, broken[0]), (top, broken[1])}
    cameras = run.cameras()
    assert cameras[front]["status"] == "ok, 1 source(s) left out"
    assert cameras[wrist]["sources"] == 2 and cameras[wrist]["source_frames"] == 60
    assert cameras[top]["playlist"] is None and cameras[top]["status"].startswith("failed: ")
    check_camera(s3_client, stack.bucket, ref, front, tmp_path, 1.0)
    check_camera(s3_client, stack.bucket, ref, wrist, tmp_path, 2.0)
    assert not any(k.startswith(top + "/") for k in hls_objects(s3_client, stack.bucket, ref))

    readable = run.checks["hls_sources_readable"]
    assert not readable.passed and readable.severity.value == "WARN"
    rows = run.check_rows("hls_sources_readable")
    assert rows[wrist]["passed"]
    assert zeros in rows[front]["problems"] and "not a readable video" in rows[front]["problems"]
    assert all(path in rows[top]["problems"] for path in broken)
    for name in (
        "hls_playlists_valid",
        "hls_duration_matches_sources",
        "hls_decodes_to_source_frames",
    ):
        rows = run.check_rows(name)
        assert (rows[front]["passed"], rows[wrist]["passed"], rows[top]["passed"]) == (
            True,
            True,
            False,
        ), name
        assert "missing" in rows[top]["problems"]


def stand_in_ffmpeg(tmp_path: Path, body: str) -> str:
    """A shell script playing FFmpeg: `body` runs first, then the real FFmpeg with its args."""
    script = tmp_path / "ffmpeg-stand-in.sh"
    script.write_text(f'#!/bin/sh\n{body}\nexec {ffmpeg_exe()} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def pids_in(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def test_one_camera_whose_ffmpeg_fails_or_hangs_is_reported_and_the_others_complete(
    tmp_path, stack, settings, instance, s3_client
):
    """wrist: FFmpeg exits 1; top: FFmpeg hangs past its deadline and is killed with the sleep
    it started (its process group); front completes and its checks pass."""
    ref = new_ref()
    archive = tmp_path / "three.tar.zst"
    summary = write_sample(archive, SampleSpec(codebase_version="v3.0", cameras=3, seconds=1.0))
    upload_episode(archive, ref)
    front, wrist, top = summary["cameras"]
    pids = tmp_path / "hung.pids"
    ffmpeg = stand_in_ffmpeg(
        tmp_path,
        f'case "$*" in *-{wrist}/*) echo "stand-in: encoder exploded" >&2; exit 1;; esac\n'
        f'case "$*" in *-{top}/*) sleep 600 & echo $$ $! >> {pids}; wait; exit 0;; esac',
    )
    transcoder = HlsTranscoder(
        mode="subprocess",
        ffmpeg=ffmpeg,
        ffmpeg_deadline_base_seconds=3,
        ffmpeg_deadline_per_source_second=0.01,
    )

    run = run_hls(instance, settings, ref, transcoder)

    errors = {f["camera"]: f["error"] for f in run.metadata["failed_videos"]}
    assert set(errors) == {wrist, top}
    assert "ffmpeg exited 1" in errors[wrist] and "stand-in: encoder exploded" in errors[wrist]
    assert f"ffmpeg for camera {top} exceeded its deadline of 3.01 s" in errors[top]
    (shell, sleep) = pids_in(pids)
    assert gone([shell, sleep])  # the whole group, not just FFmpeg
    check_camera(s3_client, stack.bucket, ref, front, tmp_path, 1.0)
    objects = hls_objects(s3_client, stack.bucket, ref)
    assert not any(k.startswith((wrist + "/", top + "/")) for k in objects)
    cameras = run.cameras()
    assert cameras[wrist]["status"].startswith("failed: ffmpeg exited 1")
    assert cameras[wrist]["source_frames"] == 30  # its source was fine: FFmpeg was not
    assert run.checks["hls_sources_readable"].passed
    for name in CHECK_NAMES - {"hls_sources_readable"}:
        rows = run.check_rows(name)
        passed = (rows[front]["passed"], rows[wrist]["passed"], rows[top]["passed"])
        assert passed == (True, False, False), name


def test_a_transcode_process_past_the_step_deadline_is_killed_and_the_earlier_hls_stays(
    tmp_path, stack, settings, instance, s3_client
):
    """The whole transcode's deadline is not the videos' fault (issue 32, finding 0): the process
    is killed with its FFmpegs, the step fails naming the deadline, and nothing an earlier run
    made is removed."""
    ref = new_ref()
    archive = tmp_path / "slow.tar.zst"
    summary = write_sample(archive, SampleSpec(codebase_version="v3.0", cameras=2, seconds=1.0))
    upload_episode(archive, ref)
    before = earlier_hls(s3_client, stack.bucket, ref, summary["cameras"])
    pids = tmp_path / "hung.pids"
    ffmpeg = stand_in_ffmpeg(tmp_path, f"sleep 600 & echo $$ $! >> {pids}; wait")
    transcoder = HlsTranscoder(
        mode="subprocess", ffmpeg=ffmpeg, deadline_seconds=12, step_retries=0
    )

    error, waits = run_hls_failing(instance, settings, ref, transcoder)

    assert error.error_type == "TranscodeInterrupted" and waits == []
    assert "ran past its deadline of 12 s and was killed" in error.message
    assert all(f"camera {camera}: " in error.message for camera in summary["cameras"])
    started = pids_in(pids)
    assert started and gone(started)  # FFmpeg's stand-ins and what they started died too
    assert hls_objects(s3_client, stack.bucket, ref) == before


def test_a_transcode_process_that_dies_fails_the_step_after_its_retries(
    tmp_path, stack, settings, instance, s3_client
):
    ref = new_ref()
    archive = tmp_path / "dies.tar.zst"
    summary = write_sample(archive, SampleSpec(codebase_version="v3.0", cameras=1, seconds=1.0))
    upload_episode(archive, ref)
    before = earlier_hls(s3_client, stack.bucket, ref, summary["cameras"])
    broken = HlsTranscoder(
        mode="subprocess", python_executable="/bin/false", step_retries=2, step_retry_seconds=0.1
    )

    error, waits = run_hls_failing(instance, settings, ref, broken)

    (camera,) = summary["cameras"]
    assert len(waits) == 2
    assert error.error_type == "TranscodeInterrupted"
    assert error.message.startswith(
        f"camera {camera}: transcode failed: the transcode process exited 1 (try 3 of 3;"
    )
    assert hls_objects(s3_client, stack.bucket, ref) == before


# --- ECS: everything real but the container -------------------------------------------------


@dataclass
class _Container:
    process: subprocess.Popen | None
    log_group: str
    log_stream: str
    started: threading.Event
    container: str = "transcode"
    scratch: Path | None = None  # the task's own disk: gone when the task stops
    output: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None
    started_at: float = 0.0
    stopped: bool = False
    shipped: bool = False


def executable(name: str) -> str:
    """A program of this virtualenv by name (`dagster`), else the name as given."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


class LocalContainerEcs:
    """An ECS client whose tasks run on this machine.

    Every call goes to moto's ECS (which validates the request and keeps the task) except that
    `run_task` also starts the container's command — the task definition's `environment` plus the
    overrides', as ECS would — after `start_delay` seconds (a Fargate cold start), and when it
    exits its stdout and stderr go to the awslogs stream `<prefix>/<container>/<task id>` in
    moto's CloudWatch Logs. moto never runs a container (docs/platform-notes.md#moto);
    `describe_tasks` reports the process's state and exit code, `stop_task` kills its process
    group, and the `tasks_stopped` waiter gives up after `MaxAttempts` polls as botocore's does.
    Like a task's, the container's processes and disk end with it: `stop_task` kills every
    process it started (FFmpeg runs in a session of its own), and its TMPDIR is removed.
    """

    def __init__(self, ecs: Any, logs: Any, start_delay: float = 0.0) -> None:
        self._ecs = ecs
        self._logs = logs
        self._tasks: dict[str, _Container] = {}
        self.start_delay = start_delay
        self.run_task_requests: list[dict[str, Any]] = []
        self.stop_task_requests: list[dict[str, Any]] = []

    @property
    def meta(self) -> Any:
        return self._ecs.meta

    def describe_task_definition(self, **kwargs: Any) -> Any:
        return self._ecs.describe_task_definition(**kwargs)

    def run_task(self, **kwargs: Any) -> Any:
        self.run_task_requests.append(kwargs)
        response = self._ecs.run_task(**kwargs)
        task = response["tasks"][0]
        definition = self._ecs.describe_task_definition(taskDefinition=kwargs["taskDefinition"])
        (container,) = definition["taskDefinition"]["containerDefinitions"]
        env = {e["name"]: e["value"] for e in container.get("environment", [])}
        command = list(container.get("command") or [])
        for override in kwargs.get("overrides", {}).get("containerOverrides", []):
            if override["name"] == container["name"]:
                env.update({e["name"]: e["value"] for e in override.get("environment", [])})
                command = list(override.get("command") or command)
        env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
        env["HOME"] = os.environ.get("HOME", "/tmp")
        env.update(session_env())  # the suite's mark, so its leftover check sees the container
        scratch = Path(tempfile.mkdtemp(prefix="ecs-task-"))
        env["TMPDIR"] = str(scratch)
        options = container["logConfiguration"]["options"]
        task_id = task["taskArn"].rsplit("/", 1)[1]
        stream = f"{options['awslogs-stream-prefix']}/{container['name']}/{task_id}"
        self._logs.create_log_stream(logGroupName=options["awslogs-group"], logStreamName=stream)
        run = _Container(
            None,
            options["awslogs-group"],
            stream,
            threading.Event(),
            container["name"],
            scratch=scratch,
        )
        self._tasks[task["taskArn"]] = run

        def start() -> None:
            time.sleep(self.start_delay)
            if not run.stopped:
                run.process = self.start_container(command, env)
                run.started_at = time.time()
                with run.process.stdout:  # type: ignore[union-attr]
                    run.started.set()
                    run.output.extend(run.process.stdout)  # type: ignore[arg-type]
            run.started.set()

        run.reader = threading.Thread(target=start, daemon=True)
        run.reader.start()
        task["containers"] = [{"name": container["name"], "lastStatus": "PENDING"}]
        return response

    def start_container(self, command: list[str], env: dict[str, str]) -> subprocess.Popen:
        """The container's process, its output on one pipe; here the image's programs (python,
        dagster) are this virtualenv's (test_images.py's fake runs the image itself)."""
        program = sys.executable if command[0] == "python" else executable(command[0])
        return subprocess.Popen(
            [program, *command[1:]],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def _exit_code(self, run: _Container) -> int | None:
        if not run.started.is_set():
            return None
        if run.process is None:
            return 137  # stopped before it started
        return run.process.poll()

    def _ship_logs(self, run: _Container) -> None:
        if run.shipped:
            return
        if run.process is not None:
            run.process.wait()
        run.reader.join()  # type: ignore[union-attr]
        if run.scratch is not None:
            shutil.rmtree(run.scratch, ignore_errors=True)
        events = [
            {"timestamp": int(time.time() * 1000), "message": line.rstrip("\n")}
            for line in run.output
            if line.strip()
        ]
        for start in range(0, len(events), 500):
            self._logs.put_log_events(
                logGroupName=run.log_group,
                logStreamName=run.log_stream,
                logEvents=events[start : start + 500],
            )
        run.shipped = True

    def finish(self) -> None:
        """Wait for every container to exit, as ECS would before a task is gone; its scratch
        disk goes with it (a test that only watched the run never asked ECS again)."""
        for run in self._tasks.values():
            if run.started.wait(60):
                self._ship_logs(run)

    def describe_tasks(self, **kwargs: Any) -> Any:
        response = self._ecs.describe_tasks(cluster=kwargs.get("cluster"), tasks=kwargs["tasks"])
        for task in response["tasks"]:
            run = self._tasks[task["taskArn"]]
            code = self._exit_code(run)
            container = {"name": run.container, "runtimeId": task["taskArn"]}
            if code is None:
                task["lastStatus"] = "RUNNING" if run.process else "PENDING"
            else:
                self._ship_logs(run)
                task["lastStatus"] = "STOPPED"
                container["exitCode"] = code
            task["containers"] = [container]
        return response

    def stop_task(self, **kwargs: Any) -> Any:
        self.stop_task_requests.append(kwargs)
        run = self._tasks[kwargs["task"]]
        run.stopped = True
        if run.process is not None:  # what a stopped Fargate task's kernel does
            container = psutil.Process(run.process.pid)
            for process in [container, *container.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
            run.process.wait()
        if run.scratch is not None:
            shutil.rmtree(run.scratch, ignore_errors=True)
        return self._ecs.stop_task(**kwargs)

    def get_waiter(self, name: str) -> Any:
        assert name == "tasks_stopped", name
        client = self

        class Waiter:
            def wait(self, WaiterConfig: dict[str, int] | None = None, **kwargs: Any) -> None:
                config = WaiterConfig or {}
                for _ in range(config.get("MaxAttempts", 100)):
                    tasks = client.describe_tasks(**kwargs)["tasks"]
                    if all(t["lastStatus"] == "STOPPED" for t in tasks):
                        return
                    time.sleep(config.get("Delay", 6))
                raise botocore.exceptions.WaiterError(
                    name="TasksStopped", reason="Max attempts exceeded", last_response={}
                )

        return Waiter()


def register_fargate_task(
    ecs: Any,
    family: str,
    container: str,
    environment: dict[str, str],
    log_group: str,
    command: list[str] | None = None,
) -> None:
    """A task definition as infra/ecs.tf makes them: Fargate 2 vCPU / 4 GB, one container
    named like its task, awslogs with the container's name as stream prefix."""
    definition: dict[str, Any] = {
        "name": container,
        "image": "episode-pipeline:test",
        "essential": True,
        "memory": 4096,
        "environment": [{"name": k, "value": v} for k, v in environment.items()],
        "logConfiguration": {
            "logDriver": "awslogs",
            "options": {
                "awslogs-group": log_group,
                "awslogs-region": aws_setup.REGION,
                "awslogs-stream-prefix": container,
            },
        },
    }
    if command:
        definition["command"] = command
    ecs.register_task_definition(
        family=family,
        requiresCompatibilities=["FARGATE"],
        networkMode="awsvpc",
        cpu="2048",
        memory="4096",
        containerDefinitions=[definition],
    )


@pytest.fixture(scope="module")
def ecs_setup(stack) -> dict[str, Any]:
    """What infra/ecs.tf creates, on moto: VPC, subnet, security group, cluster, log group, and
    the transcode task definition (awslogs with a stream prefix, `python -m ...transcode`)."""
    endpoint = stack.s3_endpoint
    ec2 = aws_setup.client("ec2", endpoint)
    ecs = aws_setup.client("ecs", endpoint)
    logs = aws_setup.client("logs", endpoint)
    name = f"hls-{uuid.uuid4().hex[:6]}"
    vpc = ec2.create_vpc(CidrBlock="10.7.0.0/16")["Vpc"]["VpcId"]
    ec2.modify_vpc_attribute(VpcId=vpc, EnableDnsHostnames={"Value": True})
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.7.1.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName=name, Description="tasks", VpcId=vpc)["GroupId"]
    ecs.create_cluster(clusterName=name)
    log_group = f"/ecs/{name}-transcode"
    logs.create_log_group(logGroupName=log_group)
    environment = {
        name: stack.env[name]
        for name in (
            "AWS_ENDPOINT_URL",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_DEFAULT_REGION",
            "DATA_BUCKET",
        )
    }
    register_fargate_task(
        ecs,
        f"{name}-transcode",
        "transcode",
        environment,
        log_group,
        command=["python", "-m", "episode_pipeline.transcode"],
    )
    return {
        "env": {
            "ECS_CLUSTER": name,
            "ECS_SUBNETS": subnet,
            "ECS_SECURITY_GROUPS": group,
            "TRANSCODE_TASK_DEFINITION": f"{name}-transcode",
            "TRANSCODE_CONTAINER_NAME": "transcode",
            "AWS_REGION": aws_setup.REGION,
            "AWS_ENDPOINT_URL": endpoint,
        },
        "ecs": ecs,
        "logs": logs,
        "log_group": log_group,
    }


def ecs_transcoder(settings, ecs_setup, fake: LocalContainerEcs, **fields: Any) -> HlsTranscoder:
    """The transcoder Definitions builds from the ECS environment, its ECS client the fake."""

    class LocalEcsTranscoder(HlsTranscoder):
        def ecs_client(self) -> Any:
            return fake

    base = HlsTranscoder.from_settings(
        replace(settings, transcode=TranscodeSettings.from_env(ecs_setup["env"]))
    )
    transcoder = LocalEcsTranscoder(**{**base.model_dump(), "poll_seconds": 1, **fields})
    assert transcoder.mode == "subprocess"  # a run transcodes in its own task unless tagged
    return transcoder


# What the uploads sensor tags a run with when its archive is over TRANSCODE_TASK_ABOVE_BYTES.
ECS_TASK_TAGS = {TRANSCODER_TAG: "ecs"}


def test_ecs_one_task_per_episode_holds_one_start_delay(
    tmp_path, stack, settings, instance, s3_client, ecs_setup
):
    """3 cameras, a 2 s cold start: one run_task, sized for 3 cameras; every camera is taken up
    after that one start, cameras in parallel; the Pipes messages come back from CloudWatch."""
    fake = LocalContainerEcs(ecs_setup["ecs"], ecs_setup["logs"], start_delay=2.0)
    ref = new_ref()
    archive = tmp_path / "ecs.tar.zst"
    summary = write_sample(archive, SampleSpec(codebase_version="v3.0", cameras=3, seconds=1.0))
    upload_episode(archive, ref)

    run = run_hls(instance, settings, ref, ecs_transcoder(settings, ecs_setup, fake), ECS_TASK_TAGS)

    assert run.metadata["transcoder"] == "ecs"
    assert run.metadata["failed_videos"] == []
    assert all(check.passed for check in run.checks.values())
    (request,) = fake.run_task_requests  # one cold start on the critical path, not three
    size = task_size(3, max_vcpu=4)
    assert (request["overrides"]["cpu"], request["overrides"]["memory"]) == ("4096", "8192")
    assert run.metadata["transcode_task"] == f"{size.vcpus} vCPU / {size.memory} MiB"
    assert request["launchType"] == "FARGATE"
    assert request["networkConfiguration"]["awsvpcConfiguration"]["subnets"] == [
        ecs_setup["env"]["ECS_SUBNETS"]
    ]
    (override,) = request["overrides"]["containerOverrides"]
    assert {e["name"] for e in override["environment"]} >= {
        "DAGSTER_PIPES_CONTEXT",
        "DAGSTER_PIPES_MESSAGES",
    }
    (task,) = fake._tasks.values()
    cameras = run.cameras()
    assert set(cameras) == set(summary["cameras"])
    for camera in summary["cameras"]:
        check_camera(s3_client, stack.bucket, ref, camera, tmp_path, 1.0)
    streams = ecs_setup["logs"].describe_log_streams(logGroupName=ecs_setup["log_group"])
    assert any(s["logStreamName"].startswith("transcode/transcode/") for s in streams["logStreams"])
    assert task.started_at > 0


def test_ecs_task_past_the_step_deadline_is_stopped(
    tmp_path, stack, settings, instance, s3_client, ecs_setup
):
    fake = LocalContainerEcs(ecs_setup["ecs"], ecs_setup["logs"])
    ref = new_ref()
    archive = tmp_path / "ecs-slow.tar.zst"
    summary = write_sample(archive, SampleSpec(codebase_version="v3.0", cameras=1, seconds=1.0))
    upload_episode(archive, ref)
    before = earlier_hls(s3_client, stack.bucket, ref, summary["cameras"])
    ffmpeg = stand_in_ffmpeg(tmp_path, "sleep 600")
    transcoder = ecs_transcoder(
        settings, ecs_setup, fake, ffmpeg=ffmpeg, deadline_seconds=4, step_retries=0
    )

    error, _ = run_hls_failing(instance, settings, ref, transcoder, ECS_TASK_TAGS)

    (stop,) = fake.stop_task_requests
    assert stop["reason"] == "transcode deadline of 4 s passed"
    (task,) = fake._tasks.values()
    assert task.process is not None and task.process.poll() is not None
    assert "ran past its deadline of 4 s and was stopped" in error.message
    (camera,) = summary["cameras"]
    assert error.message.startswith(f"camera {camera}: ")
    assert hls_objects(s3_client, stack.bucket, ref) == before  # the stopped task removed nothing


class ThrottledEcs(LocalContainerEcs):
    """ECS answering `RunTask` with `ThrottlingException` and `Retry-After: 2`, as boto3 raises
    it once its retries ran out: a stub, because moto's ECS never throttles."""

    def run_task(self, **kwargs: Any) -> Any:
        self.run_task_requests.append(kwargs)
        raise botocore.exceptions.ClientError(
            {
                "Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"},
                "ResponseMetadata": {"HTTPStatusCode": 400, "HTTPHeaders": {"retry-after": "2"}},
            },
            "RunTask",
        )


@pytest.mark.slow(seconds=30)  # 29 s on the busy 2 cores: two tries of the step, 2 s apart
def test_ecs_refusing_the_transcode_task_fails_the_step_with_its_retry_after(
    tmp_path, stack, settings, instance, s3_client, ecs_setup
):
    fake = ThrottledEcs(ecs_setup["ecs"], ecs_setup["logs"])
    ref = new_ref()
    archive = tmp_path / "ecs-throttled.tar.zst"
    summary = write_sample(archive, SampleSpec(codebase_version="v3.0", cameras=1, seconds=1.0))
    upload_episode(archive, ref)
    before = earlier_hls(s3_client, stack.bucket, ref, summary["cameras"])
    transcoder = ecs_transcoder(settings, ecs_setup, fake, step_retries=1)

    error, waits = run_hls_failing(instance, settings, ref, transcoder, ECS_TASK_TAGS)

    assert len(fake.run_task_requests) == 2
    assert waits == [2]  # the step waited ECS's Retry-After, not its own 30 s backoff
    assert error.error_type == "TranscodeInterrupted"
    assert "ThrottlingException" in error.message and "Retry-After: 2" in error.message
    assert hls_objects(s3_client, stack.bucket, ref) == before


# --- cold starts: the ECS tasks one upload costs ----------------------------------------------


RUN_DEADLINE_SECONDS = 300
RUN_FAMILY_SUFFIX = "-run"
ASSET_RUN_TASK = "run_task"


def register_run_task(ecs_setup: dict[str, Any], stack: Any, bucket: str) -> str:
    """The run task definition as infra/ecs.tf makes it: the shared environment (here: the
    stack's database and AWS variables, this test's bucket, and the ECS transcode task
    configured), awslogs. The code location reads nothing else: no local-stack state file."""
    env = ecs_setup["env"]
    database = {name: value for name, value in stack.env.items() if name.startswith("DB_")}
    environment = {
        **{name: stack.env[name] for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")},
        "AWS_DEFAULT_REGION": aws_setup.REGION,
        "AWS_REGION": env["AWS_REGION"],
        "AWS_ENDPOINT_URL": env["AWS_ENDPOINT_URL"],
        **database,
        "DAGSTER_HOME": stack.dagster_home,
        "DATA_BUCKET": bucket,
        **{
            name: env[name]
            for name in (
                "ECS_CLUSTER",
                "ECS_SUBNETS",
                "ECS_SECURITY_GROUPS",
                "TRANSCODE_TASK_DEFINITION",
                "TRANSCODE_CONTAINER_NAME",
            )
        },
        # A step that wrongly waited on a transcode task (moto never runs it) fails in time.
        "TRANSCODE_DEADLINE_SECONDS": "120",
    }
    family = env["ECS_CLUSTER"] + RUN_FAMILY_SUFFIX
    register_fargate_task(ecs_setup["ecs"], family, "run", environment, ecs_setup["log_group"])
    return family


def run_launcher(ecs_setup: dict[str, Any], family: str, fake: LocalContainerEcs) -> Any:
    """dagster.yaml's launcher, with the cluster and network given (there is no daemon task to
    copy them from) and its ECS client the fake."""
    env = ecs_setup["env"]
    launcher = EcsRunLauncher(
        task_definition=family,
        container_name="run",
        use_current_ecs_task_config=False,
        include_sidecars=False,
        secrets_tag=None,
        run_resources={"cpu": "2048", "memory": "4096"},
        run_task_kwargs={
            "cluster": env["ECS_CLUSTER"],
            "launchType": "FARGATE",
            "networkConfiguration": {
                "awsvpcConfiguration": {
                    "subnets": [env["ECS_SUBNETS"]],
                    "securityGroups": [env["ECS_SECURITY_GROUPS"]],
                    "assignPublicIp": "DISABLED",
                }
            },
        },
    )
    launcher.ecs = fake
    return launcher


def tasks_on_cluster(ecs_setup: dict[str, Any]) -> set[str]:
    """Every task moto's ECS holds on the cluster, running or stopped."""
    ecs, cluster = ecs_setup["ecs"], ecs_setup["env"]["ECS_CLUSTER"]
    return {
        arn
        for status in ("RUNNING", "STOPPED")
        for arn in ecs.list_tasks(cluster=cluster, desiredStatus=status)["taskArns"]
    }


def wait_for_run(instance: DagsterInstance, run_id: str) -> Any:
    deadline = time.monotonic() + RUN_DEADLINE_SECONDS
    while time.monotonic() < deadline:
        run = instance.get_run_by_id(run_id)
        if run is not None and run.is_finished:
            return run
        time.sleep(0.5)
    raise AssertionError(f"run {run_id} did not finish within {RUN_DEADLINE_SECONDS} s")


@pytest.mark.slow(seconds=60)
def test_an_upload_costs_one_ecs_task_by_default(tmp_path, stack, settings, ecs_setup) -> None:
    """From the S3 event to the episode's success, as on AWS: the uploads sensor requests the
    run (its tags say where it transcodes and how big its task is), `EcsRunLauncher` starts the
    run's task, whose container (`dagster api execute_run`, the launcher's command, against the
    session stack's instance, database and S3) executes the whole episode job. The ECS
    transcode task is configured in that container's environment: had the step started one, it
    would show on moto's cluster. One task in all, of the size the sensor chose."""
    name = f"coldstart-{uuid.uuid4().hex[:8]}"
    resources = aws_setup.ensure_resources(stack.s3_endpoint, bucket=name, queue_name=name)
    own = replace(settings, bucket=resources.bucket, sqs_queue_url=resources.queue_url)
    ref = new_ref()
    archive = tmp_path / "one-task.tar.zst"
    write_sample(archive, SampleSpec(codebase_version="v3.0", cameras=1, seconds=1.0))
    upload_episode(archive, ref, own)
    queue = UploadQueue(resources.queue_url, own.aws)
    transcode = TranscodeSettings.from_env(ecs_setup["env"])  # the transcode task available
    before = tasks_on_cluster(ecs_setup)  # the module's other tests share the cluster

    with DagsterInstance.get() as instance:  # the stack's: the run worker process shares it
        context = SimpleNamespace(instance=instance, log=logging.getLogger("episode_uploads"))
        storage = Bucket(own.bucket, own.aws)
        result = upload_runs.evaluate_uploads(context, queue, storage, transcode)  # type: ignore[arg-type]
        (request,) = result.run_requests
        assert request.tags[TRANSCODER_TAG] == "subprocess"
        assert (request.tags[ECS_CPU_TAG], request.tags[ECS_MEMORY_TAG]) == ("1024", "2048")

        instance.add_dynamic_partitions(EPISODES_PARTITION_NAME, [request.partition_key])
        job = build_definitions(own).resolve_job_def(EPISODE_JOB_NAME)
        origin = InProcessCodeLocationOrigin(
            LoadableTargetOrigin(
                executable_path=sys.executable, module_name="episode_pipeline.definitions"
            )
        )
        with origin.create_location(instance) as location:
            repository = location.get_repository("__repository__")
            remote_job = repository.get_full_job(EPISODE_JOB_NAME)
            run = instance.create_run_for_job(
                job_def=job,
                tags={**request.tags, PARTITION_NAME_TAG: request.partition_key},
                remote_job_origin=RemoteJobOrigin(
                    RemoteRepositoryOrigin(origin, "__repository__"), EPISODE_JOB_NAME
                ),
                job_code_origin=remote_job.get_python_origin(),
                status=DagsterRunStatus.NOT_STARTED,
            )
        fake = LocalContainerEcs(ecs_setup["ecs"], ecs_setup["logs"])
        family = register_run_task(ecs_setup, stack, own.bucket)
        launcher = run_launcher(ecs_setup, family, fake)
        launcher.register_instance(instance)
        launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))

        try:
            finished = wait_for_run(instance, run.run_id)
        finally:
            fake.finish()
        (task,) = fake._tasks.values()
        assert finished.status == DagsterRunStatus.SUCCESS, "".join(task.output[-40:])

        # Exactly one task for the episode: the run's, at the size the sensor chose.
        (launched,) = fake.run_task_requests
        assert f"task-definition/{family}:" in launched["taskDefinition"]
        assert (launched["overrides"]["cpu"], launched["overrides"]["memory"]) == ("1024", "2048")
        assert tasks_on_cluster(ecs_setup) - before == set(fake._tasks)
        (materialization,) = [
            event.asset_materialization
            for event in instance.all_logs(run.run_id)
            if event.asset_materialization
            and event.asset_materialization.asset_key.to_user_string() == "hls_renditions"
        ]
        metadata = {k: v.value for k, v in materialization.metadata.items()}
        assert metadata["transcoder"] == "subprocess"
        assert metadata[ASSET_RUN_TASK] == "1 vCPU / 2048 MiB"
        assert metadata["failed_videos"] == []
