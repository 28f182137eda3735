"""IO manager logic that needs no services: keys, encodings, the text that COPY reads."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import PurePosixPath

import polars as pl
import pytest
from dagster import AssetKey

from episode_pipeline.db.partition_tables import (
    PartitionTable,
    copy_chunks,
    text_ready,
    with_partition_column,
)
from episode_pipeline.defs.assets.frames import FRAMES_ROWS
from episode_pipeline.defs.io_managers.postgres_tables import PostgresPolarsIOManager
from episode_pipeline.defs.io_managers.s3_outputs import encode, object_key, to_jsonable
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.episodes.keys import InvalidEpisodeKey


@dataclasses.dataclass
class _Manifest:
    keys: list[str]
    when: datetime
    path: PurePosixPath


class _WithJsonDict:
    def to_json_dict(self) -> dict:
        return {"kind": "custom", "n": 3}


def test_object_key_puts_episode_outputs_beside_processed_files() -> None:
    key = object_key(AssetKey("extracted_files"), "acme/ep-1")
    assert key == "orgs/acme/episodes/ep-1/processed/_dagster/extracted_files.json"


def test_object_key_unpartitioned_and_prefixed_assets() -> None:
    key = object_key(AssetKey(["lake", "summary"]), None)
    assert key == "_dagster/lake/summary.json"


def test_object_key_rejects_a_bad_partition_key() -> None:
    with pytest.raises(InvalidEpisodeKey, match="not ORG/EPISODE"):
        object_key(AssetKey("x"), "no-slash")


def test_to_jsonable_handles_dataclasses_custom_objects_and_dates() -> None:
    when = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    value = {"m": _Manifest(["a", "b"], when, PurePosixPath("x/y")), "c": _WithJsonDict()}
    assert to_jsonable(value) == {
        "m": {"keys": ["a", "b"], "when": "2026-11-29T12:00:00+00:00", "path": "x/y"},
        "c": {"kind": "custom", "n": 3},
    }


def test_to_jsonable_names_what_it_cannot_store() -> None:
    with pytest.raises(TypeError, match="cannot store a bytes"):
        to_jsonable({"raw": b"\x00"})


def test_encode_writes_json_and_refuses_what_json_cannot_hold() -> None:
    assert json.loads(encode([{"k": 1}])) == [{"k": 1}]
    with pytest.raises(TypeError, match="cannot store a DataFrame"):
        encode(pl.DataFrame({"a": [1, 2]}))


def _copy_rows(chunks: list[bytes]) -> list[list[str | None]]:
    """Parse COPY's text format the way the server does: tab fields, \\N NULL, backslash escapes."""
    escapes = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}
    rows: list[list[str | None]] = []
    for line in b"".join(chunks).decode().split("\n")[:-1]:
        row: list[str | None] = []
        for field in line.split("\t"):
            if field == "\\N":
                row.append(None)
                continue
            out, chars = [], iter(field)
            for char in chars:
                out.append(escapes[next(chars)] if char == "\\" else char)
            row.append("".join(out))
        rows.append(row)
    return rows


def test_copy_text_distinguishes_null_from_empty_string() -> None:
    frame = pl.DataFrame({"id": [1, 2, 3], "s": ["", None, 'a,"b"']})
    text = b"".join(copy_chunks(frame)).decode()
    assert text.splitlines() == ["1\t", "2\t\\N", '3\ta,"b"']


def test_copy_text_escapes_what_the_format_would_misread() -> None:
    hostile = ["back\\slash", "tab\there", "two\nlines", "cr\rhere", '{"k": "\\n"}', "plain"]
    frame = pl.DataFrame({"s": hostile, "other": ["x"] * len(hostile)})
    assert [row[0] for row in _copy_rows(list(copy_chunks(frame)))] == hostile
    # A column without special characters is written as it is.
    assert text_ready(frame).get_column("other").to_list() == ["x"] * len(hostile)


def test_text_ready_turns_nested_columns_into_json_text_and_keeps_nulls() -> None:
    frame = pl.DataFrame(
        {
            "observation": [{"state": [1.0, 2.5]}, {"state": []}, None],
            "action": [[0.5, -1.0], None, []],
        }
    )
    ready = text_ready(frame)
    assert ready.schema == {"observation": pl.String, "action": pl.String}
    assert ready.get_column("observation").to_list() == [
        '{"state":[1.0,2.5]}',
        '{"state":[]}',
        None,
    ]
    assert ready.get_column("action").to_list() == ["[0.5,-1.0]", None, "[]"]
    assert [json.loads(v) for v in ready.get_column("action").drop_nulls()] == [[0.5, -1.0], []]


def test_text_ready_handles_fixed_size_arrays() -> None:
    frame = pl.DataFrame({"a": [[1.0, 2.0]]}, schema={"a": pl.Array(pl.Float32, 2)})
    assert text_ready(frame).get_column("a").to_list() == ["[1.0,2.0]"]


def test_copy_chunks_slice_without_headers() -> None:
    frame = pl.DataFrame({"n": list(range(10))})
    chunks = list(copy_chunks(frame, slice_rows=4))
    assert len(chunks) == 3
    assert [int(row[0] or "") for row in _copy_rows(chunks)] == list(range(10))


def _manager() -> PostgresPolarsIOManager:
    return PostgresPolarsIOManager(postgres=PostgresResource(host="unused"))


def test_partition_value_is_the_episode_id() -> None:
    assert _manager().partition_value("acme/ep-7") == "ep-7"


def test_partition_column_added_when_missing() -> None:
    frame = pl.DataFrame({"frame_order": [0, 1]})
    out = with_partition_column(frame, "episode_id", "ep-7", "public.frames")
    assert out.get_column("episode_id").to_list() == ["ep-7", "ep-7"]


def test_rows_of_another_partition_are_refused() -> None:
    frame = pl.DataFrame({"episode_id": ["ep-7", "ep-8", None]})
    with pytest.raises(ValueError, match=r"2 row\(s\) for public.frames have episode_id"):
        with_partition_column(frame, "episode_id", "ep-7", "public.frames")


def test_a_partition_table_travels_as_the_metadata_keys_the_ui_shows() -> None:
    assert FRAMES_ROWS.as_metadata() == {
        "table": "frames",
        "partition_expr": "episode_id",
        "order_by": "frame_order",
        "optional_columns": ["frame_order", "lerobot_episode_index", "frame_index"],
    }
    assert PartitionTable.from_metadata(FRAMES_ROWS.as_metadata(), ["frames"]) == FRAMES_ROWS
    several = PartitionTable("t", "episode_id", order_by=("a", "b"))
    assert PartitionTable.from_metadata(several.as_metadata(), ["x"]) == several
    # The table defaults to the asset's name; the partition column has no default.
    assert PartitionTable.from_metadata({"partition_expr": "id"}, ["ns", "rows"]).table == "rows"
    with pytest.raises(ValueError, match="'ns/rows' is partitioned but has no \"partition_expr\""):
        PartitionTable.from_metadata({"table": "rows"}, ["ns", "rows"])


def test_schema_config_uses_its_alias() -> None:
    manager = PostgresPolarsIOManager(postgres=PostgresResource(host="h"), schema="staging")
    assert manager.schema_ == "staging"
    assert manager._qualified_name("frames") == "staging.frames"
