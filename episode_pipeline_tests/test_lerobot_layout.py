"""Finding the dataset root inside an archive and classifying its members."""

from __future__ import annotations

import pytest

from episode_pipeline.lerobot.layout import (
    ArchiveLayout,
    MemberKind,
    find_dataset_roots,
    member_kind,
    natural_key,
    should_keep,
)

V30 = [
    "meta/info.json",
    "meta/tasks.parquet",
    "meta/stats.json",
    "meta/episodes/chunk-000/file-000.parquet",
    "data/chunk-000/file-000.parquet",
    "videos/observation.images.front/chunk-000/file-000.mp4",
    "README.md",
]


def test_root_without_top_level_folder():
    layout = ArchiveLayout.from_paths(V30)
    assert layout.roots == ("",)
    assert layout.root == ""
    assert [m.relative for m in layout.data_parquets] == ["data/chunk-000/file-000.parquet"]
    assert layout.info_json.path == "meta/info.json"
    assert layout.task_table.path == "meta/tasks.parquet"


def test_root_with_top_level_folder_and_info_json_streamed_last():
    paths = [f"my_dataset/{p}" for p in reversed(V30)]
    layout = ArchiveLayout.from_paths(paths)
    assert layout.roots == ("my_dataset",)
    kinds = {m.relative: m.kind for m in layout.members}
    assert kinds == {
        "meta/info.json": MemberKind.METADATA,
        "meta/tasks.parquet": MemberKind.OTHER_PARQUET,
        "meta/stats.json": MemberKind.SKIPPED,
        "meta/episodes/chunk-000/file-000.parquet": MemberKind.OTHER_PARQUET,
        "data/chunk-000/file-000.parquet": MemberKind.DATA_PARQUET,
        "videos/observation.images.front/chunk-000/file-000.mp4": MemberKind.VIDEO,
        "README.md": MemberKind.SKIPPED,
    }
    assert (
        layout.videos[0].path == "my_dataset/videos/observation.images.front/chunk-000/file-000.mp4"
    )


def test_top_level_folder_called_data_does_not_make_meta_parquets_frame_data():
    paths = [f"data/{p}" for p in V30]
    layout = ArchiveLayout.from_paths(paths)
    assert layout.roots == ("data",)
    assert [m.path for m in layout.data_parquets] == ["data/data/chunk-000/file-000.parquet"]
    # Same answer at stream time, before the root is known:
    assert member_kind("data/meta/tasks.parquet") is MemberKind.OTHER_PARQUET
    assert member_kind("data/data/chunk-000/file-000.parquet") is MemberKind.DATA_PARQUET


def test_several_datasets_in_one_archive():
    paths = [f"a/{p}" for p in V30] + [f"b/nested/{p}" for p in V30]
    layout = ArchiveLayout.from_paths(paths)
    assert layout.roots == ("a", "b/nested")
    assert [(m.root, m.relative) for m in layout.data_parquets] == [
        ("a", "data/chunk-000/file-000.parquet"),
        ("b/nested", "data/chunk-000/file-000.parquet"),
    ]


def test_no_info_json_still_classifies_by_path():
    layout = ArchiveLayout.from_paths(["x/data/chunk-000/episode_000000.parquet", "x/v/c.mp4"])
    assert layout.roots == ()
    assert layout.root is None
    assert layout.info_json is None
    assert [m.kind for m in layout.members] == [MemberKind.DATA_PARQUET, MemberKind.VIDEO]


def test_data_parquets_come_in_natural_order():
    paths = ["meta/info.json"] + [f"data/chunk-000/file-{i}.parquet" for i in (10, 2, 1)]
    layout = ArchiveLayout.from_paths(paths)
    assert [m.relative for m in layout.data_parquets] == [
        "data/chunk-000/file-1.parquet",
        "data/chunk-000/file-2.parquet",
        "data/chunk-000/file-10.parquet",
    ]
    assert natural_key("a2") < natural_key("a10")


def test_v21_task_table_is_the_jsonl():
    layout = ArchiveLayout.from_paths(["ds/meta/info.json", "ds/meta/tasks.jsonl"])
    assert layout.task_table.relative == "meta/tasks.jsonl"


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("videos/chunk-000/observation.image/episode_000000.mp4", MemberKind.VIDEO),
        ("CAM.MP4", MemberKind.VIDEO),
        ("data/chunk-000/episode_000000.parquet", MemberKind.DATA_PARQUET),
        ("root/data/chunk-000/file-000.parquet", MemberKind.DATA_PARQUET),
        ("meta/tasks.parquet", MemberKind.OTHER_PARQUET),
        ("root/meta/episodes/chunk-000/file-000.parquet", MemberKind.OTHER_PARQUET),
        ("metadata.parquet", MemberKind.OTHER_PARQUET),
        ("root/meta/info.json", MemberKind.METADATA),
        ("meta/tasks.jsonl", MemberKind.METADATA),
        ("meta/episodes.jsonl", MemberKind.METADATA),
        ("meta/episodes_stats.jsonl", MemberKind.SKIPPED),
        ("info.json", MemberKind.SKIPPED),
        ("images/observation.image/episode_000000/frame_000000.png", MemberKind.SKIPPED),
    ],
)
def test_member_kind(path, kind):
    assert member_kind(path) is kind
    assert should_keep(path) is (kind is not MemberKind.SKIPPED)


def test_find_dataset_roots_shallowest_first():
    assert find_dataset_roots(["z/meta/info.json", "meta/info.json", "a/b/meta/info.json"]) == [
        "",
        "z",
        "a/b",
    ]
