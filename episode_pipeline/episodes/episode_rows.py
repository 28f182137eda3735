"""What the pipeline writes to `episode_metadata`, `entity_versions` and the episode row (pure,
but for `metadata_items`, which reads the upload's task table from S3).

See docs/contract.md#episode-columns and #episode-metadata.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from episode_pipeline.episodes.extracted_files import ExtractedFiles
from episode_pipeline.lerobot.info import DatasetInfo
from episode_pipeline.lerobot.tasks import first_task
from episode_pipeline.storage.bucket import Bucket

EDITABLE = "editable"
NON_EDITABLE = "non_editable"

# The editable keys start as fixed placeholders for people to fill in the application.
PLACEHOLDERS: dict[str, str] = {
    "operator_name": "Unknown operator",
    "operator_id": "unknown",
    "task": "Not set",
    "group": "Not set",
    "setting": "Not set",
    "lighting": "Not set",
    "clutter": "Not set",
    "success_score": "Not set",
    "descriptions": "",
}
NON_EDITABLE_KEYS = ("episode_title", "robot_type", "codebase_version")
REQUIRED_KEYS = (*NON_EDITABLE_KEYS, *PLACEHOLDERS)

ENTITY_TYPE = "episode"
FIRST_VERSION = 1
CREATE_OPERATION = "create"


@dataclass(frozen=True)
class MetadataItem:
    meta_key: str
    value: str | None
    status: str


def episode_metadata_items(
    *, first_task: str | None, robot_type: str | None, codebase_version: str | None
) -> list[MetadataItem]:
    """The metadata list, in order: read-only facts first, then the placeholders."""
    facts = {
        "episode_title": first_task,
        "robot_type": robot_type,
        "codebase_version": codebase_version,
    }
    items = [MetadataItem(key, value, NON_EDITABLE) for key, value in facts.items()]
    items += [MetadataItem(key, value, EDITABLE) for key, value in PLACEHOLDERS.items()]
    return items


def metadata_items(
    extracted: ExtractedFiles, bucket: Bucket
) -> tuple[str | None, list[MetadataItem]]:
    """The episode's first task (its title), and its metadata list."""
    info = extracted.dataset_info()
    title = None
    if extracted.tasks_key:
        title = first_task(bucket.get_bytes(extracted.tasks_key), path=extracted.tasks_key)
    items = episode_metadata_items(
        first_task=title, robot_type=info.robot_type, codebase_version=info.codebase_version
    )
    return title, items


def entity_version_data(items: list[MetadataItem]) -> list[dict[str, Any]]:
    """The version-1 snapshot stored in `entity_versions.data`."""
    return [asdict(item) for item in items]


@dataclass(frozen=True)
class EpisodeColumns:
    """The columns set together with `status = 'processed'`."""

    mp4_s3_path: str | None
    parquet_s3_path: str | None
    frame_count: int | None
    fps: float | None
    duration_seconds: int | None


def episode_columns(
    *, mp4_keys: list[str], data_parquet_keys: list[str], info: DatasetInfo
) -> EpisodeColumns:
    """The first mp4 and first data parquet uploaded; totals from meta/info.json."""
    return EpisodeColumns(
        mp4_s3_path=mp4_keys[0] if mp4_keys else None,
        parquet_s3_path=data_parquet_keys[0] if data_parquet_keys else None,
        frame_count=info.total_frames,
        fps=info.fps,
        duration_seconds=info.duration_seconds,
    )
