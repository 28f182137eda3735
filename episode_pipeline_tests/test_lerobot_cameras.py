"""camera_for: template first, then a feature-key component, then the grandparent folder."""

from __future__ import annotations

import pytest

from episode_pipeline.lerobot.cameras import (
    camera_for,
    compile_path_template,
    locate_video,
)
from episode_pipeline.lerobot.info import parse_info

V30 = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
V21 = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"


def info(video_path, *keys, dtype="video"):
    return parse_info({"video_path": video_path, "features": {k: {"dtype": dtype} for k in keys}})


def test_v30_camera_is_two_levels_up_via_template():
    i = info(V30, "observation.images.front", "observation.images.wrist")
    loc = locate_video("videos/observation.images.wrist/chunk-000/file-003.mp4", i)
    assert loc.camera == "observation.images.wrist"
    assert loc.rule == "template"
    assert dict(loc.indices) == {"chunk_index": 0, "file_index": 3}


def test_v21_camera_is_the_parent_via_template():
    i = info(V21, "observation.images.front")
    loc = locate_video("videos/chunk-001/observation.images.front/episode_001234.mp4", i)
    assert loc.camera == "observation.images.front"
    assert dict(loc.indices) == {"episode_chunk": 1, "episode_index": 1234}


def test_top_level_folder_in_path_or_given_as_root():
    i = info(V21, "observation.image")
    path = "upload/videos/chunk-000/observation.image/episode_000000.mp4"
    assert camera_for(path, i) == "observation.image"
    assert camera_for(path, i, root="upload") == "observation.image"


def test_non_standard_key_without_prefix():
    i = info(V30, "image")
    assert camera_for("videos/image/chunk-000/file-000.mp4", i) == "image"


def test_template_mismatch_falls_back_to_feature_component():
    i = info(V30, "observation.images.top")
    # Written with the v2.1 layout although info.json says v3.0:
    loc = locate_video("videos/chunk-000/observation.images.top/episode_000000.mp4", i)
    assert (loc.camera, loc.rule) == ("observation.images.top", "feature_component")


def test_captured_key_not_a_video_feature_falls_back():
    i = info(V30, "observation.images.front")
    loc = locate_video("videos/depth/chunk-000/file-000.mp4", i)
    assert (loc.camera, loc.rule) == ("depth", "grandparent")


def test_grandparent_then_cam_main():
    assert camera_for("clips/left/take1/a.mp4") == "left"
    assert camera_for("left/a.mp4") == "cam_main"
    assert camera_for("a.mp4") == "cam_main"
    assert camera_for("a.mp4", info(V30, "x")) == "cam_main"


def test_without_info_the_default_templates_still_work():
    assert camera_for("videos/chunk-000/observation.images.side/episode_000007.mp4") == (
        "observation.images.side"
    )
    assert camera_for("videos/observation.images.side/chunk-000/file-000.mp4") == (
        "observation.images.side"
    )


def test_image_dtype_cameras_are_accepted():
    i = info(V21, "observation.image", dtype="image")
    assert camera_for("videos/chunk-000/observation.image/episode_000000.mp4", i) == (
        "observation.image"
    )


def test_each_camera_of_a_v30_archive_by_template():
    i = info(V30, "a", "b")
    paths = ["videos/a/chunk-000/file-000.mp4", "videos/b/chunk-000/file-000.mp4"]
    assert [camera_for(path, i) for path in paths] == ["a", "b"]


@pytest.mark.parametrize("bad", ["videos/{video_key", "videos/{0.__class__}/x.mp4"])
def test_malformed_template_falls_back(bad):
    assert compile_path_template("videos/{video_key") is None
    i = info(bad, "cam")
    assert camera_for("videos/cam/chunk-000/file-000.mp4", i) == "cam"


def test_repeated_template_field_must_match_itself():
    regex = compile_path_template("v/{video_key}/{video_key}.mp4")
    assert regex.fullmatch("v/a/a.mp4")
    assert not regex.fullmatch("v/a/b.mp4")
