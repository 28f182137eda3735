"""Where a run transcodes and how big its task is, decided from the upload alone (pure)."""

from __future__ import annotations

import pytest

from episode_pipeline.config.settings import ECS, SUBPROCESS, Settings, TranscodeSettings
from episode_pipeline.instance.run_tags import (
    ECS_CPU_TAG,
    ECS_MEMORY_TAG,
    TRANSCODER_TAG,
    placement_tags,
    transcoder_of,
)
from episode_pipeline.storage.bucket import ObjectInfo
from episode_pipeline.transcode.placement import RUN_WITHOUT_TRANSCODE, place
from episode_pipeline.uploads.intake import sized_placement

MiB = 1 << 20
WITH_TASK = TranscodeSettings(
    ecs_cluster="pipe",
    ecs_subnets=("subnet-1",),
    task_definition="pipe-transcode",
    task_above_bytes=2048 * MiB,
)
# Every valid Fargate (vCPU, memory MiB) pair with 2 GiB per vCPU.
FARGATE_PAIRS = {(1024, 2048), (2048, 4096), (4096, 8192), (8192, 16384), (16384, 32768)}


@pytest.mark.parametrize(
    ("archive_bytes", "cameras", "vcpus"),
    [(10 * MiB, None, 1), (128 * MiB, None, 1), (129 * MiB, None, 2), (300 * MiB, None, 4),
     (1500 * MiB, None, 4), (10 * MiB, 3, 4), (10 * MiB, 2, 2), (None, 2, 2)],
)  # fmt: skip
def test_the_run_task_is_sized_from_the_upload(archive_bytes, cameras, vcpus):
    placement = place(archive_bytes, cameras, TranscodeSettings())
    assert placement.mode == SUBPROCESS
    assert placement.run_size is not None
    assert placement.run_size.vcpus == vcpus
    assert (placement.run_size.cpu, placement.run_size.memory) in FARGATE_PAIRS


def test_an_upload_of_unknown_size_keeps_the_launchers_default_size():
    placement = place(None, None, WITH_TASK)
    assert (placement.mode, placement.run_size) == (SUBPROCESS, None)
    assert placement_tags(placement) == {TRANSCODER_TAG: SUBPROCESS}


def test_only_uploads_over_the_threshold_go_to_a_task_of_their_own():
    small, large = place(2048 * MiB, None, WITH_TASK), place(2048 * MiB + 1, None, WITH_TASK)
    assert small.mode == SUBPROCESS
    assert (large.mode, large.run_size) == (ECS, RUN_WITHOUT_TRANSCODE)
    assert "TRANSCODE_TASK_ABOVE_BYTES" in large.reason
    assert placement_tags(large) == {
        TRANSCODER_TAG: ECS,
        ECS_CPU_TAG: "1024",
        ECS_MEMORY_TAG: "2048",
    }
    # Without a transcode task definition the threshold cannot send anything there.
    no_task = TranscodeSettings(task_above_bytes=1)
    assert place(50 * 1024 * MiB, None, no_task).mode == SUBPROCESS
    assert place(50 * 1024 * MiB, None, no_task).run_size.vcpus == 4  # TRANSCODE_MAX_VCPU


def test_the_threshold_and_cap_come_from_the_environment():
    env = {
        "DB_HOST": "db",
        "DATA_BUCKET": "data",
        "TRANSCODE_TASK_DEFINITION": "pipe-transcode",
        "ECS_CLUSTER": "pipe",
        "ECS_SUBNETS": "subnet-1",
        "TRANSCODE_TASK_ABOVE_BYTES": "1000",
        "TRANSCODE_MAX_VCPU": "16",
    }
    transcode = Settings.from_env(env).transcode
    assert transcode.task_above_bytes == 1000
    assert place(None, None, transcode).mode == SUBPROCESS  # a task is set, yet not by default
    assert place(1001, None, transcode).mode == ECS
    unlimited = TranscodeSettings(max_vcpu=transcode.max_vcpu)
    assert place(2000 * MiB, None, unlimited).run_size.vcpus == 16
    assert (
        Settings.from_env({**env, "TRANSCODE_TASK_ABOVE_BYTES": ""}).transcode.task_above_bytes
        is None
    )
    with pytest.raises(RuntimeError, match="TRANSCODE_TASK_ABOVE_BYTES"):
        Settings.from_env({**env, "TRANSCODE_TASK_ABOVE_BYTES": "lots"})


def test_the_run_tag_chooses_the_transcoder():
    assert transcoder_of({}, SUBPROCESS) == SUBPROCESS
    assert transcoder_of({TRANSCODER_TAG: ECS}, SUBPROCESS) == ECS
    assert transcoder_of({TRANSCODER_TAG: SUBPROCESS}, ECS) == SUBPROCESS
    with pytest.raises(ValueError, match="episode_pipeline/transcoder='fargate'"):
        transcoder_of({TRANSCODER_TAG: "fargate"}, SUBPROCESS)


def test_the_uploads_sensor_sizes_by_s3_never_by_the_event():
    settings = TranscodeSettings()
    real = ObjectInfo("orgs/a/episodes/e/t.tar.zst", 1 << 20, "etag", None, None)
    placement, said = sized_placement(64 << 30, real, settings)
    assert placement == place(1 << 20, None, settings)
    assert f"S3 says {1 << 20} B; the event said {64 << 30} B" in said
    # S3 could not say: unplaced, so the run coordinator sizes the run from its listing.
    unplaced, said = sized_placement(1 << 20, TimeoutError("read timeout"), settings)
    assert unplaced is None and "read timeout" in said and "run coordinator" in said
