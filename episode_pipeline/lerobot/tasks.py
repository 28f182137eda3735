"""Task texts from a LeRobot task table (``meta/tasks.parquet`` v3.0, ``meta/tasks.jsonl`` v2.x).

The episode title is the first row of the table. In v3.0 the text is the pandas index, stored as
``__index_level_0__`` by older writers and ``task`` by newer ones; the ``pandas`` schema metadata
(``index_columns``) says which, so it is read first.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import polars as pl

from episode_pipeline.lerobot.parquet import ParquetFile, ParquetSource, open_parquet


class TaskTableError(ValueError):
    """The task table cannot be read; the message names the file and the field."""


def _open_parquet(source: ParquetSource, path: str) -> ParquetFile:
    return open_parquet(source, path, TaskTableError)


def task_column(schema: pl.Schema, metadata: dict[str, str]) -> str | None:
    """The task text column: the pandas index column, else ``task``, else ``__index_level_0__``.

    `metadata` is the file's key-value metadata (pandas writes its own under ``pandas``)."""
    names = set(schema.names())
    pandas_meta = metadata.get("pandas")
    if pandas_meta:
        try:
            index_columns = json.loads(pandas_meta).get("index_columns") or []
        except (ValueError, AttributeError):
            index_columns = []
        for column in index_columns:
            if isinstance(column, str) and column in names:
                return column
    for candidate in ("task", "__index_level_0__"):
        if candidate in names:
            return candidate
    strings = [name for name, kind in schema.items() if kind == pl.String]
    return strings[0] if len(strings) == 1 else None


def tasks_from_parquet(source: ParquetSource, *, path: str = "meta/tasks.parquet") -> list[str]:
    """All task texts in file order."""
    parquet = _open_parquet(source, path)
    column = task_column(parquet.schema, parquet.key_value_metadata())
    if column is None:
        raise TaskTableError(
            f"{path}: field 'task' not found (no pandas index column, 'task' or "
            f"'__index_level_0__'; columns: {parquet.names})"
        )
    values = parquet.read([column]).get_column(column).to_list()
    return [str(v) for v in values if v is not None]


def tasks_from_jsonl(data: bytes | str, *, path: str = "meta/tasks.jsonl") -> list[str]:
    """All task texts in line order; blank lines are ignored, bad lines name the line number."""
    text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
    tasks = []
    for number, line in enumerate(io.StringIO(text), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise TaskTableError(f"{path}: line {number} is not JSON: {error}") from error
        if not isinstance(row, dict) or not isinstance(row.get("task"), str):
            raise TaskTableError(f"{path}: line {number} has no string field 'task'")
        tasks.append(row["task"])
    return tasks


def read_tasks(source: ParquetSource, *, path: str) -> list[str]:
    """Dispatch on the file name: ``.parquet`` or ``.jsonl``."""
    if path.endswith(".parquet"):
        return tasks_from_parquet(source, path=path)
    if path.endswith(".jsonl"):
        if isinstance(source, str | Path):
            data = Path(source).read_bytes()
        elif isinstance(source, bytes | bytearray):
            data = bytes(source)
        else:
            data = source.read()
        return tasks_from_jsonl(data, path=path)
    raise TaskTableError(f"{path}: not a task table (expected .parquet or .jsonl)")


def first_task(source: ParquetSource, *, path: str) -> str | None:
    """The episode title: the first row of the task table, ``None`` when the table is empty."""
    tasks = read_tasks(source, path=path)
    return tasks[0] if tasks else None
