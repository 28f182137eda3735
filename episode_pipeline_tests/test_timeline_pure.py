"""The episode's timeline (episodes/timeline.py) from facts written by hand: no servers."""

from __future__ import annotations

import dataclasses
import json
import math

import polars as pl
import pytest

from episode_pipeline.episodes.timeline import (
    EVERY_FRAME,
    MAX_POINTS,
    MINMAX,
    CameraSource,
    CameraTrack,
    EpisodeSeries,
    SeriesCollector,
    build_timeline,
    feature_names,
    minmax_downsample,
)
from episode_pipeline.lerobot.frames import FrameDataError
from episode_pipeline.lerobot.sync import check_sync, place_episodes
from episode_pipeline_tests.test_lerobot_sync import (
    FPS,
    FRONT,
    timings,
    v2_video,
    v3_table,
    v3_video,
)


def test_up_to_max_points_every_frame_is_kept_as_it_is():
    t = [i / FPS for i in range(MAX_POINTS)]
    values = pl.DataFrame({"d0": [float(i) for i in range(MAX_POINTS)]})
    sampled = minmax_downsample(t, values)
    assert (sampled.sampling, sampled.bucket_frames) == (EVERY_FRAME, 1)
    assert sampled.t == t and sampled.dims[0] == values["d0"].to_list()


def test_beyond_max_points_every_peak_survives_in_the_order_it_happens():
    frames = 18_000  # 10 minutes at 30 fps
    t = [i / FPS for i in range(frames)]
    wave = [math.sin(i / 50) for i in range(frames)]
    wave[9_001], wave[9_004] = -7.0, 5.0  # a dip, then a spike, inside one bucket
    wave[17_999] = 3.0  # the very last frame
    sampled = minmax_downsample(t, pl.DataFrame({"d0": wave, "d1": [None] * frames}))
    assert sampled.sampling == MINMAX and sampled.bucket_frames == 10
    assert len(sampled.t) == len(sampled.dims[0]) == MAX_POINTS
    kept = sampled.dims[0]
    assert max(kept) == 5.0 and min(kept) == -7.0 and kept[-1] == 3.0
    dip = kept.index(-7.0)
    assert kept[dip + 1] == 5.0  # min before max: as it happened
    # each value sits at its bucket's first or last frame: within one bucket of the truth
    assert abs(sampled.t[dip] - 9_001 / FPS) < 10 / FPS
    assert sampled.dims[1] == [None] * MAX_POINTS  # a missing joint stays a gap


def test_the_collector_splits_rows_by_episode_across_batches():
    collector = SeriesCollector()
    collector.add(
        pl.DataFrame(
            {
                "timestamp": [0.0, 1 / 30, 0.0],
                "episode_index": [0, 0, 1],
                "observation.state": [[1.0, 2.0], None, [3.0, 4.0]],
                "action": [0.5, 0.6, 0.7],  # a scalar action
            }
        ),
        "observation.state",
        "action",
    )
    collector.add(pl.DataFrame({"timestamp": [1 / 30], "episode_index": [1]}), None, None)
    first, second = collector.series()
    assert (first.index, first.timestamps, first.state) == (0, [0.0, 1 / 30], [[1.0, 2.0], []])
    assert first.action == [[0.5], [0.6]]
    assert (second.index, len(second.timestamps), second.state) == (1, 2, [[3.0, 4.0], []])


def test_a_file_with_a_bad_timestamp_is_refused_whole_and_files_join_in_order():
    whole, bad = SeriesCollector(), SeriesCollector()
    with pytest.raises(FrameDataError, match="timestamp"):
        bad.add(pl.DataFrame({"timestamp": [0.0, float("nan")]}), None, None)
    for start in (0, 2):
        part = SeriesCollector()
        part.add(pl.DataFrame({"timestamp": [start / 30, (start + 1) / 30]}), None, None)
        whole.extend(part)
    (only,) = whole.series()
    assert only.timestamps == [0.0, 1 / 30, 2 / 30, 3 / 30]


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["a", "b"], ["a", "b"]),
        ({"motors": ["a", "b"]}, ["a", "b"]),
        ([["a", "b"]], ["a", "b"]),
        (None, None),
        ({"x": 1, "y": 2}, None),
    ],
)
def test_joint_names_come_from_info_json_in_each_shape_lerobot_writes(names, expected):
    assert feature_names({"dtype": "float32", "names": names}) == expected


def series(index: int, rows: int) -> EpisodeSeries:
    return EpisodeSeries(
        index,
        [i / FPS for i in range(rows)],
        [[float(i), -float(i)] for i in range(rows)],
        [[0.1] for _ in range(rows)],
    )


def camera(sources: list[tuple[str, float, float]]) -> CameraTrack:
    return CameraTrack(
        name=FRONT,
        master=f"hls/{FRONT}/master.m3u8",
        playlist=f"hls/{FRONT}/playlist.m3u8",
        poster=f"hls/{FRONT}/poster.jpg",
        storyboard={"image": f"hls/{FRONT}/storyboard.jpg", "vtt": f"hls/{FRONT}/storyboard.vtt"},
        seconds=sources[-1][2],
        sources=[CameraSource(key, start, end, FPS) for key, start, end in sources],
    )


def test_v21_episodes_each_play_their_own_mp4_at_its_place_in_the_stream():
    # Two episodes of 30 rows, one mp4 each; the second camera file starts late (0.5 s).
    videos = [v2_video(0), v2_video(1, frames=15, start=0.5)]
    found = timings(30, 30)
    placements, _ = place_episodes("v2.1", FPS, found, videos)
    report = check_sync(codebase_version="v2.1", fps=FPS, timings=found, videos=videos)
    document = build_timeline(
        episode="acme/ep-1",
        fps=FPS,
        codebase_version="v2.1",
        series=[series(0, 30), series(1, 30)],
        cameras=[camera([(videos[0].key, 0.0, 1.0), (videos[1].key, 1.0, 1.5)])],
        placements=placements,
        findings=report.located,
        names={"state": ["shoulder", "elbow"], "action": None},
    )
    document = json.loads(json.dumps(document, allow_nan=False))  # it is JSON, NaN-free
    assert (document["format"], document["version"], document["fps"]) == (
        "episode_pipeline/timeline",
        1,
        FPS,
    )
    first, second = document["episodes"]
    assert (first["start"], first["end"], first["frames"]) == (0.0, 1.0, 30)
    assert first["cameras"][FRONT] == {
        "source": videos[0].key,
        "offset": 0.0,
        "start": 0.0,
        "end": 1.0,
    }
    # The late file's frame k plays at 1.0 + k/30 in the stream; row t wants file time t,
    # which is stream time 1.0 - 0.5 + t: the camera has frames from t = 0.5 only.
    assert second["cameras"][FRONT] == {
        "source": videos[1].key,
        "offset": 0.5,
        "start": 1.0,
        "end": 1.5,
    }
    assert first["series"]["state"]["names"] == ["shoulder", "elbow"]
    assert first["series"]["state"]["values"][1][:3] == [0.0, -1.0, -2.0]
    assert first["series"]["action"] == {"names": ["0"], "values": [[0.1] * 30]}
    assert first["findings"] == []
    late = [f for f in second["findings"] if "starts late" in f["message"]]
    assert late and (late[0]["camera"], late[0]["start"], late[0]["end"]) == (FRONT, 0.0, 0.5)
    assert [f["episode"] for f in second["findings"]] == [1] * len(second["findings"])
    assert document["cameras"][0]["sources"] == [
        {"key": videos[0].key, "start": 0.0, "end": 1.0},
        {"key": videos[1].key, "start": 1.0, "end": 1.5},
    ]


def test_v30_episodes_are_ranges_of_one_concatenated_mp4():
    found = timings(30, 60)
    videos = [v3_video(90)]
    table = v3_table([30, 60])
    placements, _ = place_episodes("v3.0", FPS, found, videos, table)
    document = build_timeline(
        episode="acme/ep-1",
        fps=FPS,
        codebase_version="v3.0",
        series=[series(0, 30), series(1, 60)],
        cameras=[camera([(videos[0].key, 0.0, 3.0)])],
        placements=placements,
        findings=[],
    )
    ranges = [e["cameras"][FRONT] for e in document["episodes"]]
    assert [(r["offset"], r["start"], r["end"]) for r in ranges] == [
        (0.0, 0.0, 1.0),
        (1.0, 1.0, 3.0),
    ]


def test_a_short_camera_is_found_at_the_end_of_its_episode():
    found = timings(30)
    report = check_sync(
        codebase_version="v2.1", fps=FPS, timings=found, videos=[v2_video(0, frames=21)]
    )
    short = next(f for f in report.located if "short by 9 frames" in f.message)
    assert (short.episode, short.camera) == (0, FRONT)
    assert (short.start, short.end) == pytest.approx((0.7, 1.0))


def test_a_timestamp_gap_is_found_where_it_is():
    report = check_sync(
        codebase_version="v2.1",
        fps=FPS,
        timings=timings(30, dropped={0: 10}),
        videos=[v2_video(0, frames=29)],
    )
    gap = next(f for f in report.located if "timestamps not spaced" in f.message)
    assert (gap.episode, gap.camera) == (0, None)
    assert (gap.start, gap.end) == pytest.approx((9 / FPS, 11 / FPS), abs=1e-5)
    assert report.findings == [f.message for f in report.located]


def test_missing_and_non_finite_values_are_null_and_floats_print_as_float32():
    item = EpisodeSeries(0, [0.0, 1 / 30, 2 / 30], [[0.1, math.nan], [math.inf], []], [])
    document = build_timeline(
        episode="acme/ep-1",
        fps=FPS,
        codebase_version="v2.1",
        series=[item],
        cameras=[],
        placements={},
        findings=[],
    )
    text = json.dumps(document, allow_nan=False)  # raises on a NaN left in
    state = json.loads(text)["episodes"][0]["series"]["state"]
    assert state["values"] == [[0.1, None, None], [None, None, None]]
    assert json.loads(text)["episodes"][0]["series"]["action"] is None


def test_the_same_facts_make_the_same_bytes_whatever_order_the_cameras_ended_in():
    """The transcode reports cameras as they finish (found by reprocessing an episode: its
    timeline.json changed though nothing else did)."""
    front = camera([("videos/front.mp4", 0.0, 1.0)])
    wrist = dataclasses.replace(front, name="observation.images.wrist")

    def document(cameras: list[CameraTrack]) -> str:
        built = build_timeline(
            episode="acme/ep-1",
            fps=FPS,
            codebase_version="v3.0",
            series=[series(0, 30)],
            cameras=cameras,
            placements={},
            findings=[],
        )
        return json.dumps(built)

    assert document([front, wrist]) == document([wrist, front])
