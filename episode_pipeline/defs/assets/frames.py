"""`frames`: one row per data-parquet row, replaced per episode by the PostgreSQL IO manager."""

import tempfile
from pathlib import Path

import polars as pl
from dagster import AssetExecutionContext, MetadataValue, Output

from episode_pipeline.defs.partitions import episode_asset
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.extracted_files import ExtractedFiles
from episode_pipeline.lerobot.frames import FRAMES_SCHEMA, FrameDataError, frames_table

FRAMES_TABLE = "frames"


@episode_asset(
    io_manager_key="postgres_io_manager",
    kinds={"postgres", "polars"},
    metadata={"table": FRAMES_TABLE, "partition_expr": "episode_id", "order_by": "frame_order"},
    description="Every parquet whose path contains /data/, in path order: `timestamp` → "
    '`timestamp_ms`, `observation.state` → `{"state": [...]}`, `action` → array. An unreadable '
    "file is skipped and listed, never silently.",
)
def frames(
    context: AssetExecutionContext, extracted_files: ExtractedFiles, s3: S3BucketResource
) -> Output[pl.DataFrame]:
    bucket = s3.get_client()
    tables: list[pl.DataFrame] = []
    failed: list[dict[str, str]] = []
    next_order = 0
    with tempfile.TemporaryDirectory(prefix="frames-") as tmp:
        for data_file in extracted_files.data_files:
            local = bucket.download_file(data_file.key, Path(tmp) / "data.parquet")
            try:
                table = frames_table(local, path=data_file.path, frame_order_start=next_order)
            except FrameDataError as error:
                context.log.warning(f"skipped {data_file.path}: {error}")
                failed.append({"file": data_file.path, "error": str(error)})
                continue
            tables.append(table)
            next_order += table.height
    table = pl.concat(tables) if tables else pl.DataFrame(schema=FRAMES_SCHEMA)
    return Output(
        table,
        metadata={
            "parquet_rows_read": table.height,
            "files_read": len(tables),
            "files_failed": len(failed),
            "failed_files": MetadataValue.json(failed),
            "lerobot_episodes": table["lerobot_episode_index"].n_unique() if table.height else 0,
        },
    )
