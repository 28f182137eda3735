"""Data parquet → frames rows: every storage variant LeRobot writers use, and clear errors."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episode_pipeline.lerobot.features import FrameFeatures
from episode_pipeline.lerobot.frames import (
    FRAME_COLUMNS,
    FrameDataError,
    frames_table,
    open_frame_file,
    parquet_row_count,
    read_frame_file,
)

STATE = [[0.1, 0.2, 1e-7], [1.5, -2.25, 3.4028235e38], [0.33333334, 0.0, -0.0]]


def to_parquet(columns: dict, *, row_group_size: int | None = None) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.table(columns), buffer, row_group_size=row_group_size)
    return buffer.getvalue()


def vectors(rows, value_type=None, fixed: bool = True):
    value_type = value_type or pa.float32()
    if fixed:
        flat = pa.array([v for row in rows for v in row], type=value_type)
        return pa.FixedSizeListArray.from_arrays(flat, len(rows[0]))
    return pa.array(rows, type=pa.list_(value_type))


def states(df: pl.DataFrame) -> list:
    return [json.loads(text)["state"] for text in df["observation"]]


def base(n=3, **extra):
    columns = {
        "timestamp": pa.array(np.arange(n, dtype=np.float32) / 30, type=pa.float32()),
        "observation.state": vectors(STATE[:n]),
        "action": vectors(STATE[:n]),
        "frame_index": pa.array(range(n), type=pa.int64()),
        "episode_index": pa.array([0] * n, type=pa.int64()),
    }
    columns.update(extra)
    return columns


def test_fixed_size_float32_lerobot_default():
    df = frames_table(to_parquet(base()), path="data/chunk-000/file-000.parquet")
    assert df.columns == list(FRAME_COLUMNS)
    assert df["frame_order"].to_list() == [0, 1, 2]
    assert df["frame_index"].to_list() == [0, 1, 2]
    assert df["lerobot_episode_index"].to_list() == [0, 0, 0]
    assert df["timestamp_ms"].to_list() == [0, 33, 67]
    assert df.schema["timestamp_ms"] == pl.Int64
    # float32 printed shortest-round-trip, not as the widened float64
    assert df["observation"][0] == '{"state":[0.1,0.2,1e-7]}'
    assert df["action"][2] == "[0.33333334,0.0,-0.0]"
    for row, expected in zip(states(df), STATE, strict=True):
        assert np.array_equal(np.float32(row), np.float32(expected))


@pytest.mark.parametrize(
    ("value_type", "fixed"),
    [(pa.float32(), False), (pa.float64(), False), (pa.float64(), True), (pa.int32(), False)],
)
def test_list_and_float64_variants(value_type, fixed):
    rows = [[1, 2, 3], [4, 5, 6]] if pa.types.is_integer(value_type) else STATE[:2]
    columns = base(2)
    columns["observation.state"] = vectors(rows, value_type, fixed)
    columns["action"] = vectors(rows, value_type, fixed)
    df = frames_table(to_parquet(columns), path="x.parquet")
    assert states(df) == [[float(v) for v in r] for r in rows] or states(df) == rows
    assert json.loads(df["action"][1]) == pytest.approx(rows[1])


def test_float64_keeps_full_precision():
    columns = base(1)
    columns["observation.state"] = vectors([[1 / 3, 0.1, 2.0]], pa.float64(), fixed=False)
    df = frames_table(to_parquet(columns), path="x.parquet")
    assert states(df) == [[1 / 3, 0.1, 2.0]]


def test_missing_frame_index_and_episode_index_are_null():
    columns = base()
    del columns["frame_index"], columns["episode_index"]
    df = frames_table(to_parquet(columns), path="x.parquet")
    assert df["frame_index"].to_list() == [None, None, None]
    assert df["lerobot_episode_index"].to_list() == [None, None, None]
    assert df["frame_order"].to_list() == [0, 1, 2]


def test_missing_action_is_null():
    columns = base()
    del columns["action"]
    df = frames_table(to_parquet(columns), path="x.parquet")
    assert df["action"].to_list() == [None, None, None]
    assert df.schema["action"] == pl.String


def test_milliseconds_round_half_up():
    columns = base(timestamp=pa.array([0.0025, 0.0035, 1.0004], type=pa.float64()))
    df = frames_table(to_parquet(columns), path="x.parquet")
    assert df["timestamp_ms"].to_list() == [3, 4, 1000]


def test_timestamps_not_starting_at_zero_and_frame_order_start():
    columns = base(timestamp=pa.array([12.5, 12.5333, 12.5667], type=pa.float64()))
    df = frames_table(to_parquet(columns), path="x.parquet", frame_order_start=1000)
    assert df["timestamp_ms"].to_list() == [12500, 12533, 12567]
    assert df["frame_order"].to_list() == [1000, 1001, 1002]


def test_several_episodes_in_one_file_and_row_groups():
    n = 10
    columns = {
        "timestamp": pa.array([i % 5 / 10 for i in range(n)], type=pa.float32()),
        "observation.state": vectors([[float(i)] for i in range(n)]),
        "frame_index": pa.array([i % 5 for i in range(n)], type=pa.int64()),
        "episode_index": pa.array([3] * 5 + [4] * 5, type=pa.int64()),
    }
    data = to_parquet(columns, row_group_size=5)
    df = frames_table(data, path="x.parquet")
    assert df["frame_order"].to_list() == list(range(10))
    assert df["lerobot_episode_index"].to_list() == [3] * 5 + [4] * 5
    assert df["frame_index"].to_list() == [0, 1, 2, 3, 4] * 2
    stream = open_frame_file(data, path="x.parquet")
    batches = list(stream.batches(frame_order_start=7, batch_rows=4))
    assert all(b.height <= 4 for b in batches)
    assert pl.concat(batches)["frame_order"].to_list() == list(range(7, 17))


def test_nan_and_infinity_become_json_null():
    rows = [[math.nan, 1.0], [math.inf, -math.inf]]
    columns = {
        "timestamp": pa.array([0.0, 0.1], type=pa.float32()),
        "observation.state": vectors(rows),
        "action": vectors(rows, pa.float64(), fixed=False),
    }
    df = frames_table(to_parquet(columns), path="x.parquet")
    assert df["observation"].to_list() == ['{"state":[null,1.0]}', '{"state":[null,null]}']
    assert df["action"].to_list() == ["[null,1.0]", "[null,null]"]
    for text in df["observation"].to_list() + df["action"].to_list():
        json.loads(text)  # strict JSON, jsonb will take it


def test_null_vectors():
    columns = {
        "timestamp": pa.array([0.0, 0.1], type=pa.float32()),
        "observation.state": pa.array([[1.0], None], type=pa.list_(pa.float32())),
        "action": pa.array([None, [2.0]], type=pa.list_(pa.float32())),
    }
    df = frames_table(to_parquet(columns), path="x.parquet")
    assert df["observation"].to_list() == ['{"state":[1.0]}', '{"state":null}']
    assert df["action"].to_list() == [None, "[2.0]"]


def test_extra_columns_such_as_images_are_ignored():
    image = pa.array(
        [{"bytes": b"\x89PNG", "path": f"frame_{i}.png"} for i in range(3)],
        type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
    )
    columns = base(
        **{
            "observation.image": image,
            "index": pa.array([7, 8, 9]),
            "next.done": pa.array([False] * 3),
        }
    )
    df = frames_table(to_parquet(columns), path="x.parquet")
    assert df.columns == list(FRAME_COLUMNS)
    assert df.height == 3


def test_missing_timestamp_names_file_and_field():
    columns = base()
    del columns["timestamp"]
    with pytest.raises(FrameDataError) as error:
        frames_table(to_parquet(columns), path="ds/data/chunk-000/file-000.parquet")
    message = str(error.value)
    assert message.startswith("ds/data/chunk-000/file-000.parquet:")
    assert "'timestamp'" in message


def test_no_state_column_still_gives_one_row_per_parquet_row_and_says_why():
    columns = base()
    del columns["observation.state"]
    read = read_frame_file(to_parquet(columns), path="data/x.parquet")
    assert read.table["observation"].to_list() == ['{"state":null}'] * 3
    assert read.table["frame_order"].to_list() == [0, 1, 2]
    assert read.table["action"][0] == "[0.1,0.2,1e-7]"
    assert read.columns.state is None
    assert "data/x.parquet columns: no state feature" in read.columns.missing_state


@pytest.mark.parametrize(
    ("state", "action"),
    [("state", "actions"), ("observation.joint_state", "action"), ("observation.state", "actions")],
)
def test_state_and_action_under_other_names(state, action):
    columns = base()
    columns[state] = columns.pop("observation.state")
    columns[action] = columns.pop("action")
    read = read_frame_file(to_parquet(columns), path="x.parquet")
    assert (read.columns.state, read.columns.action) == (state, action)
    assert read.columns.missing_state is None
    assert states(read.table)[1] == pytest.approx(STATE[1])
    assert json.loads(read.table["action"][2]) == pytest.approx(STATE[2])


def test_resolved_features_from_info_json_win_over_the_files_columns():
    columns = base(state=vectors([[9.0], [9.0], [9.0]]))
    features = FrameFeatures(state="state", action=None, source="meta/info.json")
    read = read_frame_file(to_parquet(columns), path="x.parquet", features=features)
    assert states(read.table) == [[9.0]] * 3
    assert read.table["action"].to_list() == [None] * 3  # info.json names no action


def test_a_file_lacking_the_resolved_state_names_the_feature():
    columns = base()
    del columns["observation.state"]
    features = FrameFeatures(state="observation.state", action="action", source="meta/info.json")
    read = read_frame_file(to_parquet(columns), path="data/f.parquet", features=features)
    assert read.table["observation"].to_list() == ['{"state":null}'] * 3
    assert read.columns.missing_state.startswith(
        "data/f.parquet: field 'observation.state' is missing (meta/info.json names it the state"
    )


def test_two_observation_state_vectors_are_ambiguous_and_named():
    columns = base(
        **{"observation.state_arm": vectors(STATE), "observation.gripper_state": vectors(STATE)}
    )
    del columns["observation.state"]
    read = read_frame_file(to_parquet(columns), path="x.parquet")
    assert read.columns.state is None
    assert "observation.gripper_state, observation.state_arm" in read.columns.missing_state


def test_bad_timestamp_and_bad_types_name_file_and_field():
    columns = base(timestamp=pa.array([0.0, None, 0.2], type=pa.float64()))
    with pytest.raises(FrameDataError, match=r"f\.parquet: field 'timestamp' is None at row 1"):
        frames_table(to_parquet(columns), path="f.parquet")
    columns = base(**{"observation.state": pa.array(["a", "b", "c"])})
    with pytest.raises(FrameDataError, match=r"f\.parquet: field 'observation\.state' must be"):
        frames_table(to_parquet(columns), path="f.parquet")
    with pytest.raises(FrameDataError, match=r"f\.parquet: not a readable parquet"):
        frames_table(b"not parquet", path="f.parquet")


def test_scalar_state_is_wrapped_in_a_list():
    columns = base(**{"observation.state": pa.array([1.0, 2.0, 3.0], type=pa.float32())})
    df = frames_table(to_parquet(columns), path="x.parquet")
    assert states(df) == [[1.0], [2.0], [3.0]]


def test_empty_file_gives_an_empty_table_with_the_schema():
    columns = {k: v.slice(0, 0) for k, v in base().items()}
    df = frames_table(to_parquet(columns), path="x.parquet")
    assert df.height == 0
    assert df.columns == list(FRAME_COLUMNS)


def test_row_count_from_footer_and_file_sources(tmp_path):
    data = to_parquet(base())
    path = tmp_path / "f.parquet"
    path.write_bytes(data)
    assert parquet_row_count(data) == 3
    assert parquet_row_count(path) == 3
    with path.open("rb") as handle:
        assert frames_table(handle, path="f.parquet").height == 3
    assert frames_table(str(path), path="f.parquet").height == 3


def test_a_file_cut_inside_its_pages_is_an_error_not_a_short_stream():
    """Polars' streaming reader ends a truncated row group's stream early without raising (or
    panics in a worker thread): the rows read are counted against the footer's."""
    n = 2 * 4096
    pairs = vectors([[i, -i] for i in range(n)])
    columns = base(n, **{"observation.state": pairs, "action": pairs})
    buffer = io.BytesIO()
    pq.write_table(pa.table(columns), buffer, row_group_size=4096, compression="none")
    data = buffer.getvalue()
    footer = pq.ParquetFile(io.BytesIO(data)).metadata
    second_group = footer.row_group(1).column(0).data_page_offset
    cut = data[: second_group + 100] + data[-(footer.serialized_size + 8) :]  # footer kept

    got = []
    with pytest.raises(FrameDataError, match=r"x\.parquet: cannot read rows"):
        got.extend(open_frame_file(cut, path="data/x.parquet").batches(batch_rows=4096))
    assert sum(batch.height for batch in got) < n
    assert frames_table(data, path="x.parquet").height == n  # the reader is still usable
