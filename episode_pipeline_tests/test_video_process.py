"""The children the transcode waits on: deadlines that kill a whole process group, and the PyAV
probe child on real (tiny) files. No servers: a shell stands in for a hung FFmpeg, and the
bundled FFmpeg writes the videos."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from episode_pipeline.video import ffmpeg_exe
from episode_pipeline.video.probe import COUNT_FRAMES, PROBE, ProbeError, VideoProbe, examine
from episode_pipeline.video.process import (
    DeadlineExceeded,
    kill_running_children,
    run_with_deadline,
    terminate_group,
)
from episode_pipeline_tests.support.processes import gone

# A shell that starts a grandchild, prints both ids and waits: FFmpeg's stand-in when hung.
HANGS = 'sleep 600 & echo "$$ $!"; wait'


def test_a_late_child_is_killed_with_everything_it_started():
    with pytest.raises(
        DeadlineExceeded, match=r"stand-in exceeded its deadline of 0\.5 s"
    ) as error:
        run_with_deadline(["sh", "-c", HANGS], 0.5, what="stand-in")
    shell, sleep = map(int, error.value.stdout.split())
    assert gone([shell, sleep])


def test_a_child_in_time_returns_its_output_and_code():
    done = run_with_deadline(["sh", "-c", "echo out; echo err >&2; exit 3"], 10)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")


def test_the_sigterm_handler_kills_the_children_being_waited_on():
    """What the transcode program does when it is stopped: its FFmpegs, in sessions of their
    own, would survive a signal to its group."""
    caught: list[BaseException] = []

    def wait_for_child() -> None:
        try:
            run_with_deadline(["sh", "-c", HANGS], 60)
        except BaseException as error:
            caught.append(error)

    waiter = threading.Thread(target=wait_for_child)
    waiter.start()
    time.sleep(0.5)
    kill_running_children()
    waiter.join(timeout=10)
    assert not waiter.is_alive()
    assert not caught  # the child died: its wait simply ended (with SIGKILL's return code)


def test_terminate_group_gives_grace_then_kills():
    ignoring = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; echo ready; sleep 600"],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert ignoring.stdout is not None and ignoring.stdout.readline() == b"ready\n"
    terminate_group(ignoring, grace=0.5)
    ignoring.stdout.close()
    assert ignoring.returncode == -9  # SIGTERM was ignored; SIGKILL after the grace


def ffmpeg_video(path: Path, frames: int, faststart: bool = True) -> Path:
    flags = ["-movflags", "+faststart"] if faststart else []
    subprocess.run(
        [ffmpeg_exe(), "-loglevel", "error", "-y", "-f", "lavfi", "-i",
         "testsrc2=size=160x120:rate=10", "-frames:v", str(frames), "-c:v", "libx264",
         "-pix_fmt", "yuv420p", *flags, str(path)],
        check=True,
    )  # fmt: skip
    return path


def test_the_probe_child_counts_frames_and_names_bad_files(tmp_path):
    good = ffmpeg_video(tmp_path / "good.mp4", 40)
    data = good.read_bytes()
    truncated = tmp_path / "truncated.mp4"
    truncated.write_bytes(data[: len(data) * 2 // 3])  # index first (faststart): frames missing
    zeros = tmp_path / "zeros.mp4"
    zeros.write_bytes(bytes(1 << 20))

    probed, cut, empty, counted = examine(
        [(PROBE, good), (PROBE, truncated), (PROBE, zeros), (COUNT_FRAMES, good)], 60
    )

    assert probed == VideoProbe(
        codec="h264",
        width=160,
        height=120,
        duration_ms=4000,
        frames=40,
        fps=10.0,
        start_seconds=0.0,
        last_frame_seconds=3.9,  # where the sync check (lerobot/sync.py) places the frames
    )
    assert isinstance(cut, ProbeError)
    assert str(cut).startswith(f"{truncated}: truncated: its index lists 40 frames, it holds ")
    assert isinstance(empty, ProbeError)
    assert str(empty).startswith(f"{zeros}: not a readable video")
    assert counted == 40


def test_a_probe_past_its_deadline_names_what_it_did_not_answer(tmp_path):
    good = ffmpeg_video(tmp_path / "good.mp4", 10)
    stand_in = tmp_path / "slow-python"
    stand_in.write_text(f'#!/bin/sh\nsleep 600\nexec {sys.executable} "$@"\n')
    stand_in.chmod(0o755)

    (answer,) = examine([(PROBE, good)], 0.5, python=str(stand_in))

    assert isinstance(answer, ProbeError)
    assert "video probe of 1 file(s) exceeded its deadline of 0.5 s" in str(answer)
    assert str(answer).startswith(str(good))
