"""`frames`: one row per data-parquet row, replaced per episode by the PostgreSQL IO manager."""

import dataclasses
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
from dagster import (
    AssetExecutionContext,
    MetadataValue,
    Output,
    TableColumnDep,
    TableColumnLineage,
)

from episode_pipeline.db.partition_tables import RowBatches, SkippedRows
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
from episode_pipeline.lerobot.features import FrameFeatures, features_from_info
from episode_pipeline.lerobot.frames import (
    EPISODE_INDEX,
    FRAME_INDEX,
    FRAMES_SCHEMA,
    FRAMES_TABLE,
    FRAMES_TABLE_COLUMNS,
    TIMESTAMP,
    BatchObserver,
    FrameColumns,
    FrameDataError,
    open_frame_file,
)
from episode_pipeline.lerobot.sync import TimingAccumulator
from episode_pipeline.storage.bucket import Bucket

FRAMES_COLUMNS = [(c.name, c.sql_type, c.description) for c in FRAMES_TABLE_COLUMNS]
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
            column: [TableColumnDep(EXTRACTED_FILES_KEY, field) for field in sorted(fields)]
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
    return Output(RowBatches(parts, FRAMES_SCHEMA, read.metadata))


@dataclasses.dataclass
class FramesRead:
    """What streaming an upload's data files found, known once the last batch was copied."""

    features: FrameFeatures | None
    rows: int = 0
    read_columns: list[FrameColumns] = dataclasses.field(default_factory=list)
    failed: list[dict[str, str]] = dataclasses.field(default_factory=list)
    without_state: list[dict[str, str]] = dataclasses.field(default_factory=list)
    lerobot_episodes: set[int | None] = dataclasses.field(default_factory=set)
    timing: TimingAccumulator = dataclasses.field(default_factory=lambda: TimingAccumulator(None))

    def metadata(self) -> dict[str, Any]:
        return {
            # One materialization is one episode's rows.
            "dagster/row_count": self.rows,
            "dagster/partition_row_count": self.rows,
            "dagster/column_lineage": column_lineage(self.read_columns),
            "parquet_rows_read": self.rows,
            "files_read": len(self.read_columns),
            "files_failed": len(self.failed),
            "failed_files": MetadataValue.json(self.failed),
            "lerobot_episodes": len(self.lerobot_episodes),
            EPISODE_TIMING_METADATA: MetadataValue.json(self.timing.to_json()),
            FILES_WITHOUT_STATE_METADATA: MetadataValue.json(self.without_state),
        }


def timing_observer(timing: TimingAccumulator) -> BatchObserver:
    """Feeds each batch's raw timestamps (seconds, before rounding to ms) to `timing`."""

    def observe(batch: pl.DataFrame) -> None:
        episodes = batch[EPISODE_INDEX] if EPISODE_INDEX in batch.columns else None
        timing.add(batch[TIMESTAMP].cast(pl.Float64), episodes)

    return observe


def frame_parts(
    bucket: Bucket, extracted_files: ExtractedFiles, read: FramesRead, log: Any
) -> Iterator[Iterator[pl.DataFrame]]:
    """One part per data file, in path order, each streamed batch by batch from its download."""
    with tempfile.TemporaryDirectory(prefix="frames-") as tmp:
        for data_file in extracted_files.data_files:
            local = bucket.download_file(data_file.key, Path(tmp) / "data.parquet")
            yield file_batches(local, data_file.path, read, log)


def file_batches(local: Path, path: str, read: FramesRead, log: Any) -> Iterator[pl.DataFrame]:
    """A data file's rows; a file found unreadable, at once or part-way, is skipped and listed.

    Its rows already copied are dropped with it (`SkippedRows`: the IO manager rolls the file's
    part back), so `frame_order` stays 0..N-1 over the files that were read.
    """
    rows = 0
    episodes: set[int | None] = set()
    timing = TimingAccumulator(read.timing.fps)  # joins read.timing once the file is read
    try:
        stream = open_frame_file(local, path=path, features=read.features)
        observe = timing_observer(timing)
        for batch in stream.batches(frame_order_start=read.rows, observe=observe):
            rows += batch.height
            episodes.update(batch["lerobot_episode_index"].unique().to_list())
            yield batch
    except FrameDataError as error:
        log.warning(f"skipped {path}: {error}")
        read.failed.append({"file": path, "error": str(error)})
        raise SkippedRows(str(error)) from error
    if stream.columns.missing_state:
        log.warning(f"{stream.columns.missing_state}: states written as null")
        read.without_state.append({"file": path, "missing": stream.columns.missing_state})
    read.rows += rows
    read.timing.absorb(timing)
    read.read_columns.append(stream.columns)
    read.lerobot_episodes |= episodes


def _feature_label(name: str | None, features: FrameFeatures | None) -> str:
    if features is None:
        return "(resolved from each file's columns)"
    return name or "(none)"
