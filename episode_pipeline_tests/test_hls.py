"""`hls_renditions` end to end on the real stack: moto S3, the bundled FFmpeg, Dagster Pipes.

The transcode runs as a real `python -m episode_pipeline.transcode` process: a subprocess, or
(last test) an "ECS task" whose only fake part is the container itself — a hand-written ECS
client that starts the task definition's command locally and ships its output to moto's
CloudWatch Logs, where `PipesECSClient` reads the Pipes messages as it does in production.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import av
import pytest
from dagster import DagsterInstance, materialize

from episode_pipeline.definitions import build_resources
from episode_pipeline.defs.assets.archive import extracted_files, raw_archive
from episode_pipeline.defs.assets.hls_renditions import hls_playlists_valid, hls_renditions
from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME
from episode_pipeline.defs.resources.transcoder import HlsTranscoder
from episode_pipeline.keys import EpisodeRef
from episode_pipeline.lerobot.sample import SampleSpec, pack_archive, write_dataset, write_sample
from episode_pipeline.local import aws_setup
from episode_pipeline.local.upload import upload_episode
from episode_pipeline.settings import TranscodeSettings
from episode_pipeline.video.playlist import check_playlist, parse_playlist

pytestmark = pytest.mark.integration

SEGMENT_LIMIT = 4.1  # seconds: 4 s segments cut on frame boundaries


def new_ref() -> EpisodeRef:
    return EpisodeRef("test-org", f"ep-{uuid.uuid4().hex[:10]}")


@pytest.fixture(scope="module")
def instance(stack) -> DagsterInstance:
    return DagsterInstance.ephemeral()


def resources(settings, transcoder: HlsTranscoder) -> dict[str, Any]:
    return {**build_resources(settings), "transcoder": transcoder}


def run_hls(instance, settings, ref: EpisodeRef, transcoder: HlsTranscoder | None = None):
    """Materialize extracted_files + hls_renditions (+ its check) for the episode's partition."""
    if not instance.has_dynamic_partition(EPISODES_PARTITION_NAME, ref.partition_key):
        instance.add_dynamic_partitions(EPISODES_PARTITION_NAME, [ref.partition_key])
    result = materialize(
        [raw_archive, extracted_files, hls_renditions, hls_playlists_valid],
        selection=[extracted_files, hls_renditions],
        partition_key=ref.partition_key,
        instance=instance,
        resources=resources(settings, transcoder or HlsTranscoder(mode="subprocess")),
    )
    assert result.success
    (materialization,) = [m for m in result.asset_materializations_for_node("hls_renditions")]
    metadata = {k: v.value for k, v in materialization.metadata.items()}
    (check,) = result.get_asset_check_evaluations()
    return metadata, check


def hls_objects(s3_client, bucket: str, ref: EpisodeRef) -> dict[str, str]:
    prefix = f"{ref.processed_prefix}hls/"
    objects = {}
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            objects[item["Key"][len(prefix) :]] = item["ETag"]
    return objects


def segment_facts(path: Path) -> tuple[str, str, int, float, int]:
    """codec, profile, level, seconds and frames of one decoded segment."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = sum(1 for _ in container.decode(video=0))
        seconds = frames / float(stream.average_rate)
        context = stream.codec_context
        return context.name, context.profile, context.level, seconds, frames


def check_rendition(s3_client, bucket, ref, camera, tmp_path, expected_seconds) -> list[float]:
    """Download a camera's rendition; assert the contract; return its segment lengths."""
    prefix = ref.hls_prefix(camera)
    text = s3_client.get_object(Bucket=bucket, Key=prefix + "playlist.m3u8")["Body"].read()
    playlist = parse_playlist(text.decode())
    names = {
        k.rsplit("/", 1)[1] for k in hls_objects(s3_client, bucket, ref) if k.startswith(camera)
    }
    assert check_playlist(playlist, names) == []
    assert names == {"playlist.m3u8", *(s.uri for s in playlist.segments)}  # nothing stale
    lengths = []
    for segment in playlist.segments:
        local = tmp_path / f"{camera}-{segment.uri}"
        s3_client.download_file(bucket, prefix + segment.uri, str(local))
        codec, profile, level, seconds, frames = segment_facts(local)
        assert (codec, profile, level) == ("h264", "Constrained Baseline", 30)
        assert frames > 0
        lengths.append(seconds)
    assert all(length <= SEGMENT_LIMIT for length in lengths[:-1])
    assert sum(lengths) == pytest.approx(expected_seconds, abs=0.1)
    assert playlist.seconds == pytest.approx(expected_seconds, abs=0.1)
    return lengths


def test_v30_av1_two_cameras_then_rerun_keeps_the_same_keys(
    tmp_path, stack, settings, instance, s3_client
):
    ref = new_ref()
    archive = tmp_path / "v30.tar.zst"
    summary = write_sample(
        archive, SampleSpec(codebase_version="v3.0", codec="av1", cameras=2, seconds=9.0)
    )
    upload_episode(archive, ref)

    metadata, check = run_hls(instance, settings, ref)
    cameras = summary["cameras"]
    assert metadata["cameras"] == ", ".join(sorted(cameras))
    assert sorted(metadata["playlists"]) == sorted(
        ref.hls_prefix(c) + "playlist.m3u8" for c in cameras
    )
    assert metadata["failed_videos"] == []
    for camera in cameras:
        facts = metadata["per_camera"][camera]
        assert facts["source_codec"] == "av1"
        assert facts["source_resolution"] == "320x240"
        assert facts["source_duration_ms"] == pytest.approx(9000, abs=50)
        assert facts["segments"] == 3
        lengths = check_rendition(s3_client, stack.bucket, ref, camera, tmp_path, 9.0)
        assert lengths[:2] == [pytest.approx(4.0, abs=0.05)] * 2
    assert check.passed

    first = hls_objects(s3_client, stack.bucket, ref)
    again, check = run_hls(instance, settings, ref)
    assert check.passed
    assert hls_objects(s3_client, stack.bucket, ref).keys() == first.keys()
    assert again["playlists"] == metadata["playlists"]


def test_v21_episodes_concatenate_and_corrupt_videos_are_reported(
    tmp_path, stack, settings, instance, s3_client
):
    """front: episode 1 corrupt → a rendition of episode 0; wrist: both episodes back to back;
    top: both corrupt → no rendition. The asset succeeds; the WARN check fails on `top`."""
    ref = new_ref()
    folder = tmp_path / "dataset"
    spec = SampleSpec(codebase_version="v2.1", codec="h264", cameras=3, episodes=2, seconds=3.0)
    summary = write_dataset(folder, spec)
    front, wrist, top = summary["cameras"]
    corrupt = [
        f"videos/chunk-000/{front}/episode_000001.mp4",
        f"videos/chunk-000/{top}/episode_000000.mp4",
        f"videos/chunk-000/{top}/episode_000001.mp4",
    ]
    for relative in corrupt:
        (folder / relative).write_bytes(b"\x00\x00\x00\x18ftypisom" + os.urandom(2000))
    archive = tmp_path / "v21.tar.zst"
    pack_archive(folder, archive, root_folder="lerobot_episode")
    upload_episode(archive, ref)

    metadata, check = run_hls(instance, settings, ref)

    failed = {
        (f["camera"], f["key"].rsplit("lerobot_episode/", 1)[1]) for f in metadata["failed_videos"]
    }
    assert failed == {(front, corrupt[0]), (top, corrupt[1]), (top, corrupt[2])}
    assert all(f["key"] in f["error"] for f in metadata["failed_videos"])
    assert sorted(metadata["playlists"]) == sorted(
        ref.hls_prefix(c) + "playlist.m3u8" for c in (front, wrist)
    )
    check_rendition(s3_client, stack.bucket, ref, front, tmp_path, 3.0)
    check_rendition(s3_client, stack.bucket, ref, wrist, tmp_path, 6.0)
    assert metadata["per_camera"][wrist]["sources"] == 2
    assert metadata["per_camera"][top]["playlist"] is None
    assert not any(k.startswith(top + "/") for k in hls_objects(s3_client, stack.bucket, ref))

    assert not check.passed
    assert check.severity.value == "WARN"
    problems = check.metadata["problems"].value
    assert problems == [f"{ref.hls_prefix(top)}playlist.m3u8: missing"]


def test_a_transcode_process_that_dies_is_reported_not_fatal(
    tmp_path, stack, settings, instance, s3_client
):
    ref = new_ref()
    archive = tmp_path / "dies.tar.zst"
    summary = write_sample(archive, SampleSpec(codebase_version="v3.0", cameras=1, seconds=1.0))
    upload_episode(archive, ref)
    broken = HlsTranscoder(mode="subprocess", python_executable="/bin/false")

    metadata, check = run_hls(instance, settings, ref, broken)

    (camera,) = summary["cameras"]
    (failure,) = metadata["failed_videos"]
    assert failure["camera"] == camera
    assert failure["error"].startswith("transcode failed:")
    assert metadata["playlists"] == []
    assert not check.passed


# --- ECS: everything real but the container -------------------------------------------------


@dataclass
class _Container:
    process: subprocess.Popen
    log_group: str
    log_stream: str
    reader: threading.Thread
    output: list[str] = field(default_factory=list)
    shipped: bool = False


class LocalContainerEcs:
    """An ECS client whose tasks run on this machine.

    Every call goes to moto's ECS (which validates the request and keeps the task) except that
    `run_task` also starts the container's command — the task definition's `environment` plus the
    overrides', as ECS would — and, when it exits, its stdout and stderr go to the awslogs stream
    `<prefix>/<container>/<task id>` in moto's CloudWatch Logs. moto never runs a container
    (docs/platform-notes.md#moto), and `describe_tasks` reports the process's state and exit code.
    """

    def __init__(self, ecs: Any, logs: Any) -> None:
        self._ecs = ecs
        self._logs = logs
        self._tasks: dict[str, _Container] = {}
        self.run_task_requests: list[dict[str, Any]] = []

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
        for override in kwargs.get("overrides", {}).get("containerOverrides", []):
            if override["name"] == container["name"]:
                env.update({e["name"]: e["value"] for e in override.get("environment", [])})
        env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
        command = list(container["command"])
        if command[0] == "python":  # the image's interpreter is this virtualenv's here
            command[0] = sys.executable
        options = container["logConfiguration"]["options"]
        task_id = task["taskArn"].rsplit("/", 1)[1]
        stream = f"{options['awslogs-stream-prefix']}/{container['name']}/{task_id}"
        self._logs.create_log_stream(logGroupName=options["awslogs-group"], logStreamName=stream)
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        output: list[str] = []

        def read() -> None:
            with process.stdout:  # type: ignore[union-attr]
                output.extend(process.stdout)  # type: ignore[arg-type]

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        run = _Container(process, options["awslogs-group"], stream, reader, output)
        self._tasks[task["taskArn"]] = run
        task["containers"] = [{"name": container["name"], "lastStatus": "RUNNING"}]
        return response

    def _ship_logs(self, run: _Container) -> None:
        if run.shipped:
            return
        run.process.wait()
        run.reader.join()
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

    def describe_tasks(self, **kwargs: Any) -> Any:
        response = self._ecs.describe_tasks(cluster=kwargs.get("cluster"), tasks=kwargs["tasks"])
        for task in response["tasks"]:
            run = self._tasks[task["taskArn"]]
            code = run.process.poll()
            container = {"name": "transcode", "runtimeId": task["taskArn"]}
            if code is None:
                task["lastStatus"] = "RUNNING"
            else:
                self._ship_logs(run)
                task["lastStatus"] = "STOPPED"
                container["exitCode"] = code
            task["containers"] = [container]
        return response

    def stop_task(self, **kwargs: Any) -> Any:
        self._tasks[kwargs["task"]].process.terminate()
        return self._ecs.stop_task(**kwargs)

    def get_waiter(self, name: str) -> Any:
        assert name == "tasks_stopped", name
        client = self

        class Waiter:
            def wait(self, WaiterConfig: dict[str, int] | None = None, **kwargs: Any) -> None:
                delay = (WaiterConfig or {}).get("Delay", 6)
                while True:
                    tasks = client.describe_tasks(**kwargs)["tasks"]
                    if all(t["lastStatus"] == "STOPPED" for t in tasks):
                        return
                    time.sleep(delay)

        return Waiter()


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
    ecs.register_task_definition(
        family=f"{name}-transcode",
        requiresCompatibilities=["FARGATE"],
        networkMode="awsvpc",
        cpu="2048",
        memory="4096",
        containerDefinitions=[
            {
                "name": "transcode",
                "image": "episode-pipeline:test",
                "essential": True,
                "memory": 4096,
                "command": ["python", "-m", "episode_pipeline.transcode"],
                "environment": [{"name": k, "value": v} for k, v in environment.items()],
                "logConfiguration": {
                    "logDriver": "awslogs",
                    "options": {
                        "awslogs-group": log_group,
                        "awslogs-region": aws_setup.REGION,
                        "awslogs-stream-prefix": "transcode",
                    },
                },
            }
        ],
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


def test_ecs_mode_runs_the_task_definition_and_reads_pipes_from_cloudwatch(
    tmp_path, stack, settings, instance, s3_client, ecs_setup
):
    fake = LocalContainerEcs(ecs_setup["ecs"], ecs_setup["logs"])

    class LocalEcsTranscoder(HlsTranscoder):
        def ecs_client(self) -> Any:
            return fake

    base = HlsTranscoder.from_settings(
        replace(settings, transcode=TranscodeSettings.from_env(ecs_setup["env"]))
    )
    transcoder = LocalEcsTranscoder(**{**base.model_dump(), "poll_seconds": 1})
    assert transcoder.mode == "ecs"

    ref = new_ref()
    archive = tmp_path / "ecs.tar.zst"
    summary = write_sample(archive, SampleSpec(codebase_version="v3.0", cameras=1, seconds=5.0))
    upload_episode(archive, ref)
    metadata, check = run_hls(instance, settings, ref, transcoder)

    (camera,) = summary["cameras"]
    assert metadata["transcoder"] == "ecs"
    assert metadata["playlists"] == [ref.hls_prefix(camera) + "playlist.m3u8"]
    assert metadata["per_camera"][camera]["source_codec"] == "h264"
    check_rendition(s3_client, stack.bucket, ref, camera, tmp_path, 5.0)
    assert check.passed

    (request,) = fake.run_task_requests
    assert request["launchType"] == "FARGATE"
    assert request["networkConfiguration"]["awsvpcConfiguration"]["subnets"] == [
        ecs_setup["env"]["ECS_SUBNETS"]
    ]
    (override,) = request["overrides"]["containerOverrides"]
    assert override["name"] == "transcode"
    assert {e["name"] for e in override["environment"]} >= {
        "DAGSTER_PIPES_CONTEXT",
        "DAGSTER_PIPES_MESSAGES",
    }
    streams = ecs_setup["logs"].describe_log_streams(logGroupName=ecs_setup["log_group"])
    assert any(s["logStreamName"].startswith("transcode/transcode/") for s in streams["logStreams"])
