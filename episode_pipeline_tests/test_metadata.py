"""The contract's rules for episode metadata and the episode row, without servers."""

from episode_pipeline.episodes.episode_rows import (
    EDITABLE,
    NON_EDITABLE,
    REQUIRED_KEYS,
    entity_version_data,
    episode_columns,
    episode_metadata_items,
)
from episode_pipeline.lerobot.info import parse_info


def test_metadata_items_follow_the_contract():
    items = episode_metadata_items(
        first_task="Pick the cube", robot_type="so101", codebase_version="v3.0"
    )
    by_key = {item.meta_key: item for item in items}
    assert list(by_key) == list(REQUIRED_KEYS)
    assert by_key["episode_title"].value == "Pick the cube"
    assert {by_key[k].status for k in ("episode_title", "robot_type", "codebase_version")} == {
        NON_EDITABLE
    }
    editable = [
        "operator_name", "operator_id", "task", "group", "setting", "lighting", "clutter",
        "success_score", "descriptions",
    ]  # fmt: skip
    assert all(by_key[key].status == EDITABLE for key in editable)
    assert entity_version_data(items)[0] == {
        "meta_key": "episode_title",
        "value": "Pick the cube",
        "status": NON_EDITABLE,
    }


def test_episode_columns_take_the_first_files_and_info_totals():
    info = parse_info({"total_frames": 75, "fps": 30})
    columns = episode_columns(
        mp4_keys=["a/front.mp4", "a/wrist.mp4"], data_parquet_keys=["a/data/0.parquet"], info=info
    )
    assert columns.mp4_s3_path == "a/front.mp4"
    assert columns.parquet_s3_path == "a/data/0.parquet"
    assert (columns.frame_count, columns.fps, columns.duration_seconds) == (75, 30, 3)  # 2.5 → 3


def test_episode_columns_without_videos_or_fps():
    columns = episode_columns(mp4_keys=[], data_parquet_keys=[], info=parse_info({}))
    assert columns.mp4_s3_path is None and columns.duration_seconds is None
