"""The storyboard's plan, its WebVTT and its branch of the camera's FFmpeg command (no servers)."""

from __future__ import annotations

import itertools
import re

import pytest

from episode_pipeline.episodes.hls_tables import (
    INLINE_MARKDOWN_CHARACTERS,
    source_rows,
    storyboard_markdown,
)
from episode_pipeline.storage.links import BucketLinks
from episode_pipeline.transcode.job import SourceVideo, StoryboardFacts, TranscodeResult
from episode_pipeline.video.probe import VideoProbe
from episode_pipeline.video.storyboard import MAX_TILES, choose_interval, plan_storyboard
from episode_pipeline_tests.test_video_pure import command_for, option

CUE = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d{3}) --> (\d\d):(\d\d):(\d\d)\.(\d{3})$")


def cues(vtt: str) -> list[tuple[float, float, str]]:
    """(start, end, payload) of every cue, read back from the text."""
    lines = vtt.split("\n")
    assert lines[0] == "WEBVTT"
    found = []
    for index, line in enumerate(lines):
        if match := CUE.match(line):
            h1, m1, s1, ms1, h2, m2, s2, ms2 = (int(g) for g in match.groups())
            found.append(
                (
                    h1 * 3600 + m1 * 60 + s1 + ms1 / 1000,
                    h2 * 3600 + m2 * 60 + s2 + ms2 / 1000,
                    lines[index + 1],
                )
            )
    return found


@pytest.mark.parametrize(
    ("seconds", "interval"),
    [(0.5, 1), (68.0, 1), (100.0, 1), (100.5, 2), (600.0, 10), (3600.0, 60), (400_000.0, 4000)],
)
def test_the_interval_keeps_an_episode_at_most_a_hundred_tiles(seconds, interval):
    assert choose_interval(seconds) == interval
    assert plan_storyboard(seconds, 30.0, 640, 480).tiles <= MAX_TILES


def test_a_68_second_camera_gets_a_tile_a_second_in_rows_of_ten():
    board = plan_storyboard(68.0, 30.0, 640, 480)
    assert (board.interval, board.tiles, board.columns, board.rows) == (1, 68, 10, 7)
    assert (board.tile_width, board.tile_height, board.width, board.height) == (160, 120, 1600, 840)


def test_tiles_run_to_the_last_frame_not_past_it():
    # 12 s at 30 fps: the last frame is at 11.967 s, so tile 12 (at 12 s) would be empty.
    assert plan_storyboard(12.0, 30.0, 640, 480).tiles == 12
    assert plan_storyboard(12.04, 30.0, 640, 480).tiles == 13
    assert plan_storyboard(0.5, 30.0, 640, 480).tiles == 1  # always the first frame


def test_the_vtt_maps_each_interval_to_its_tile_and_ends_with_the_video():
    board = plan_storyboard(13.5, 30.0, 1280, 720)
    found = cues(board.vtt())
    assert len(found) == board.tiles == 14
    assert found[0] == (0.0, 1.0, "storyboard.jpg#xywh=0,0,160,90")
    assert found[9][2] == "storyboard.jpg#xywh=1440,0,160,90"
    assert found[10] == (10.0, 11.0, "storyboard.jpg#xywh=0,90,160,90")
    assert found[-1] == (13.0, 13.5, "storyboard.jpg#xywh=480,90,160,90")
    # back to back, no gap or overlap
    assert all(a[1] == b[0] for a, b in itertools.pairwise(found))


def test_vtt_timestamps_pass_an_hour():
    board = plan_storyboard(3725.0, 30.0, 640, 480)
    assert cues(board.vtt())[-1][:2] == (3720.0, 3725.0)
    assert "01:02:00.000 --> 01:02:05.000" in board.vtt()


def test_the_storyboard_is_one_more_branch_of_the_same_decode():
    board = plan_storyboard(20.0, 30.0, 1280, 720)
    _, cmd = command_for(1280, 720, 30.0, poster=True, storyboard=board)
    assert cmd.count("-i") == 1  # one input, decoded once
    graph = option(cmd, "-filter_complex")
    assert graph.startswith("[0:v:0]split=6[s0][s1][s2][s3][s4][s5];")
    assert (
        "[s5]select='gte(t,selected_n*1)',scale=160:90:flags=bicubic,setsar=1,"
        "tile=10x2,format=yuvj420p[v5]"
    ) in graph
    assert cmd[-10:] == [
        "-map", "[v5]", "-an", "-frames:v", "1", "-q:v", "5", "-update", "1",
        "/out/storyboard.jpg",
    ]  # fmt: skip
    assert "/out/poster.jpg" in cmd  # the poster keeps its own output


def result_with(sources: list[float], storyboard: StoryboardFacts | None) -> TranscodeResult:
    return TranscodeResult(
        camera="observation.images.front",
        playlist_key="p/playlist.m3u8",
        storyboard=storyboard,
        sources=[
            SourceVideo(
                f"p/episode_{i:06d}.mp4", VideoProbe("h264", 640, 480, round(s * 1000), 30, 30.0)
            )
            for i, s in enumerate(sources)
        ],
    )


def test_every_source_is_named_with_its_range_in_the_stream():
    rows = source_rows(result_with([13.6, 13.6, 14.0], None))
    assert [r["key"] for r in rows] == [f"p/episode_{i:06d}.mp4" for i in range(3)]
    assert [(r["stream_start_seconds"], r["stream_end_seconds"]) for r in rows] == [
        (0.0, 13.6),
        (13.6, 27.2),
        (27.2, 41.2),
    ]


def test_the_message_round_trip_keeps_the_storyboard():
    facts = StoryboardFacts("p/storyboard.jpg", "p/storyboard.vtt", 1, 41, 160, 120)
    result = result_with([41.0], facts)
    assert TranscodeResult.from_message(result.to_message()).storyboard == facts


def test_locally_the_storyboard_shows_inline_as_an_image_under_dagsters_limit():
    from episode_pipeline.storage.aws import aws_client
    from episode_pipeline_tests.test_ui_metadata import LOCAL

    links = BucketLinks("data", LOCAL.region, LOCAL.endpoint_url, client=aws_client("s3", LOCAL))
    facts = StoryboardFacts(
        "orgs/acme/episodes/ep-1/processed/hls/observation.images.front/storyboard.jpg",
        "orgs/acme/episodes/ep-1/processed/hls/observation.images.front/storyboard.vtt",
        1,
        41,
        160,
        120,
    )
    text = storyboard_markdown(result_with([41.0], facts), links)
    assert text is not None and text.startswith("![observation.images.front storyboard](http")
    assert len(text) < INLINE_MARKDOWN_CHARACTERS
    assert "41 tiles, one every 1 s" in text


def test_on_aws_the_storyboard_is_a_console_link_and_none_without_one():
    links = BucketLinks("data", "eu-west-1")
    facts = StoryboardFacts("k/storyboard.jpg", "k/storyboard.vtt", 10, 60, 160, 120)
    text = storyboard_markdown(result_with([600.0], facts), links)
    assert text is not None and text.startswith("[storyboard.jpg](https://console.aws.amazon.com/")
    assert storyboard_markdown(result_with([1.0], None), links) is None
