"""The tolerant info.json reader."""

from __future__ import annotations

import json

import pytest

from episode_pipeline.lerobot.info import DatasetInfoError, parse_info

V30_INFO = {
    "codebase_version": "v3.0",
    "robot_type": "so101_follower",
    "total_episodes": 2,
    "total_frames": 240,
    "total_tasks": 1,
    "chunks_size": 1000,
    "data_files_size_in_mb": 100,
    "video_files_size_in_mb": 500,
    "fps": 30,
    "splits": {"train": "0:2"},
    "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
    "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
    "features": {
        "action": {"dtype": "float32", "shape": [6], "names": {"motors": ["a", "b"]}},
        "observation.state": {"dtype": "float32", "shape": [6], "names": None},
        "observation.images.front": {
            "dtype": "video",
            "shape": [480, 640, 3],
            "names": ["height", "width", "channels"],
            "info": {
                "video.height": 480,
                "video.width": 640,
                "video.codec": "av1",
                "video.pix_fmt": "yuv420p",
                "video.fps": 30,
                "has_audio": False,
            },
        },
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    },
    "some_future_key": [1, 2, 3],
}


def test_v30_info_fields():
    info = parse_info(json.dumps(V30_INFO).encode())
    assert info.codebase_version == "v3.0"
    assert info.robot_type == "so101_follower"
    assert info.fps == 30.0
    assert info.total_frames == 240
    assert info.total_episodes == 2
    assert info.duration_seconds == 8
    assert info.video_path.startswith("videos/{video_key}")
    assert info.camera_keys == ("observation.images.front",)
    front = info.video_features["observation.images.front"]
    assert (front.width, front.height, front.codec, front.fps, front.has_audio) == (
        640,
        480,
        "av1",
        30.0,
        False,
    )
    assert info.raw["some_future_key"] == [1, 2, 3]


def test_video_info_block_spelling_and_image_cameras():
    raw = {
        "fps": "15",
        "features": {
            "observation.image": {
                "dtype": "video",
                "video_info": {"video.fps": 15.0, "video.codec": "h264", "video.width": 96},
            }
        },
    }
    info = parse_info(raw)
    assert info.fps == 15.0
    assert info.video_features["observation.image"].codec == "h264"
    assert info.video_features["observation.image"].width == 96
    images_only = parse_info({"features": {"image": {"dtype": "image", "shape": [96, 96, 3]}}})
    assert images_only.camera_keys == ("image",)


def test_duration_rounds_half_up():
    assert parse_info({"total_frames": 75, "fps": 30}).duration_seconds == 3
    assert parse_info({"total_frames": 74, "fps": 30}).duration_seconds == 2


def test_missing_fields_are_none():
    info = parse_info(b"{}")
    assert info.codebase_version is None
    assert info.fps is None
    assert info.total_frames is None
    assert info.duration_seconds is None
    assert info.video_path is None
    assert info.camera_keys == ()


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"fps": "fast"}, "'fps'"),
        ({"fps": 0}, "'fps'"),
        ({"fps": True}, "'fps'"),
        ({"total_frames": 12.5}, "'total_frames'"),
        ({"total_frames": -1}, "'total_frames'"),
        ({"features": []}, "'features'"),
        ({"features": {"cam": "video"}}, "'features.cam'"),
        ({"video_path": ["x"]}, "'video_path'"),
        (
            {"features": {"cam": {"dtype": "video", "info": {"video.width": "wide"}}}},
            "'features.cam.info.video.width'",
        ),
    ],
)
def test_bad_values_name_file_and_field(raw, field):
    with pytest.raises(DatasetInfoError) as error:
        parse_info(json.dumps(raw).encode(), source="ds/meta/info.json")
    assert str(error.value).startswith("ds/meta/info.json:")
    assert field in str(error.value)


def test_not_json_names_the_file():
    with pytest.raises(DatasetInfoError, match=r"^up/meta/info\.json: not valid JSON"):
        parse_info(b"{nope", source="up/meta/info.json")
    with pytest.raises(DatasetInfoError, match="top level"):
        parse_info(b"[1]", source="up/meta/info.json")
