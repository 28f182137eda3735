"""The sync rule (lerobot/sync.py) on facts written by hand: no servers, no video."""

from __future__ import annotations

import numpy as np
import pytest

from episode_pipeline.lerobot.sync import (
    EpisodesTable,
    TimingAccumulator,
    VideoFacts,
    check_sync,
    episodes_table,
    path_indices,
    timings_from_json,
)

FPS = 30
FRONT = "observation.images.front"


def timings(*lengths: int, dropped: dict[int, int] | None = None) -> dict:
    """Per episode `lengths[e]` rows at 1/FPS, each episode's timestamps from 0, fed in batches
    of 7 rows (so episodes and gaps cross batch edges); `dropped` removes row r of episode e."""
    seconds, episodes = [], []
    for episode, n in enumerate(lengths):
        kept = [i for i in range(n) if (dropped or {}).get(episode) != i]
        seconds += [np.float32(i / FPS) for i in kept]
        episodes += [episode] * len(kept)
    accumulator = TimingAccumulator(FPS)
    for start in range(0, len(seconds), 7):
        accumulator.add(seconds[start : start + 7], episodes[start : start + 7])
    return timings_from_json(accumulator.to_json())  # through the JSON the metadata holds


def v2_video(episode: int, frames: int = 30, start: float = 0.0, camera: str = FRONT):
    key = f"videos/chunk-000/{camera}/episode_{episode:06d}.mp4"
    return VideoFacts(
        key=key,
        camera=camera,
        indices={"episode_index": episode},
        frames=frames,
        seconds=frames / FPS,
        fps=FPS,
        start_seconds=start,
        last_frame_seconds=start + (frames - 1) / FPS,
    )


def v3_video(frames: int, camera: str = FRONT) -> VideoFacts:
    return VideoFacts(
        key=f"videos/{camera}/chunk-000/file-000.mp4",
        camera=camera,
        indices={"chunk_index": 0, "file_index": 0},
        frames=frames,
        seconds=frames / FPS,
        fps=FPS,
        start_seconds=0.0,
        last_frame_seconds=(frames - 1) / FPS,
    )


def v3_table(lengths: list[int], end_offset: dict[int, float] | None = None) -> EpisodesTable:
    rows, start = [], 0.0
    for episode, n in enumerate(lengths):
        end = start + n / FPS
        rows.append(
            {
                "episode_index": episode,
                "length": n,
                f"videos/{FRONT}/chunk_index": 0,
                f"videos/{FRONT}/file_index": 0,
                f"videos/{FRONT}/from_timestamp": start,
                f"videos/{FRONT}/to_timestamp": end + (end_offset or {}).get(episode, 0.0),
            }
        )
        start = end
    return episodes_table(rows, [FRONT], "meta/episodes/chunk-000/file-000.parquet")


def v3(frames: int, lengths: list[int], end_offset: dict[int, float]):
    """One camera's concatenated mp4 of `frames` frames, episodes of `lengths` rows."""
    return check_sync(
        codebase_version="v3.0",
        fps=FPS,
        timings=timings(*lengths),
        videos=[v3_video(frames)],
        table=v3_table(lengths, end_offset=end_offset),
    )


def v2(videos, *lengths, **kwargs):
    return check_sync(
        codebase_version="v2.1", fps=FPS, timings=timings(*lengths, **kwargs), videos=videos
    )


def test_good_v21_and_v30_archives_have_no_finding():
    report = v2([v2_video(0), v2_video(1)], 30, 30)
    assert report.passed, report.findings
    assert [(r.episode, r.rows, r.frames, r.drift_frames) for r in report.rows] == [
        (0, 30, 30, 0),
        (1, 30, 30, 0),
    ]
    concatenated = v3(90, [30, 30, 30], end_offset={})
    assert concatenated.passed, concatenated.findings
    assert [r.frames for r in concatenated.rows] == [30, 30, 30]


def test_one_frame_either_way_is_allowed():
    assert v2([v2_video(0, frames=31)], 30).passed
    assert v2([v2_video(0, frames=29)], 30).passed


def test_a_camera_short_by_ten_percent_names_episode_camera_file_and_offset():
    report = v2([v2_video(0), v2_video(1, frames=27)], 30, 30)
    assert not report.passed
    assert report.failing == [f"episode 1 / {FRONT}"]
    key = f"videos/chunk-000/{FRONT}/episode_000001.mp4"
    assert (
        f"episode 1, camera {FRONT}: {key}: 27 frames for 30 rows: short by 3 frames (0.100 s)"
        in report.findings
    )
    assert any("ends early" in f and "-0.100 s, -3 frames" in f for f in report.findings)
    assert report.rows[1].drift_frames == -3 and report.rows[1].drift_seconds == -0.1


def test_a_camera_that_starts_late():
    report = v2([v2_video(0, start=0.5)], 30)
    (finding,) = report.findings
    assert finding.startswith(f"episode 0, camera {FRONT}: videos/")
    assert "starts late: its first frame is at 0.500 s, row 0 wants 0.000 s" in finding
    assert "+0.500 s, +15 frames" in finding
    assert report.rows[0].start_offset_seconds == 0.5


def test_a_frame_a_hair_off_the_rows_times_breaks_lerobots_tolerance():
    (finding,) = v2([v2_video(0, start=0.002)], 30).findings
    assert "nearest frame to row 0 (0.000000 s) is +0.002000 s away" in finding
    (finding,) = v2([v2_video(0, frames=31, start=-0.03)], 30).findings
    assert "nearest frame to row 0" in finding and "tolerance 0.0001 s" in finding


def test_a_dropped_row_is_a_timestamp_gap_naming_the_rows():
    report = v2([v2_video(0), v2_video(1)], 30, 30, dropped={1: 10})
    (finding,) = report.findings  # 29 rows for 30 frames is within ± 1
    assert finding.startswith("episode 1: timestamps not spaced 1/fps = 0.033333 s")
    assert "1 interval(s), the first 0.066667 s between rows 9 and 10" in finding
    assert "+0.033 s, +1 frames" in finding
    assert report.rows[1].timestamps != "ok" and report.rows[0].timestamps == "ok"


def test_timestamps_are_checked_without_cameras():
    report = check_sync(
        codebase_version="v3.0", fps=FPS, timings=timings(20, dropped={0: 3}), videos=[]
    )
    assert [r.camera for r in report.rows] == [""]
    assert len(report.findings) == 1 and "between rows 2 and 3" in report.findings[0]


def test_a_v30_range_off_by_a_second_names_the_episode():
    report = v3(60, [30, 30], end_offset={1: 1.0})
    assert report.failing == [f"episode 1 / {FRONT}"]
    (finding,) = report.findings
    assert finding == (
        f"episode 1, camera {FRONT}: videos/{FRONT}/chunk-000/file-000.mp4: the range "
        "from_timestamp..to_timestamp lasts 2.000 s, the 30 rows 1.000 s "
        "(offset +1.000 s, +30 frames)"
    )


def test_v30_overlapping_ranges_and_a_short_concatenated_file():
    report = v3(54, [30, 30], end_offset={0: 0.5})
    assert any("inside episode 0's" in f and "episode 1" in f for f in report.findings)
    short = [f for f in report.findings if "24 frames for 30 rows" in f]
    assert short and short[0].startswith(f"episode 1, camera {FRONT}")


def test_a_v30_archive_without_episodes_table_is_a_named_finding():
    report = check_sync(
        codebase_version="v3.0", fps=FPS, timings=timings(30, 30), videos=[v3_video(60)]
    )
    (finding,) = report.findings
    assert "no v3.0 episodes table" in finding and "assumed back to back" in finding
    assert [r.frames for r in report.rows] == [30, 30]  # still compared, as LeRobot writes


def test_an_unreadable_episodes_table_is_one_finding_not_one_per_episode():
    table = EpisodesTable("meta/episodes/chunk-000/file-000.parquet", problems=["unreadable"])
    report = check_sync(
        codebase_version="v3.0", fps=FPS, timings=timings(30, 30), videos=[v3_video(60)],
        table=table,
    )  # fmt: skip
    assert report.findings[0] == "unreadable" and len(report.findings) == 2
    assert "no v3.0 episodes table" in report.findings[1]


def test_an_inconsistent_episodes_table_is_named_not_a_crash():
    source = "meta/episodes/chunk-000/file-000.parquet"
    table = episodes_table(
        [
            {"episode_index": 0, "length": 25, f"videos/{FRONT}/chunk_index": 0},
            {"episode_index": None},
            {"episode_index": 3, "length": 30},
        ],
        [FRONT],
        source,
    )
    report = check_sync(
        codebase_version="v3.0", fps=FPS, timings=timings(30), videos=[v3_video(30)], table=table
    )
    findings = "\n".join(report.findings)
    assert f"{source}: episode 0: length 25, the data has 30 rows" in findings
    assert f"{source}: episode 3 is listed, the data has no rows" in findings
    assert f"{source}: row 1: field 'episode_index' is None" in findings
    assert f"videos/{FRONT}/from_timestamp" in findings
    assert "no v3.0 episodes table" in findings  # no usable range: placed back to back


def test_missing_and_unprobed_videos_and_videos_without_rows():
    broken = VideoFacts(key="videos/chunk-000/x/episode_000001.mp4", camera=FRONT,
                        indices={"episode_index": 1}, error="not a readable video")  # fmt: skip
    report = v2([v2_video(0), broken, v2_video(2)], 30, 30)
    findings = "\n".join(report.findings)
    assert "episode 1, camera" in findings and "not probed (not a readable video)" in findings
    assert "episode 2" in findings and "video without data rows" in findings
    missing = v2([v2_video(0)], 30, 30)
    assert missing.findings == [f"episode 1, camera {FRONT}: no video of camera {FRONT} for this "
                                "episode"]  # fmt: skip


def test_frames_lost_mid_file_show_in_the_last_frame_time():
    video = v2_video(0)
    gappy = VideoFacts(**{**video.__dict__, "last_frame_seconds": video.last_frame_seconds + 0.5})
    (finding,) = v2([gappy], 30).findings
    assert "frames missing mid-file" in finding and "+0.500 s, +15 frames" in finding


@pytest.mark.parametrize(
    ("path", "captured", "expected"),
    [
        ("videos/chunk-001/cam/episode_000007.mp4", {}, {"chunk_index": 1, "episode_index": 7}),
        ("video/cam/chunk-002/file-010.mp4", {}, {"chunk_index": 2, "file_index": 10}),
        ("videos/cam/chunk-000/file-003.mp4", {"file_index": 4}, {"chunk_index": 0,
                                                                  "file_index": 4}),
    ],
)  # fmt: skip
def test_path_indices(path, captured, expected):
    assert path_indices(path, captured) == expected


def test_files_absorbed_in_order_equal_one_stream():
    seconds = [i / FPS for i in range(20)]
    seconds[12] += 0.01  # off at row 12 (and the interval after it)
    whole = TimingAccumulator(FPS)
    whole.add(seconds, [0] * 20)
    joined = TimingAccumulator(FPS)
    for part in (seconds[:5], seconds[5:15], seconds[15:]):
        file = TimingAccumulator(FPS)
        file.add(part, [0] * len(part))
        joined.absorb(file)
    assert joined.to_json() == whole.to_json()
    assert whole.episodes[0].irregular == 2 and whole.episodes[0].first_irregular_row == 12


def test_rows_are_counted_without_fps():
    accumulator = TimingAccumulator(None)
    accumulator.add([0.0, 0.5, 0.7], None)
    assert accumulator.episodes[0].rows == 3 and accumulator.episodes[0].irregular == 0
