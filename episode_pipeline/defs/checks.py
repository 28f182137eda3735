"""Asset checks, run with every materialization and on their own as tests of an episode's state.

Each check recomputes its facts from the stores (PostgreSQL, S3) rather than trusting what the
asset reported, so corrupting an output on purpose makes the check fail.
"""

from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetIn,
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    MetadataValue,
)

from episode_pipeline.db import episodes as episode_db
from episode_pipeline.defs.assets.archive import extracted_files
from episode_pipeline.defs.assets.episode import episode
from episode_pipeline.defs.assets.episode_metadata import episode_metadata
from episode_pipeline.defs.assets.frames import (
    FILES_WITHOUT_STATE_METADATA,
    STATE_FEATURE_METADATA,
    frames,
)
from episode_pipeline.defs.partitions import episode_check
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.episodes.episode_rows import REQUIRED_KEYS
from episode_pipeline.episodes.extracted_files import ExtractedFiles
from episode_pipeline.episodes.keys import EpisodeRef, parse_partition_key

T = TypeVar("T")


def query_episode(
    context: AssetCheckExecutionContext,
    postgres: PostgresResource,
    query: Callable[[psycopg.Connection, EpisodeRef], T],
) -> T:
    """One read from `db/episodes.py` about the check's episode, on its own connection."""
    with postgres.connect() as conn:
        return query(conn, parse_partition_key(context.partition_key))


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


@episode_check(
    asset=frames,
    blocking=True,
    additional_ins={"extracted_files": AssetIn(key=extracted_files.key)},
    description="Rows in `frames` equal every data row in the archive, counted from the data "
    "parquets' footers at extraction, so rows lost to an unreadable file fail the episode "
    "(ERROR; blocks the episode row).",
)
def frames_match_parquet_rows(
    context: AssetCheckExecutionContext,
    extracted_files: ExtractedFiles,
    postgres: PostgresResource,
) -> AssetCheckResult:
    in_archive = extracted_files.data_rows
    uncounted = extracted_files.data_files_without_row_count
    written = query_episode(context, postgres, episode_db.frame_rows)
    return AssetCheckResult(
        passed=not uncounted and written == in_archive,
        severity=AssetCheckSeverity.ERROR,
        metadata={
            "rows_in_frames": written,
            "rows_in_archive": in_archive,
            "files_without_row_count": MetadataValue.json(uncounted),
        },
    )


@episode_check(
    asset=frames,
    description="Timestamps strictly increase within each LeRobot episode.",
)
def frames_timestamps_increasing(
    context: AssetCheckExecutionContext, postgres: PostgresResource
) -> AssetCheckResult:
    schema = postgres.database_schema()
    regressions = query_episode(
        context, postgres, lambda conn, ref: episode_db.timestamp_regressions(conn, schema, ref)
    )
    if regressions is None:
        return AssetCheckResult(
            passed=True,
            severity=AssetCheckSeverity.WARN,
            description="Not checked: `frames` has no `frame_order` column, so rows have no order.",
            metadata={"checked": False},
        )
    return AssetCheckResult(
        passed=regressions == 0,
        severity=AssetCheckSeverity.WARN,
        metadata={"rows_not_after_previous": regressions, "checked": True},
    )


@episode_check(
    asset=frames,
    description="Every data parquet was readable (WARN: a bad file is skipped and the episode "
    "goes on).",
)
def frames_files_readable(context: AssetCheckExecutionContext) -> AssetCheckResult:
    metadata = latest_materialization_metadata(context.instance, frames.key, context.partition_key)
    failed = metadata.get("failed_files") or []
    return AssetCheckResult(
        passed=bool(metadata) and not failed,
        severity=AssetCheckSeverity.WARN,
        metadata={"failed_files": MetadataValue.json(failed)},
    )


@episode_check(
    asset=extracted_files,
    blocking=True,
    description="Every file `extracted_files` lists exists in S3 with the recorded size (ERROR).",
)
def processed_objects_exist(
    context: AssetCheckExecutionContext, extracted_files: ExtractedFiles, s3: S3BucketResource
) -> AssetCheckResult:
    bucket = s3.get_client()
    problems = []
    for file in extracted_files.files:
        head = bucket.head(file.key)
        if head is None:
            problems.append({"key": file.key, "problem": "missing"})
        elif head.size != file.size:
            problems.append({"key": file.key, "problem": f"size {head.size} != {file.size}"})
    return AssetCheckResult(
        passed=not problems,
        severity=AssetCheckSeverity.ERROR,
        metadata={
            "objects_checked": len(extracted_files.files),
            "problems": MetadataValue.json(problems),
        },
    )


@episode_check(
    asset=episode_metadata,
    description="Every required metadata key is present for the episode.",
)
def metadata_keys_present(
    context: AssetCheckExecutionContext, postgres: PostgresResource
) -> AssetCheckResult:
    present = query_episode(context, postgres, episode_db.metadata_values)
    missing = [key for key in REQUIRED_KEYS if key not in present]
    return AssetCheckResult(
        passed=not missing,
        severity=AssetCheckSeverity.ERROR,
        metadata={"missing_keys": MetadataValue.json(missing), "keys_present": len(present)},
    )


@episode_check(
    asset=episode,
    description="`frame_count` (info.json's total_frames) matches the rows in `frames` (WARN: "
    "real datasets carry stale totals).",
)
def frame_count_matches_rows(
    context: AssetCheckExecutionContext, postgres: PostgresResource
) -> AssetCheckResult:
    row = query_episode(context, postgres, episode_db.episode_row) or {}
    rows = query_episode(context, postgres, episode_db.frame_rows)
    frame_count = row.get("frame_count")
    return AssetCheckResult(
        passed=frame_count == rows,
        severity=AssetCheckSeverity.WARN,
        metadata={"frame_count": frame_count if frame_count is not None else -1, "rows": rows},
    )


@episode_check(
    asset=frames,
    description="Every data parquet has the state feature (WARN: rows of a file without one are "
    'written with `{"state": null}`; the result names the missing feature).',
)
def frames_state_present(context: AssetCheckExecutionContext) -> AssetCheckResult:
    metadata = latest_materialization_metadata(context.instance, frames.key, context.partition_key)
    missing = metadata.get(FILES_WITHOUT_STATE_METADATA) or []
    return AssetCheckResult(
        passed=bool(metadata) and not missing,
        severity=AssetCheckSeverity.WARN,
        description="; ".join(sorted({item["missing"] for item in missing})) or None,
        metadata={
            "state_feature": metadata.get(STATE_FEATURE_METADATA) or "(not materialized)",
            "files_without_state": MetadataValue.json(missing),
        },
    )


EPISODE_CHECKS = [
    frames_match_parquet_rows,
    frames_timestamps_increasing,
    frames_files_readable,
    processed_objects_exist,
    metadata_keys_present,
    frame_count_matches_rows,
    frames_state_present,
]
