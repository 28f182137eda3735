"""The sample writer's options for datasets in the wild write what they promise (no servers)."""

from __future__ import annotations

import json
import tarfile

import pyarrow.parquet as pq
import pytest
import zstandard

from episode_pipeline.lerobot.cameras import camera_for
from episode_pipeline.lerobot.features import features_from_info
from episode_pipeline.lerobot.info import parse_info
from episode_pipeline.samples.writer import SampleError, SampleSpec, pack_archive, write_dataset


def written(tmp_path, **options) -> tuple[dict, dict]:
    folder = tmp_path / "dataset"
    spec = SampleSpec(**{"cameras": 0, "seconds": 0.5, "fps": 10, **options})
    summary = write_dataset(folder, spec)
    return summary, json.loads((folder / "meta/info.json").read_text())


def test_v20_layout_has_one_stats_file(tmp_path):
    summary, info = written(tmp_path, codebase_version="v2.0", episodes=2)
    assert info["codebase_version"] == "v2.0"
    assert "meta/stats.json" in summary["files"]
    assert "meta/episodes_stats.jsonl" not in summary["files"]
    assert summary["data_files"] == [
        "data/chunk-000/episode_000000.parquet",
        "data/chunk-000/episode_000001.parquet",
    ]


@pytest.mark.parametrize(("state", "action"), [("state", "actions"), (None, "action")])
def test_state_and_action_keys_name_columns_and_features(tmp_path, state, action):
    summary, info = written(tmp_path, state_key=state, action_key=action)
    (data,) = summary["data_files"]
    columns = pq.read_schema(tmp_path / "dataset" / data).names
    for key in ("observation.state", "state", "action", "actions"):
        assert (key in columns) == (key in (state, action)) == (key in info["features"])
    features = features_from_info(parse_info(info))
    assert (features.state, features.action) == (state, action)


@pytest.mark.parametrize(
    ("style", "names"),
    [("nested", list), ("dict", dict), ("null", type(None)), ("flat", list)],
)
def test_names_styles(tmp_path, style, names):
    _, info = written(tmp_path, names_style=style)
    assert isinstance(info["features"]["observation.state"]["names"], names)
    if style == "nested":
        assert all(isinstance(group, list) for group in info["features"]["action"]["names"])


def test_claims_and_overrides_land_in_info_json(tmp_path):
    summary, info = written(
        tmp_path, cameras=1, claimed_codec="av1", info_overrides={"total_frames": 999}
    )
    assert info["total_frames"] == 999 and summary["total_frames"] == 5
    (camera,) = summary["cameras"]
    assert info["features"][camera]["info"]["video.codec"] == "av1"
    assert summary["codec"] == "h264"


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
def test_video_folder_and_fewer_video_episodes(tmp_path, version):
    summary, info = written(
        tmp_path, codebase_version=version, cameras=1, episodes=2, video_episodes=1,
        video_folder="video",
    )  # fmt: skip
    assert len(summary["data_files"]) == (2 if version == "v2.1" else 1)
    (video,) = summary["video_files"]
    assert video.startswith("video/") and info["video_path"].startswith("videos/")
    assert camera_for(video, parse_info(info)) == "observation.images.front"


def test_video_episodes_must_fit():
    with pytest.raises(SampleError, match="video_episodes"):
        SampleSpec(episodes=2, video_episodes=3).validate()


def test_extra_members_repeat_a_path_or_carry_raw_bytes(tmp_path):
    folder = tmp_path / "meta"
    folder.mkdir()
    (folder / "info.json").write_text("{}")
    out = tmp_path / "hostile.tar.zst"
    names = pack_archive(
        folder, out, root_folder="ds", extra_members=[("info.json", b"{}"), (b"caf\xe9", b"")]
    )
    assert names == ["ds/info.json", "ds/info.json", "ds/caf\udce9"]
    with (
        out.open("rb") as raw,
        zstandard.ZstdDecompressor().stream_reader(raw) as stream,
        tarfile.open(fileobj=stream, mode="r|", errors="surrogateescape") as tar,
    ):
        read = [member.name for member in tar]
    assert read == names
    assert read[2].encode("utf-8", "surrogateescape") == b"ds/caf\xe9"


def test_out_of_sync_options_write_what_they_promise(tmp_path):
    from episode_pipeline.video.probe import probe

    summary, _ = written(
        tmp_path, codebase_version="v2.1", cameras=2, episodes=2, fps=10, seconds=1.0,
        short_cameras={0: 0.1}, late_cameras={1: 0.5}, dropped_rows=[(1, 4)],
    )  # fmt: skip
    folder = tmp_path / "dataset"
    front, wrist = (
        probe(folder / f"videos/chunk-000/observation.images.{name}/episode_000000.mp4")
        for name in ("front", "wrist")
    )
    assert (front.frames, front.start_seconds) == (9, 0.0)
    assert (wrist.frames, wrist.start_seconds) == (10, 0.5)
    second = pq.read_table(folder / summary["data_files"][1]).column("frame_index").to_pylist()
    assert 4 not in second and len(second) == 9
    assert summary["total_frames"] == 19
    episodes = (folder / "meta/episodes.jsonl").read_text().splitlines()
    assert [json.loads(line)["length"] for line in episodes] == [10, 9]


def test_range_end_offsets_move_a_v30_episodes_to_timestamp(tmp_path):
    written(tmp_path, cameras=1, episodes=2, fps=10, seconds=1.0, range_end_offsets={1: 1.0})
    table = pq.read_table(tmp_path / "dataset/meta/episodes/chunk-000/file-000.parquet")
    column = "videos/observation.images.front/to_timestamp"
    assert table.column(column).to_pylist() == [1.0, 3.0]
