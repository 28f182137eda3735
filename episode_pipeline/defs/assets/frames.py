"""`frames`: one row per data-parquet row, replaced per episode by the PostgreSQL IO manager."""

import tempfile
from pathlib import Path

import polars as pl
from dagster import (
    AssetExecutionContext,
    MetadataValue,
    Output,
    TableColumnDep,
    TableColumnLineage,
)

from episode_pipeline.db.schema_check import OPTIONAL_COLUMNS
from episode_pipeline.defs.assets.archive import extracted_files as extracted_files_asset
from episode_pipeline.defs.metadata import table_schema
from episode_pipeline.defs.partitions import SERVING, episode_asset
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.extracted_files import ExtractedFiles
from episode_pipeline.lerobot.features import FrameFeatures, features_from_info
from episode_pipeline.lerobot.frames import (
    EPISODE_INDEX,
    FRAME_INDEX,
    FRAMES_SCHEMA,
    TIMESTAMP,
    FrameColumns,
    FrameDataError,
    read_frame_file,
)

FRAMES_TABLE = "frames"
# Read by the frames_state_present check.
STATE_FEATURE_METADATA = "state_feature"
FILES_WITHOUT_STATE_METADATA = "files_without_state"
# The table as the application reads it (db/migrations/, docs/contract.md#frame-rows).
FRAMES_COLUMNS = [
    ("episode_id", "text", "The episode (the partition's EP)"),
    ("frame_order", "integer", "0-based position across the upload's data files, in path order"),
    ("lerobot_episode_index", "integer", "`episode_index` of the parquet row"),
    ("frame_index", "integer", "`frame_index` of the parquet row"),
    ("timestamp_ms", "bigint", "`timestamp` (seconds) times 1000, rounded half up"),
    ("observation", "jsonb", '`{"state": [...]}` from the state feature'),
    ("action", "jsonb", "JSON array from the action feature"),
]
FRAMES_SCHEMA_METADATA = table_schema(FRAMES_COLUMNS)


def column_lineage(read: list[FrameColumns]) -> TableColumnLineage:
    """Which parquet fields (of the files `extracted_files` uploaded) each column comes from."""
    sources: dict[str, set[str]] = {}
    for columns in read:
        names = set(columns.read)
        for column, field in (
            ("lerobot_episode_index", EPISODE_INDEX),
            ("frame_index", FRAME_INDEX),
            ("timestamp_ms", TIMESTAMP),
            ("observation", columns.state),
            ("action", columns.action),
        ):
            if field is not None and field in names:
                sources.setdefault(column, set()).add(field)
    return TableColumnLineage(
        deps_by_column={
            column: [TableColumnDep(extracted_files_asset.key, field) for field in sorted(fields)]
            for column, fields in sources.items()
        }
    )


@episode_asset(
    io_manager_key="postgres_io_manager",
    kinds={"postgres", "polars"},
    tags=SERVING,
    # Bump when the same parquet gives other rows (lerobot/frames.py, lerobot/features.py).
    code_version="1",
    metadata={
        "dagster/table_name": f"public.{FRAMES_TABLE}",
        "dagster/column_schema": FRAMES_SCHEMA_METADATA,
        "table": FRAMES_TABLE,
        "partition_expr": "episode_id",
        "order_by": "frame_order",
        # Written when the application's table has them (docs/contract.md#frame-rows).
        "optional_columns": list(OPTIONAL_COLUMNS[FRAMES_TABLE]),
    },
    description="The episode's frames in PostgreSQL: one `frames` row per row of every data "
    "parquet, files in path order, replaced as a whole on every run. `timestamp` → "
    '`timestamp_ms`, the state feature → `observation` `{"state": [...]}`, the action feature → '
    "`action`. An unreadable file is skipped and listed, never silently.",
)
def frames(
    context: AssetExecutionContext, extracted_files: ExtractedFiles, s3: S3BucketResource
) -> Output[pl.DataFrame]:
    bucket = s3.get_client()
    # One rule for the whole upload: state/action names from info.json (None: each file's own).
    features = features_from_info(extracted_files.dataset_info())
    tables: list[pl.DataFrame] = []
    read_columns: list[FrameColumns] = []
    failed: list[dict[str, str]] = []
    without_state: list[dict[str, str]] = []
    next_order = 0
    with tempfile.TemporaryDirectory(prefix="frames-") as tmp:
        for data_file in extracted_files.data_files:
            local = bucket.download_file(data_file.key, Path(tmp) / "data.parquet")
            try:
                read = read_frame_file(
                    local, path=data_file.path, features=features, frame_order_start=next_order
                )
            except FrameDataError as error:
                context.log.warning(f"skipped {data_file.path}: {error}")
                failed.append({"file": data_file.path, "error": str(error)})
                continue
            if read.columns.missing_state:
                context.log.warning(f"{read.columns.missing_state}: states written as null")
                without_state.append(
                    {"file": data_file.path, "missing": read.columns.missing_state}
                )
            tables.append(read.table)
            read_columns.append(read.columns)
            next_order += read.table.height
    table = pl.concat(tables) if tables else pl.DataFrame(schema=FRAMES_SCHEMA)
    return Output(
        table,
        metadata={
            # One materialization is one episode's rows.
            "dagster/row_count": table.height,
            "dagster/partition_row_count": table.height,
            "dagster/column_schema": FRAMES_SCHEMA_METADATA,
            "dagster/column_lineage": column_lineage(read_columns),
            "parquet_rows_read": table.height,
            "files_read": len(tables),
            "files_failed": len(failed),
            "failed_files": MetadataValue.json(failed),
            "lerobot_episodes": table["lerobot_episode_index"].n_unique() if table.height else 0,
            STATE_FEATURE_METADATA: _feature_label(features.state if features else None, features),
            "action_feature": _feature_label(features.action if features else None, features),
            FILES_WITHOUT_STATE_METADATA: MetadataValue.json(without_state),
        },
    )


def _feature_label(name: str | None, features: FrameFeatures | None) -> str:
    if features is None:
        return "(resolved from each file's columns)"
    return name or "(none)"
