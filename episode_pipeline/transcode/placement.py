"""Where an episode's transcode runs, and how big its run's ECS task is (pure).

Each ECS task is a Fargate cold start (the image pulled again, about a minute), so by default an
episode pays one: the run's own task transcodes, the transcode program being a Pipes subprocess
of the run worker (`subprocess`, the same program and contract as on a laptop). The run task is
then sized for FFmpeg, per run, from what the upload says. Over `TRANSCODE_TASK_ABOVE_BYTES` the
episode's transcode goes to an ECS task of its own (`ecs`): a second cold start, but the large
size is paid only while FFmpeg runs, not while the run extracts and loads frames
(docs/deploy-aws.md#cold-starts).

The uploads sensor calls `place` for every upload it hands to a run and writes the answer into
the run's tags (`defs.runs.placement_tags`): no I/O, so a tick of hundreds of uploads stays flat.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from episode_pipeline.config.settings import ECS, SUBPROCESS, TranscodeMode, TranscodeSettings
from episode_pipeline.transcode.job import TaskSize, fargate_size, task_size

# Archive bytes one vCPU transcodes in reasonable time: the archive is mostly the cameras' mp4s,
# and FFmpeg's work grows with them (benchmarks/README.md, hls).
ARCHIVE_BYTES_PER_VCPU = 128 << 20
# A run whose transcode runs elsewhere only extracts, loads frames and writes metadata.
RUN_WITHOUT_TRANSCODE = TaskSize(cpu=1024, memory=2048)


@dataclass(frozen=True)
class Placement:
    """`mode`: where the transcode runs; `run_size`: the run task's size (None: the launcher's
    default, dagster.yaml `run_resources`); `reason`: why, for the sensor's log."""

    mode: TranscodeMode
    run_size: TaskSize | None
    reason: str


def place(archive_bytes: int | None, cameras: int | None, settings: TranscodeSettings) -> Placement:
    """Where this upload's transcode runs and its run's size.

    `archive_bytes` comes from the S3 event (None when it does not say); `cameras` is known
    only when something already read the archive (an S3 event never says). Without either the
    run keeps the launcher's default size, which can transcode.
    """
    above = settings.task_above_bytes
    if (
        settings.task_definition
        and above is not None
        and archive_bytes is not None
        and archive_bytes > above
    ):
        return Placement(
            ECS,
            RUN_WITHOUT_TRANSCODE,
            f"{archive_bytes} bytes > TRANSCODE_TASK_ABOVE_BYTES={above}: transcode task "
            f"sized by its cameras",
        )
    if archive_bytes is None and cameras is None:
        return Placement(SUBPROCESS, None, "size unknown: the run task's default size")
    size = run_task_size(archive_bytes, cameras, settings.max_vcpu)
    facts = ", ".join(
        part
        for part in (
            f"{archive_bytes} bytes" if archive_bytes is not None else "",
            f"{cameras} camera(s)" if cameras else "",
        )
        if part
    )
    return Placement(SUBPROCESS, size, f"{facts}: transcoded in the run's task")


def run_task_size(archive_bytes: int | None, cameras: int | None, max_vcpu: int) -> TaskSize:
    """A run task that transcodes in itself: a vCPU per `ARCHIVE_BYTES_PER_VCPU` of archive or
    per camera, whichever asks more."""
    by_bytes = math.ceil((archive_bytes or 0) / ARCHIVE_BYTES_PER_VCPU)
    by_cameras = task_size(cameras, max_vcpu).vcpus if cameras else 1
    return fargate_size(max(1, by_bytes, by_cameras), max_vcpu)


def place_batch(archive_sizes: Sequence[int | None], settings: TranscodeSettings) -> Placement:
    """A batch run's placement: every episode transcodes in the batch's own task (a transcode
    task of its own would pay the cold start the batch saves), sized by the batch's largest
    archive with the uploads' rule."""
    known = [size for size in archive_sizes if size is not None]
    if not known:
        return Placement(SUBPROCESS, None, "no archive size known: the run task's default size")
    largest = max(known)
    return Placement(
        SUBPROCESS,
        run_task_size(largest, None, settings.max_vcpu),
        f"largest of {len(known)} archive(s) {largest} bytes: the batch transcodes in its task",
    )
