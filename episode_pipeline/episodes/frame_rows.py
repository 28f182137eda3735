"""An upload's `frames` rows, streamed from its data files in the bucket one file at a time,
and what the reading found (`FramesRead`): the `frames` asset's work, without Dagster.

Each data file is downloaded, read batch by batch (`lerobot/frames.py`) and handed to the
PostgreSQL IO manager as one part of `RowBatches` (`db/partition_tables.py`), so memory stays
flat however long the episode. A file found unreadable, at once or part-way, raises
`SkippedRows`: the IO manager drops that part's rows and the episode goes on.
"""

import dataclasses
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl

from episode_pipeline.db.partition_tables import SkippedRows
from episode_pipeline.episodes.extracted_files import ExtractedFiles
from episode_pipeline.lerobot.features import FrameFeatures
from episode_pipeline.lerobot.frames import (
    EPISODE_INDEX,
    FRAME_INDEX,
    TIMESTAMP,
    BatchObserver,
    FrameColumns,
    FrameDataError,
    open_frame_file,
)
from episode_pipeline.lerobot.sync import TimingAccumulator
from episode_pipeline.storage.bucket import Bucket


def column_sources(read: list[FrameColumns]) -> dict[str, list[str]]:
    """Which parquet fields (of the files read) each `frames` column comes from, in order."""
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
    return {column: sorted(fields) for column, fields in sources.items()}


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
