"""Asset checks, run with every materialization and on their own as tests of an episode's state.

Each check recomputes its facts from the stores (PostgreSQL, S3) rather than trusting what the
asset reported, so corrupting an output on purpose makes the check fail.
"""

from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    MetadataValue,
    asset_check,
)

from episode_pipeline.db import episodes as episode_db
from episode_pipeline.defs.assets.archive import extracted_files
from episode_pipeline.defs.assets.episode import episode
from episode_pipeline.defs.assets.frames import frames
from episode_pipeline.defs.assets.metadata import episode_metadata
from episode_pipeline.defs.partitions import episode_partitions
from episode_pipeline.defs.resources.postgres import PostgresResource
from episode_pipeline.defs.resources.storage import EpisodeStorage
from episode_pipeline.keys import parse_partition_key
from episode_pipeline.manifest import Manifest
from episode_pipeline.metadata import REQUIRED_KEYS


def latest_materialization_metadata(
    instance: DagsterInstance, asset_key: AssetKey, partition_key: str
) -> dict[str, Any]:
    """The metadata of the asset's newest materialization of this partition ({} if none)."""
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=asset_key, asset_partitions=[partition_key]), limit=1
    ).records
    if not records or records[0].asset_materialization is None:
        return {}
    return {k: v.value for k, v in records[0].asset_materialization.metadata.items()}


@asset_check(
    asset=frames,
    partitions_def=episode_partitions,
    blocking=True,
    description="Rows in `frames` equal the parquet rows read (ERROR; blocks the episode row).",
)
def frames_match_parquet_rows(
    context: AssetCheckExecutionContext, postgres: PostgresResource
) -> AssetCheckResult:
    partition_key = context.partition_key
    ref = parse_partition_key(partition_key)
    read = latest_materialization_metadata(context.instance, frames.key, partition_key).get(
        "parquet_rows_read"
    )
    with postgres.connect() as conn:
        written = episode_db.frame_rows(conn, ref)
    return AssetCheckResult(
        passed=read is not None and written == read,
        severity=AssetCheckSeverity.ERROR,
        metadata={"rows_in_frames": written, "parquet_rows_read": read if read is not None else -1},
    )


@asset_check(
    asset=frames,
    partitions_def=episode_partitions,
    description="Timestamps strictly increase within each LeRobot episode.",
)
def frames_timestamps_increasing(
    context: AssetCheckExecutionContext, postgres: PostgresResource
) -> AssetCheckResult:
    ref = parse_partition_key(context.partition_key)
    with postgres.connect() as conn:
        regressions = episode_db.timestamp_regressions(conn, ref)
    return AssetCheckResult(
        passed=regressions == 0,
        severity=AssetCheckSeverity.WARN,
        metadata={"rows_not_after_previous": regressions},
    )


@asset_check(
    asset=frames,
    partitions_def=episode_partitions,
    description="Every data parquet was readable (WARN: the seed skips a bad file and goes on).",
)
def frames_files_readable(context: AssetCheckExecutionContext) -> AssetCheckResult:
    metadata = latest_materialization_metadata(context.instance, frames.key, context.partition_key)
    failed = metadata.get("failed_files") or []
    return AssetCheckResult(
        passed=bool(metadata) and not failed,
        severity=AssetCheckSeverity.WARN,
        metadata={"failed_files": MetadataValue.json(failed)},
    )


@asset_check(
    asset=extracted_files,
    partitions_def=episode_partitions,
    blocking=True,
    description="Every key in the manifest exists in S3 with the recorded size (ERROR).",
)
def processed_objects_exist(
    context: AssetCheckExecutionContext, extracted_files: Manifest, storage: EpisodeStorage
) -> AssetCheckResult:
    manifest = extracted_files
    problems = []
    for file in manifest.files:
        head = storage.head(file.key)
        if head is None:
            problems.append({"key": file.key, "problem": "missing"})
        elif head.size != file.size:
            problems.append({"key": file.key, "problem": f"size {head.size} != {file.size}"})
    return AssetCheckResult(
        passed=not problems,
        severity=AssetCheckSeverity.ERROR,
        metadata={"objects_checked": len(manifest.files), "problems": MetadataValue.json(problems)},
    )


@asset_check(
    asset=episode_metadata,
    partitions_def=episode_partitions,
    description="Every required metadata key is present for the episode.",
)
def metadata_keys_present(
    context: AssetCheckExecutionContext, postgres: PostgresResource
) -> AssetCheckResult:
    ref = parse_partition_key(context.partition_key)
    with postgres.connect() as conn:
        present = episode_db.metadata_values(conn, ref)
    missing = [key for key in REQUIRED_KEYS if key not in present]
    return AssetCheckResult(
        passed=not missing,
        severity=AssetCheckSeverity.ERROR,
        metadata={"missing_keys": MetadataValue.json(missing), "keys_present": len(present)},
    )


@asset_check(
    asset=episode,
    partitions_def=episode_partitions,
    description="`frame_count` (info.json's total_frames) matches the rows in `frames` (WARN: "
    "real datasets carry stale totals).",
)
def frame_count_matches_rows(
    context: AssetCheckExecutionContext, postgres: PostgresResource
) -> AssetCheckResult:
    ref = parse_partition_key(context.partition_key)
    with postgres.connect() as conn:
        row = episode_db.episode_row(conn, ref) or {}
        rows = episode_db.frame_rows(conn, ref)
    frame_count = row.get("frame_count")
    return AssetCheckResult(
        passed=frame_count == rows,
        severity=AssetCheckSeverity.WARN,
        metadata={"frame_count": frame_count if frame_count is not None else -1, "rows": rows},
    )


EPISODE_CHECKS = [
    frames_match_parquet_rows,
    frames_timestamps_increasing,
    frames_files_readable,
    processed_objects_exist,
    metadata_keys_present,
    frame_count_matches_rows,
]
