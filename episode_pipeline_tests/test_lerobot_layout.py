"""Finding the dataset root inside an archive, classifying its members, and ordering them."""

from __future__ import annotations

import pytest

from episode_pipeline.episodes.extracted_files import (
    DATA,
    VIDEO,
    ArchiveObject,
    ExtractedFiles,
    ProcessedFile,
    videos_by_camera,
)
from episode_pipeline.lerobot.layout import (
    MemberKind,
    find_dataset_roots,
    member_kind,
    path_order,
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
V30_KINDS = {
    "meta/info.json": MemberKind.METADATA,
    "meta/tasks.parquet": MemberKind.OTHER_PARQUET,
    "meta/stats.json": MemberKind.SKIPPED,
    "meta/episodes/chunk-000/file-000.parquet": MemberKind.OTHER_PARQUET,
    "data/chunk-000/file-000.parquet": MemberKind.DATA_PARQUET,
    "videos/observation.images.front/chunk-000/file-000.mp4": MemberKind.VIDEO,
    "README.md": MemberKind.SKIPPED,
}


def test_root_without_top_level_folder():
    assert find_dataset_roots(V30) == [""]
    assert {path: member_kind(path) for path in V30} == V30_KINDS


def test_root_with_top_level_folder_and_info_json_streamed_last():
    paths = [f"my_dataset/{p}" for p in reversed(V30)]
    assert find_dataset_roots(paths) == ["my_dataset"]
    kinds = {path.removeprefix("my_dataset/"): member_kind(path) for path in paths}
    assert kinds == V30_KINDS


def test_top_level_folder_called_data_does_not_make_meta_parquets_frame_data():
    paths = [f"data/{p}" for p in V30]
    assert find_dataset_roots(paths) == ["data"]
    data = [p for p in paths if member_kind(p) is MemberKind.DATA_PARQUET]
    assert data == ["data/data/chunk-000/file-000.parquet"]
    assert member_kind("data/meta/tasks.parquet") is MemberKind.OTHER_PARQUET


def test_several_datasets_in_one_archive():
    paths = [f"a/{p}" for p in V30] + [f"b/nested/{p}" for p in V30]
    assert find_dataset_roots(paths) == ["a", "b/nested"]
    assert [p for p in paths if member_kind(p) is MemberKind.DATA_PARQUET] == [
        "a/data/chunk-000/file-000.parquet",
        "b/nested/data/chunk-000/file-000.parquet",
    ]


def test_no_info_json_still_classifies_by_path():
    paths = ["x/data/chunk-000/episode_000000.parquet", "x/v/c.mp4"]
    assert find_dataset_roots(paths) == []
    assert [member_kind(p) for p in paths] == [MemberKind.DATA_PARQUET, MemberKind.VIDEO]


@pytest.mark.parametrize(
    "ordered",
    [
        [
            "data/chunk-000/file-1.parquet",
            "data/chunk-000/file-2.parquet",
            "data/chunk-000/file-10.parquet",
        ],
        ["episode_000009.parquet", "episode_000010.parquet", "episode_000011.parquet"],
        ["chunk-2/file-000.mp4", "chunk-10/file-000.mp4"],
    ],
)
def test_path_order_compares_numbers_as_numbers(ordered):
    assert sorted(reversed(ordered), key=path_order) == ordered


def processed(path: str, kind: str, camera: str | None = None) -> ProcessedFile:
    return ProcessedFile(path, f"p/{path}", 1, "0" * 64, kind, camera)


def test_frames_and_each_camera_use_the_one_path_order():
    archive = ArchiveObject(bucket="b", key="k.tar.zst", size=1, etag="e")
    data = [f"data/chunk-000/file-{i}.parquet" for i in (10, 2, 1)]
    videos = [f"videos/cam/chunk-000/file-{i}.mp4" for i in (10, 9, 2)]
    extracted = ExtractedFiles(
        archive=archive,
        files=[processed(p, DATA) for p in data] + [processed(p, VIDEO, "cam") for p in videos],
    )
    assert [f.path for f in extracted.data_files] == sorted(data, key=path_order)
    assert [f.path for f in extracted.data_files][-1] == "data/chunk-000/file-10.parquet"
    assert [f.path for f in videos_by_camera(extracted)["cam"]] == [
        "videos/cam/chunk-000/file-2.mp4",
        "videos/cam/chunk-000/file-9.mp4",
        "videos/cam/chunk-000/file-10.mp4",
    ]


def test_v21_task_table_is_a_kept_metadata_file():
    assert member_kind("ds/meta/tasks.jsonl") is MemberKind.METADATA


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


def test_find_dataset_roots_shallowest_first():
    assert find_dataset_roots(["z/meta/info.json", "meta/info.json", "a/b/meta/info.json"]) == [
        "",
        "z",
        "a/b",
    ]
