"""`frames`: one row per data-parquet row, replaced per episode by the PostgreSQL IO manager."""

from functools import partial
from typing import Any

from dagster import (
    AssetExecutionContext,
    MetadataValue,
    Output,
    TableColumnDep,
    TableColumnLineage,
)

from episode_pipeline.db.partition_tables import PartitionTable, RowBatches
from episode_pipeline.db.schema_check import OPTIONAL_COLUMNS
from episode_pipeline.defs.asset_keys import EXTRACTED_FILES_KEY
from episode_pipeline.defs.metadata import (
    EPISODE_TIMING_METADATA,
    FILES_WITHOUT_STATE_METADATA,
    STATE_FEATURE_METADATA,
    on_materialization,
    table_schema,
)
from episode_pipeline.defs.partitions import SERVING, episode_asset
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.episodes.extracted_files import ExtractedFiles
from episode_pipeline.episodes.frame_rows import FramesRead, column_sources, frame_parts
from episode_pipeline.lerobot.features import FrameFeatures, features_from_info
from episode_pipeline.lerobot.frames import (
    FRAMES_SCHEMA,
    FRAMES_TABLE,
    FRAMES_TABLE_COLUMNS,
    FrameColumns,
)
from episode_pipeline.lerobot.sync import TimingAccumulator

FRAMES_COLUMNS = [(c.name, c.sql_type, c.description) for c in FRAMES_TABLE_COLUMNS]
FRAMES_SCHEMA_METADATA = table_schema(FRAMES_COLUMNS)
# Where the PostgreSQL IO manager writes the rows: one episode's at a time, in frame order.
FRAMES_ROWS = PartitionTable(
    FRAMES_TABLE,
    partition_column="episode_id",
    order_by="frame_order",
    # Written when the application's table has them (docs/contract.md#frame-rows).
    optional_columns=OPTIONAL_COLUMNS[FRAMES_TABLE],
)


def column_lineage(read: list[FrameColumns]) -> TableColumnLineage:
    """Which parquet fields (of the files `extracted_files` uploaded) each column comes from."""
    return TableColumnLineage(
        deps_by_column={
            column: [TableColumnDep(EXTRACTED_FILES_KEY, field) for field in fields]
            for column, fields in column_sources(read).items()
        }
    )


def frames_metadata(read: FramesRead) -> dict[str, Any]:
    """What the reading found, as the `frames` materialization shows it (and its checks read)."""
    return {
        # One materialization is one episode's rows.
        "dagster/row_count": read.rows,
        "dagster/partition_row_count": read.rows,
        "dagster/column_lineage": column_lineage(read.read_columns),
        "parquet_rows_read": read.rows,
        "files_read": len(read.read_columns),
        "files_failed": len(read.failed),
        "failed_files": MetadataValue.json(read.failed),
        "lerobot_episodes": len(read.lerobot_episodes),
        EPISODE_TIMING_METADATA: MetadataValue.json(read.timing.to_json()),
        FILES_WITHOUT_STATE_METADATA: MetadataValue.json(read.without_state),
    }


@episode_asset(
    io_manager_key="postgres_io_manager",
    kinds={"postgres", "polars"},
    tags=SERVING,
    # Bump when the same parquet gives other rows (lerobot/frames.py, lerobot/features.py).
    code_version="1",
    metadata={
        "dagster/table_name": f"public.{FRAMES_TABLE}",
        "dagster/column_schema": FRAMES_SCHEMA_METADATA,
        **FRAMES_ROWS.as_metadata(),
    },
    description="The episode's frames in PostgreSQL: one `frames` row per row of every data "
    "parquet, files in path order, replaced as a whole on every run. `timestamp` → "
    '`timestamp_ms`, the state feature → `observation` `{"state": [...]}`, the action feature → '
    "`action`. An unreadable file is skipped and listed, never silently.",
)
def frames(
    context: AssetExecutionContext, extracted_files: ExtractedFiles, s3: S3BucketResource
) -> Output[RowBatches]:
    # One rule for the whole upload: state/action names from info.json (None: each file's own).
    info = extracted_files.dataset_info()
    features = features_from_info(info)
    read = FramesRead(features, timing=TimingAccumulator(info.fps))
    # Streamed: the IO manager copies each batch as it is made, so memory stays flat however
    # long the episode; what the reading found joins the metadata after the last batch.
    parts = frame_parts(s3.get_client(), extracted_files, read, context.log)
    on_materialization(
        context,
        {
            "dagster/column_schema": FRAMES_SCHEMA_METADATA,
            STATE_FEATURE_METADATA: _feature_label(features.state if features else None, features),
            "action_feature": _feature_label(features.action if features else None, features),
        },
    )
    return Output(RowBatches(parts, FRAMES_SCHEMA, partial(frames_metadata, read)))


def _feature_label(name: str | None, features: FrameFeatures | None) -> str:
    if features is None:
        return "(resolved from each file's columns)"
    return name or "(none)"
