"""Task tables: the v3.0 parquet (pandas index) and the v2.x jsonl."""

from __future__ import annotations

import io

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episode_pipeline.lerobot.tasks import (
    TaskTableError,
    first_task,
    read_tasks,
    tasks_from_jsonl,
    tasks_from_parquet,
)


def pandas_tasks(tasks, index_name):
    buffer = io.BytesIO()
    frame = pd.DataFrame({"task_index": range(len(tasks))}, index=pd.Index(tasks, name=index_name))
    frame.to_parquet(buffer)
    return buffer.getvalue()


def test_unnamed_pandas_index_is_index_level_0():
    data = pandas_tasks(["Pick the cube", "Place it"], None)
    assert "__index_level_0__" in pq.ParquetFile(pa.BufferReader(data)).schema_arrow.names
    assert tasks_from_parquet(data) == ["Pick the cube", "Place it"]
    assert first_task(data, path="meta/tasks.parquet") == "Pick the cube"


def test_named_task_index():
    data = pandas_tasks(["Fold the towel"], "task")
    assert first_task(data, path="meta/tasks.parquet") == "Fold the towel"


def test_index_columns_metadata_wins_over_column_names():
    data = pandas_tasks(["real text"], "instruction")
    assert first_task(data, path="meta/tasks.parquet") == "real text"


def test_plain_parquet_with_task_column_and_file_path(tmp_path):
    path = tmp_path / "tasks.parquet"
    pq.write_table(pa.table({"task_index": [0], "task": ["stack blocks"]}), path)
    assert read_tasks(path, path="meta/tasks.parquet") == ["stack blocks"]


def test_parquet_without_task_text_names_file_and_field():
    buffer = io.BytesIO()
    pq.write_table(pa.table({"task_index": [0], "a": ["x"], "b": ["y"]}), buffer)
    with pytest.raises(TaskTableError, match=r"^ds/meta/tasks\.parquet: field 'task'"):
        tasks_from_parquet(buffer.getvalue(), path="ds/meta/tasks.parquet")
    with pytest.raises(TaskTableError, match=r"ds/meta/tasks\.parquet: not a readable parquet"):
        tasks_from_parquet(b"garbage", path="ds/meta/tasks.parquet")


def test_jsonl():
    data = b'{"task_index": 0, "task": "first"}\n\n{"task_index": 1, "task": "second"}\n'
    assert tasks_from_jsonl(data) == ["first", "second"]
    assert first_task(io.BytesIO(data), path="meta/tasks.jsonl") == "first"
    assert first_task(b"", path="meta/tasks.jsonl") is None


def test_jsonl_errors_name_file_and_line():
    with pytest.raises(
        TaskTableError, match=r"meta/tasks\.jsonl: line 2 has no string field 'task'"
    ):
        tasks_from_jsonl(b'{"task": "ok"}\n{"task_index": 1}\n')
    with pytest.raises(TaskTableError, match="line 1 is not JSON"):
        tasks_from_jsonl(b"{oops\n")
    with pytest.raises(TaskTableError, match="not a task table"):
        read_tasks(b"", path="meta/tasks.csv")
