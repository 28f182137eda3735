"""The record of one extraction: what was uploaded where, and what later steps need to know.

`extracted_files` returns it; the S3 IO manager stores it as JSON beside the processed files, so
any later step, in any process or container, loads the same facts instead of re-reading the tar.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from episode_pipeline.lerobot.cameras import DEFAULT_CAMERA
from episode_pipeline.lerobot.info import DatasetInfo, parse_info
from episode_pipeline.lerobot.layout import path_order

VIDEO = "video"
DATA = "data"  # a frames parquet (path contains /data/)
META = "meta"  # info.json, task table, episodes table


@dataclass(frozen=True)
class ArchiveObject:
    bucket: str
    key: str
    size: int
    etag: str
    version_id: str | None = None
    # When S3 stored the upload (ISO 8601): the start of the upload → processed latency.
    last_modified: str | None = None

    @property
    def version(self) -> str:
        """What identifies this upload: a re-upload changes it (versioned bucket or ETag)."""
        return self.version_id or self.etag


@dataclass(frozen=True)
class ProcessedFile:
    path: str  # path inside the tar
    key: str  # S3 key under processed/
    size: int
    sha256: str
    kind: str  # VIDEO | DATA | META
    camera: str | None = None  # videos only
    rows: int | None = None  # data parquets only (from the footer)


@dataclass(frozen=True)
class SkippedFile:
    path: str
    reason: str


@dataclass
class ExtractedFiles:
    archive: ArchiveObject
    files: list[ProcessedFile] = field(default_factory=list)
    skipped: list[SkippedFile] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)  # parsed meta/info.json
    info_key: str | None = None
    tasks_key: str | None = None

    @property
    def videos(self) -> list[ProcessedFile]:
        return [f for f in self.files if f.kind == VIDEO]

    @property
    def data_files(self) -> list[ProcessedFile]:
        """Frames parquets in path order: the order their rows are numbered in."""
        return sorted((f for f in self.files if f.kind == DATA), key=lambda f: path_order(f.path))

    @property
    def data_rows(self) -> int:
        """Rows in all data parquets, from their footers (files without a readable footer: 0)."""
        return sum(f.rows or 0 for f in self.data_files)

    @property
    def data_files_without_row_count(self) -> list[str]:
        """Data parquets whose footer could not be read: their rows are unknown."""
        return [f.path for f in self.data_files if f.rows is None]

    @property
    def bytes_extracted(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def cameras(self) -> list[str]:
        return sorted({f.camera for f in self.videos if f.camera})

    def dataset_info(self) -> DatasetInfo:
        """The parsed meta/info.json (stored raw in the manifest, parsed one way everywhere)."""
        return parse_info(self.info, source=self.info_key or "meta/info.json")

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> ExtractedFiles:
        return cls(
            archive=ArchiveObject(**data["archive"]),
            files=[ProcessedFile(**f) for f in data.get("files", [])],
            skipped=[SkippedFile(**s) for s in data.get("skipped", [])],
            info=data.get("info", {}),
            info_key=data.get("info_key"),
            tasks_key=data.get("tasks_key"),
        )


def videos_by_camera(extracted: ExtractedFiles) -> dict[str, list[ProcessedFile]]:
    """Each camera's mp4s in path order (the play order of a concatenated rendition)."""
    cameras: dict[str, list[ProcessedFile]] = defaultdict(list)
    for video in extracted.videos:
        cameras[video.camera or DEFAULT_CAMERA].append(video)
    return {
        camera: sorted(files, key=lambda f: path_order(f.path))
        for camera, files in sorted(cameras.items())
    }
