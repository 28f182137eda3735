"""The checks of `frames`: every row written, in order, from readable files with a state feature.

Each check recomputes its facts from the stores (PostgreSQL, S3) or reads what the asset recorded
in its materialization, rather than trusting what the asset returned, so corrupting an output on
purpose makes the check fail.
"""

from dagster import AssetCheckResult, AssetCheckSeverity, MetadataValue

from episode_pipeline.db import episodes as episode_db
from episode_pipeline.defs.asset_keys import FRAMES_KEY
from episode_pipeline.defs.checks.family import (
    EXTRACTED_FILES_INS,
    EpisodeCheckContext,
    EpisodeCheckFamily,
)
from episode_pipeline.defs.checks.queries import query_episode
from episode_pipeline.defs.metadata import FILES_WITHOUT_STATE_METADATA, STATE_FEATURE_METADATA
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.episodes.extracted_files import ExtractedFiles
from episode_pipeline.episodes.output_checks import missing_state_features
from episode_pipeline.orchestration.event_log import latest_materialization_metadata

family = EpisodeCheckFamily("frames_checks", ins=EXTRACTED_FILES_INS)


@family.check(
    asset=FRAMES_KEY,
    severity=AssetCheckSeverity.ERROR,
    blocking=True,
    description="Rows in `frames` equal every data row in the archive, counted from the data "
    "parquets' footers at extraction, so rows lost to an unreadable file fail the episode "
    "(ERROR; blocks the episode row).",
)
def frames_match_parquet_rows(
    context: EpisodeCheckContext,
    extracted_files: ExtractedFiles,
    postgres: PostgresResource,
) -> AssetCheckResult:
    in_archive = extracted_files.data_rows
    uncounted = extracted_files.data_files_without_row_count
    written = query_episode(context, postgres, episode_db.frame_rows)
    return AssetCheckResult(
        passed=not uncounted and written == in_archive,
        metadata={
            "rows_in_frames": written,
            "rows_in_archive": in_archive,
            "files_without_row_count": MetadataValue.json(uncounted),
        },
    )


@family.check(
    asset=FRAMES_KEY,
    severity=AssetCheckSeverity.WARN,
    description="Timestamps strictly increase within each LeRobot episode.",
)
def frames_timestamps_increasing(
    context: EpisodeCheckContext, postgres: PostgresResource
) -> AssetCheckResult:
    schema = postgres.database_schema()
    regressions = query_episode(
        context, postgres, lambda conn, ref: episode_db.timestamp_regressions(conn, schema, ref)
    )
    if regressions is None:
        return AssetCheckResult(
            passed=True,
            description="Not checked: `frames` has no `frame_order` column, so rows have no order.",
            metadata={"checked": False},
        )
    return AssetCheckResult(
        passed=regressions == 0,
        metadata={"rows_not_after_previous": regressions, "checked": True},
    )


@family.check(
    asset=FRAMES_KEY,
    severity=AssetCheckSeverity.WARN,
    description="Every data parquet was readable (WARN: a bad file is skipped and the episode "
    "goes on).",
)
def frames_files_readable(context: EpisodeCheckContext) -> AssetCheckResult:
    metadata = latest_materialization_metadata(context.instance, FRAMES_KEY, context.partition_key)
    failed = metadata.get("failed_files") or []
    return AssetCheckResult(
        passed=bool(metadata) and not failed,
        metadata={"failed_files": MetadataValue.json(failed)},
    )


@family.check(
    asset=FRAMES_KEY,
    severity=AssetCheckSeverity.WARN,
    description="Every data parquet has the state feature (WARN: rows of a file without one are "
    'written with `{"state": null}`; the result names the missing feature).',
)
def frames_state_present(context: EpisodeCheckContext) -> AssetCheckResult:
    metadata = latest_materialization_metadata(context.instance, FRAMES_KEY, context.partition_key)
    missing = metadata.get(FILES_WITHOUT_STATE_METADATA) or []
    return AssetCheckResult(
        passed=bool(metadata) and not missing,
        description=missing_state_features(missing),
        metadata={
            "state_feature": metadata.get(STATE_FEATURE_METADATA) or "(not materialized)",
            "files_without_state": MetadataValue.json(missing),
        },
    )


FRAMES_CHECKS = [family.definition()]
