"""The `frames` asset streams each data file: what is recorded, and a file that fails part-way."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episode_pipeline.db.partition_tables import SkippedRows
from episode_pipeline.defs.assets.frames import frames_metadata
from episode_pipeline.episodes.frame_rows import FramesRead, file_batches
from episode_pipeline.lerobot.frames import BATCH_ROWS
from episode_pipeline.lerobot.sync import TimingAccumulator

LOG = logging.getLogger(__name__)


def data_file(path: Path, rows: int, *, nan_at: int | None = None, episodes: int = 1) -> Path:
    timestamps = np.arange(rows, dtype=np.float64) / 30
    if nan_at is not None:
        timestamps[nan_at] = np.nan
    state = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(rows * 2, np.float32)), 2)
    table = pa.table(
        {
            "timestamp": timestamps,
            "observation.state": state,
            "action": state,
            "frame_index": np.arange(rows),
            "episode_index": np.arange(rows) * episodes // rows,
        }
    )
    pq.write_table(table, path)
    return path


def test_files_read_in_turn_number_frames_on_and_record_what_they_held(tmp_path: Path) -> None:
    read = FramesRead(features=None, timing=TimingAccumulator(fps=30))
    first = list(file_batches(data_file(tmp_path / "a.parquet", 10, episodes=2), "a", read, LOG))
    second = list(file_batches(data_file(tmp_path / "b.parquet", 5), "b", read, LOG))

    assert [b["frame_order"].to_list() for b in first + second] == [
        list(range(10)),
        [10, 11, 12, 13, 14],
    ]
    assert read.rows == 15
    metadata = frames_metadata(read)
    assert metadata["files_read"] == 2
    assert metadata["files_failed"] == 0
    assert metadata["lerobot_episodes"] == 2
    # Per LeRobot episode, for the sync check; b.parquet's episode 0 continues a.parquet's.
    recorded = metadata["lerobot_episode_timing"].value["episodes"]
    timing = {e["episode_index"]: e for e in recorded}
    assert {e: t["rows"] for e, t in timing.items()} == {0: 10, 1: 5}
    assert timing[0]["irregular"] == 1 and timing[0]["first_irregular_row"] == 5  # 4/30 -> 0/30


def test_a_file_unreadable_part_way_is_skipped_listed_and_not_counted(tmp_path: Path) -> None:
    read = FramesRead(features=None)
    rows = BATCH_ROWS + 100
    bad = data_file(tmp_path / "bad.parquet", rows, nan_at=BATCH_ROWS + 50)
    batches = file_batches(bad, "data/bad.parquet", read, LOG)

    first = next(batches)  # the first batch is fine and already on its way to the COPY
    assert first.height == BATCH_ROWS
    with pytest.raises(SkippedRows, match="timestamp"):
        next(batches)

    assert read.rows == 0  # the IO manager rolls the part back: nothing of it counts
    assert frames_metadata(read)["files_read"] == 0
    assert read.timing.episodes == {}  # nor do its timestamps
    assert [f["file"] for f in read.failed] == ["data/bad.parquet"]
    # The next file numbers its frames from 0, as if the bad one had never been there.
    good = list(file_batches(data_file(tmp_path / "ok.parquet", 3), "data/ok.parquet", read, LOG))
    assert good[0]["frame_order"].to_list() == [0, 1, 2]
