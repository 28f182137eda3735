"""Round trip: what make-sample writes is what the streaming readers get back."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import av
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episode_pipeline import cli
from episode_pipeline.archive.stream import ArchiveReader, spool_member
from episode_pipeline.lerobot.cameras import camera_for, locate_video
from episode_pipeline.lerobot.frames import frames_table, parquet_row_count
from episode_pipeline.lerobot.info import parse_info
from episode_pipeline.lerobot.layout import (
    INFO_JSON,
    TASKS_JSONL,
    TASKS_PARQUET,
    MemberKind,
    find_dataset_roots,
    member_kind,
    path_order,
)
from episode_pipeline.lerobot.tasks import first_task
from episode_pipeline.samples.writer import (
    SampleSpec,
    av1_encoder,
    pack_archive,
    write_dataset,
    write_sample,
)


@dataclass(frozen=True)
class Member:
    path: str  # as in the archive
    relative: str  # relative to the dataset root
    kind: MemberKind


@dataclass(frozen=True)
class Layout:
    """The members of a one-dataset archive, classified against its root (a test's view)."""

    roots: tuple[str, ...]
    members: tuple[Member, ...]

    @classmethod
    def from_paths(cls, paths: list[str]) -> Layout:
        roots = tuple(find_dataset_roots(paths))
        prefix = f"{roots[0]}/" if roots and roots[0] else ""
        return cls(roots, tuple(Member(p, p.removeprefix(prefix), member_kind(p)) for p in paths))

    @property
    def root(self) -> str:
        return self.roots[0]

    def of_kind(self, kind: MemberKind) -> list[Member]:
        return sorted((m for m in self.members if m.kind is kind), key=lambda m: path_order(m.path))

    @property
    def videos(self) -> list[Member]:
        return self.of_kind(MemberKind.VIDEO)

    @property
    def data_parquets(self) -> list[Member]:
        return self.of_kind(MemberKind.DATA_PARQUET)

    def find(self, relative: str) -> Member | None:
        return next((m for m in self.members if m.relative == relative), None)

    @property
    def info_json(self) -> Member:
        return self.find(INFO_JSON)

    @property
    def task_table(self) -> Member:
        return self.find(TASKS_PARQUET) or self.find(TASKS_JSONL)


def read_back(archive: Path, workdir: Path) -> dict:
    """Do what the pipeline does: one streaming pass, spool kept members, resolve at the end."""
    spooled: dict[str, Path] = {}
    with archive.open("rb") as body:
        reader = ArchiveReader(body, name=archive.name)
        order = []
        for member in reader:
            order.append(member.path)
            if member_kind(member.path) is not MemberKind.SKIPPED:
                spooled[member.path] = spool_member(member, workdir)
    layout = Layout.from_paths(order)
    info = parse_info(spooled[layout.info_json.path].read_bytes(), source=layout.info_json.path)
    table = layout.task_table
    start, frames = 0, []
    for data in layout.data_parquets:
        frames.append(frames_table(spooled[data.path], path=data.path, frame_order_start=start))
        start += parquet_row_count(spooled[data.path])
    return {
        "order": order,
        "skipped": reader.skipped,
        "layout": layout,
        "info": info,
        "cameras": {v.relative: camera_for(v.relative, info) for v in layout.videos},
        "task": first_task(spooled[table.path], path=table.relative),
        "frames": frames,
        "spooled": spooled,
    }


def decoded_frames(path: Path) -> tuple[int, str, tuple[int, int]]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        count = sum(1 for _ in container.decode(stream))
        return count, stream.codec_context.codec.name, (stream.width, stream.height)


CASES = {
    "v3.0-h264": SampleSpec("v3.0", cameras=2, seconds=1.0, fps=15, codec="h264", episodes=2),
    "v2.1-h264-flat": SampleSpec(
        "v2.1", cameras=2, seconds=1.0, fps=10, codec="h264", episodes=2, root_folder=None
    ),
    "v3.0-av1": SampleSpec("v3.0", cameras=1, seconds=0.5, fps=10, codec="av1", episodes=1),
}


@pytest.fixture(scope="module", params=list(CASES))
def sample(request, tmp_path_factory):
    spec = CASES[request.param]
    if spec.codec == "av1" and av1_encoder() is None:
        pytest.skip("bundled FFmpeg has no AV1 encoder")
    tmp = tmp_path_factory.mktemp(request.param)
    summary = write_sample(tmp / "upload.tar.zst", spec)
    return spec, summary, read_back(tmp / "upload.tar.zst", tmp / "spool")


def test_summary_is_json_and_matches_the_archive(sample):
    spec, summary, back = sample
    assert json.loads(json.dumps(summary)) == summary
    assert back["order"] == summary["members"]
    assert back["skipped"] == []
    prefix = f"{spec.root_folder}/" if spec.root_folder else ""
    assert summary["members"] == [prefix + f for f in summary["files"]]
    assert summary["total_frames"] == spec.episodes * spec.frames_per_episode


def test_layout_per_version(sample):
    spec, _, back = sample
    layout = back["layout"]
    assert layout.roots == ((spec.root_folder or ""),)
    relative = {m.relative: m.kind for m in layout.members}
    if spec.codebase_version == "v3.0":
        assert [m.relative for m in layout.data_parquets] == ["data/chunk-000/file-000.parquet"]
        assert relative["meta/tasks.parquet"] is MemberKind.OTHER_PARQUET
        assert relative["meta/episodes/chunk-000/file-000.parquet"] is MemberKind.OTHER_PARQUET
        assert relative["meta/stats.json"] is MemberKind.SKIPPED
        assert len(layout.videos) == spec.cameras
    else:
        assert [m.relative for m in layout.data_parquets] == [
            f"data/chunk-000/episode_{e:06d}.parquet" for e in range(spec.episodes)
        ]
        assert relative["meta/tasks.jsonl"] is MemberKind.METADATA
        assert relative["meta/episodes.jsonl"] is MemberKind.METADATA
        assert relative["meta/episodes_stats.jsonl"] is MemberKind.SKIPPED
        assert len(layout.videos) == spec.cameras * spec.episodes


def test_info_json_round_trip(sample):
    spec, summary, back = sample
    info = back["info"]
    assert info.codebase_version == spec.codebase_version
    assert info.robot_type == spec.robot_type
    assert info.fps == spec.fps
    assert info.total_frames == summary["total_frames"]
    assert info.total_episodes == spec.episodes
    assert list(info.camera_keys) == summary["cameras"]
    for feature in info.video_features.values():
        assert (feature.codec, feature.width, feature.height) == (
            spec.codec,
            spec.width,
            spec.height,
        )
    expected_keys = (
        {"data_files_size_in_mb"}
        if spec.codebase_version == "v3.0"
        else {
            "total_videos",
            "total_chunks",
        }
    )
    assert expected_keys <= set(info.raw)


def test_cameras_resolve_for_the_layout(sample):
    spec, _, back = sample
    assert sorted(set(back["cameras"].values())) == sorted(spec.camera_keys)
    for path, camera in back["cameras"].items():
        location = locate_video(path, back["info"])
        assert location.rule == "template"
        assert camera in path.split("/")


def test_first_task(sample):
    spec, _, back = sample
    assert back["task"] == spec.task


def test_frames_round_trip(sample):
    spec, summary, back = sample
    frames = back["frames"]
    total = sum(f.height for f in frames)
    assert total == summary["total_frames"]
    orders = [o for f in frames for o in f["frame_order"].to_list()]
    assert orders == list(range(total))
    episodes = [e for f in frames for e in f["lerobot_episode_index"].to_list()]
    n = spec.frames_per_episode
    assert episodes == [e for e in range(spec.episodes) for _ in range(n)]
    first = frames[0]
    assert first["timestamp_ms"].to_list()[:2] == [0, round(1000 / spec.fps)]
    assert len(json.loads(first["observation"][0])["state"]) == 6
    assert len(json.loads(first["action"][0])) == 6


def test_videos_decode_to_fps_times_seconds(sample):
    spec, _, back = sample
    per_file = spec.frames_per_episode * (spec.episodes if spec.codebase_version == "v3.0" else 1)
    expected_codec = "h264" if spec.codec == "h264" else {"libdav1d", "libaom-av1", "av1"}
    for video in back["layout"].videos:
        count, codec, size = decoded_frames(back["spooled"][video.path])
        assert count == per_file
        assert codec == expected_codec or codec in expected_codec
        assert size == (spec.width, spec.height)


V30_CASES = [name for name, spec in CASES.items() if spec.codebase_version == "v3.0"]


@pytest.mark.parametrize("sample", V30_CASES, indirect=True)
def test_v30_tables_are_written_like_lerobot(sample):
    spec, _, back = sample
    spooled = {
        m.relative: back["spooled"][m.path]
        for m in back["layout"].members
        if m.path in back["spooled"]
    }
    tasks = pq.ParquetFile(spooled["meta/tasks.parquet"]).schema_arrow
    assert json.loads(tasks.metadata[b"pandas"])["index_columns"] == ["__index_level_0__"]
    episodes = pq.read_table(spooled["meta/episodes/chunk-000/file-000.parquet"]).to_pylist()
    n = spec.frames_per_episode
    for e, row in enumerate(episodes):
        assert row["episode_index"] == e
        assert row["length"] == n
        assert row["tasks"] == [spec.task]
        assert (row["dataset_from_index"], row["dataset_to_index"]) == (e * n, (e + 1) * n)
        assert (row["data/chunk_index"], row["data/file_index"]) == (0, 0)
        for key in spec.camera_keys:
            assert row[f"videos/{key}/from_timestamp"] == pytest.approx(e * n / spec.fps)
            assert row[f"videos/{key}/to_timestamp"] == pytest.approx((e + 1) * n / spec.fps)
    data = pq.ParquetFile(spooled["data/chunk-000/file-000.parquet"])
    assert data.metadata.num_row_groups == spec.episodes
    schema = data.schema_arrow
    for vector in ("observation.state", "action"):
        kind = schema.field(vector).type
        assert pa.types.is_fixed_size_list(kind)
        assert (kind.value_type, kind.list_size) == (pa.float32(), 6)
    assert schema.field("timestamp").type == pa.float32()
    for integer in ("frame_index", "episode_index", "index", "task_index"):
        assert schema.field(integer).type == pa.int64()


def test_info_json_streamed_after_the_videos_still_resolves(tmp_path):
    spec = SampleSpec("v2.1", cameras=2, seconds=0.5, fps=10, episodes=1, tasks_index_name="task")
    folder = tmp_path / "ds"
    write_dataset(folder, spec)
    meta_last = pack_archive(
        folder,
        tmp_path / "up.tar.zst",
        root_folder="robot_42",
        order=lambda p: (p.startswith("meta/"), p),
    )
    assert meta_last[-1].startswith("robot_42/meta/")
    back = read_back(tmp_path / "up.tar.zst", tmp_path / "spool")
    assert back["layout"].root == "robot_42"
    assert sorted(back["cameras"].values()) == spec.camera_keys
    assert back["task"] == spec.task


def test_v30_named_task_index(tmp_path):
    spec = SampleSpec("v3.0", cameras=0, seconds=0.5, fps=10, tasks_index_name="task")
    summary = write_sample(tmp_path / "a.tar.zst", spec)
    assert summary["video_files"] == []
    back = read_back(tmp_path / "a.tar.zst", tmp_path / "spool")
    assert back["info"].video_path is None
    assert back["task"] == spec.task
    tasks = back["spooled"]["lerobot_episode/meta/tasks.parquet"]
    assert json.loads(pq.ParquetFile(tasks).schema_arrow.metadata[b"pandas"])["index_columns"] == [
        "task"
    ]


def test_make_sample_cli_prints_the_summary(tmp_path, capsys):
    out = tmp_path / "cli.tar.zst"
    code = cli.main(
        ["make-sample", str(out), "--format", "v2.1", "--cameras", "1", "--seconds", "0.5",
         "--fps", "10", "--codec", "h264", "--episodes", "1"]
    )  # fmt: skip
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["archive"] == str(out)
    assert summary["total_frames"] == 5
    assert out.stat().st_size == summary["archive_bytes"]
