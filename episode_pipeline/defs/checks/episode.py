"""The checks of the rows the application reads: `episode` and `episode_metadata`."""

from dagster import AssetCheckResult, AssetCheckSeverity, MetadataValue

from episode_pipeline.db import episodes as episode_db
from episode_pipeline.defs.asset_keys import EPISODE_KEY, EPISODE_METADATA_KEY
from episode_pipeline.defs.checks.family import EpisodeCheckContext, EpisodeCheckFamily
from episode_pipeline.defs.checks.queries import query_episode
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.episodes.output_checks import missing_metadata_keys

family = EpisodeCheckFamily("episode_rows_checks")


@family.check(
    asset=EPISODE_METADATA_KEY,
    severity=AssetCheckSeverity.ERROR,
    description="Every required metadata key is present for the episode.",
)
def metadata_keys_present(
    context: EpisodeCheckContext, postgres: PostgresResource
) -> AssetCheckResult:
    present = query_episode(context, postgres, episode_db.metadata_values)
    missing = missing_metadata_keys(present)
    return AssetCheckResult(
        passed=not missing,
        metadata={"missing_keys": MetadataValue.json(missing), "keys_present": len(present)},
    )


@family.check(
    asset=EPISODE_KEY,
    severity=AssetCheckSeverity.WARN,
    description="`frame_count` (info.json's total_frames) matches the rows in `frames` (WARN: "
    "real datasets carry stale totals).",
)
def frame_count_matches_rows(
    context: EpisodeCheckContext, postgres: PostgresResource
) -> AssetCheckResult:
    row = query_episode(context, postgres, episode_db.episode_row) or {}
    rows = query_episode(context, postgres, episode_db.frame_rows)
    frame_count = row.get("frame_count")
    return AssetCheckResult(
        passed=frame_count == rows,
        metadata={"frame_count": frame_count if frame_count is not None else -1, "rows": rows},
    )


EPISODE_ROW_CHECKS = [family.definition()]
