"""Turn one LeRobot data parquet into rows of the ``frames`` table.

Everything is column-wise polars (this feeds a COPY at tens of thousands of rows per second): the
JSON text of ``observation``/``action`` comes from ``struct.json_encode``, which prints float32
values shortest-round-trip and writes NaN/inf as ``null`` (jsonb rejects NaN).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import polars as pl

from episode_pipeline.lerobot.features import FrameFeatures, resolve_frame_features
from episode_pipeline.lerobot.parquet import ParquetFile, ParquetSource, open_parquet

TIMESTAMP = "timestamp"
FRAME_INDEX = "frame_index"
EPISODE_INDEX = "episode_index"


@dataclass(frozen=True)
class FrameColumn:
    """A column of the ``frames`` table, declared once: what this module produces (``dtype``;
    None for the partition's column, which the IO manager adds), its SQL type and meaning as
    the UI shows them, and whether the table must have it (``db/schema_check.py``) or gets it
    only when it has it (an application's table may lack what the pipeline can fill)."""

    name: str
    dtype: pl.DataType | None
    sql_type: str
    description: str
    required: bool = True


#: The ``frames`` table as the application reads it (db/migrations/001, docs/contract.md).
FRAMES_TABLE = "frames"
FRAMES_TABLE_COLUMNS = (
    FrameColumn("episode_id", None, "text", "The episode (the partition's EP)"),
    FrameColumn(
        "frame_order", pl.Int64(), "integer",
        "0-based position across the upload's data files, in path order", required=False,
    ),
    FrameColumn(
        "lerobot_episode_index", pl.Int64(), "integer", "`episode_index` of the parquet row",
        required=False,
    ),
    FrameColumn(
        "frame_index", pl.Int64(), "integer", "`frame_index` of the parquet row", required=False
    ),
    FrameColumn(
        "timestamp_ms", pl.Int64(), "bigint", "`timestamp` (seconds) times 1000, rounded half up"
    ),
    FrameColumn("observation", pl.String(), "jsonb", '`{"state": [...]}` from the state feature'),
    FrameColumn("action", pl.String(), "jsonb", "JSON array from the action feature"),
)  # fmt: skip
#: Output columns, in the order of the ``frames`` table (without id / episode_id).
FRAMES_SCHEMA = pl.Schema(
    {column.name: column.dtype for column in FRAMES_TABLE_COLUMNS if column.dtype is not None}
)
FRAME_COLUMNS = tuple(FRAMES_SCHEMA)
# Rows converted at a time: memory stays at a few MB per batch however long the episode.
BATCH_ROWS = 8_192
# Sees each batch as read, before conversion: its `timestamp` (seconds) and `episode_index`.
BatchObserver = Callable[[pl.DataFrame], None]


class FrameDataError(ValueError):
    """A data parquet cannot become frame rows; the message names the file and the field."""


def _open(source: ParquetSource, path: str) -> ParquetFile:
    return open_parquet(source, path, FrameDataError)


def parquet_row_count(source: ParquetSource, *, path: str = "<parquet>") -> int:
    """Row count from the footer alone (no column data read)."""
    return _open(source, path).num_rows


def _is_number(kind: pl.DataType) -> bool:
    return kind.is_float() or kind.is_integer()


def _vector_kind(kind: pl.DataType) -> str:
    """``list`` for a list or fixed-size array of numbers, ``scalar`` for a number."""
    if isinstance(kind, pl.List | pl.Array):
        return "list" if _is_number(kind.inner) else "unsupported"
    return "scalar" if _is_number(kind) else "unsupported"


@dataclass(frozen=True)
class FrameColumns:
    """What one data file provides: the columns to read and how its state and action are stored."""

    read: tuple[str, ...]  # parquet columns to read
    state: str | None  # the column read as the state; None: rows get {"state": null}
    action: str | None
    kinds: Mapping[str, str]  # state/action column → "list" or "scalar"
    missing_state: str | None = None  # why there is no state column, naming the feature


def features_from_schema(schema: pl.Schema, path: str) -> FrameFeatures:
    """The state/action rule applied to a data file's own columns (info.json lists none)."""
    numeric = {name: _vector_kind(kind) != "unsupported" for name, kind in schema.items()}
    return resolve_frame_features(numeric, source=f"{path} columns")


def frame_columns(schema: pl.Schema, path: str, features: FrameFeatures | None) -> FrameColumns:
    """Check one file's schema against the resolved features (``None``: resolve from the file)."""
    listed = schema.names()
    names = set(listed)
    if TIMESTAMP not in names:
        raise FrameDataError(f"{path}: field {TIMESTAMP!r} is missing (columns: {listed})")
    ts_type = schema[TIMESTAMP]
    if not _is_number(ts_type):
        raise FrameDataError(f"{path}: field {TIMESTAMP!r} must be numeric seconds, got {ts_type}")
    features = features or features_from_schema(schema, path)
    state = features.state if features.state in names else None
    action = features.action if features.action in names else None
    missing_state = features.missing_state
    if features.state is not None and state is None:
        missing_state = (
            f"{path}: field {features.state!r} is missing ({features.source} names it the state; "
            f"columns: {listed})"
        )
    kinds: dict[str, str] = {}
    for vector in (state, action):
        if vector is None:
            continue
        kinds[vector] = _vector_kind(schema[vector])
        if kinds[vector] == "unsupported":
            raise FrameDataError(
                f"{path}: field {vector!r} must be a list of numbers, got {schema[vector]}"
            )
    for integer in (FRAME_INDEX, EPISODE_INDEX):
        if integer in names and not schema[integer].is_integer():
            raise FrameDataError(
                f"{path}: field {integer!r} must be an integer, got {schema[integer]}"
            )
    wanted = (TIMESTAMP, state, action, FRAME_INDEX, EPISODE_INDEX)
    read = tuple(c for c in wanted if c is not None and c in names)
    return FrameColumns(read, state, action, kinds, missing_state)


def _json_array(column: str, kind: str) -> pl.Expr:
    """JSON array text of a numeric vector column; null stays null, NaN/inf become ``null``."""
    values = pl.concat_list(pl.col(column)) if kind == "scalar" else pl.col(column)
    encoded = (
        pl.struct(values.alias("v"))
        .struct.json_encode()
        .str.strip_prefix('{"v":')
        .str.strip_suffix("}")
    )
    return pl.when(pl.col(column).is_null()).then(None).otherwise(encoded)


def _convert(
    batch: pl.DataFrame, *, columns: FrameColumns, start: int, path: str, row_offset: int
) -> pl.DataFrame:
    seconds = pl.col(TIMESTAMP).cast(pl.Float64)
    bad = batch.select((seconds.is_null() | ~seconds.is_finite()).arg_true().first()).item()
    if bad is not None:
        value = batch[TIMESTAMP][bad]
        raise FrameDataError(
            f"{path}: field {TIMESTAMP!r} is {value!r} at row {row_offset + bad}; "
            "every frame needs a finite timestamp"
        )
    state = (
        _json_array(columns.state, columns.kinds[columns.state]).fill_null("null")
        if columns.state
        else pl.lit("null")
    )
    names = batch.columns
    return batch.select(
        pl.int_range(start, start + batch.height, dtype=pl.Int64).alias("frame_order"),
        (pl.col(EPISODE_INDEX) if EPISODE_INDEX in names else pl.lit(None))
        .cast(pl.Int64)
        .alias("lerobot_episode_index"),
        (pl.col(FRAME_INDEX) if FRAME_INDEX in names else pl.lit(None))
        .cast(pl.Int64)
        .alias("frame_index"),
        # Half-up like the original worker's Math.round (polars' round() is half-to-even).
        (seconds * 1000 + 0.5).floor().cast(pl.Int64).alias("timestamp_ms"),
        pl.concat_str(pl.lit('{"state":'), state, pl.lit("}")).alias("observation"),
        (
            _json_array(columns.action, columns.kinds[columns.action])
            if columns.action
            else pl.lit(None)
        )
        .cast(pl.String)
        .alias("action"),
    )


@dataclass(frozen=True)
class FrameFile:
    """One data file's frame rows and the columns they came from."""

    table: pl.DataFrame
    columns: FrameColumns


def _batches(
    parquet: ParquetFile,
    columns: FrameColumns,
    *,
    path: str,
    frame_order_start: int,
    batch_rows: int,
    observe: BatchObserver | None = None,
) -> Iterator[pl.DataFrame]:
    order = frame_order_start
    for batch in parquet.batches(columns.read, batch_rows):
        converted = _convert(
            batch,
            columns=columns,
            start=order,
            path=path,
            row_offset=order - frame_order_start,
        )
        if observe is not None:
            observe(batch)
        yield converted
        order += batch.height


@dataclass(frozen=True)
class FrameStream:
    """One data file opened for streaming: its columns now, its frame rows batch by batch."""

    parquet: ParquetFile
    columns: FrameColumns
    path: str

    def batches(
        self,
        frame_order_start: int = 0,
        batch_rows: int = BATCH_ROWS,
        observe: BatchObserver | None = None,
    ) -> Iterator[pl.DataFrame]:
        """Frame rows in bounded batches (memory stays flat for long episodes).

        A file can still turn out unreadable part-way (a non-finite timestamp, a corrupt page):
        `FrameDataError` after some batches were already yielded.
        """
        return _batches(
            self.parquet,
            self.columns,
            path=self.path,
            frame_order_start=frame_order_start,
            batch_rows=batch_rows,
            observe=observe,
        )


def open_frame_file(
    source: ParquetSource, *, path: str, features: FrameFeatures | None = None
) -> FrameStream:
    """Read the footer and check the schema against the features; no rows are read yet."""
    parquet = _open(source, path)
    return FrameStream(parquet, frame_columns(parquet.schema, path, features), path)


def read_frame_file(
    source: ParquetSource,
    *,
    path: str,
    features: FrameFeatures | None = None,
    frame_order_start: int = 0,
) -> FrameFile:
    """The whole file as one frames DataFrame (columns :data:`FRAME_COLUMNS`) and its columns.

    ``features`` are the upload's resolved state/action names (``None``: resolve from this
    file's columns). ``frame_order`` counts on from ``frame_order_start`` so several data files of
    one upload number their frames 0..N-1 across files (pass the running total).
    """
    stream = open_frame_file(source, path=path, features=features)
    batches = list(stream.batches(frame_order_start))
    table = pl.concat(batches, how="vertical") if batches else pl.DataFrame(schema=FRAMES_SCHEMA)
    return FrameFile(table, stream.columns)


def frames_table(
    source: ParquetSource,
    *,
    path: str,
    features: FrameFeatures | None = None,
    frame_order_start: int = 0,
) -> pl.DataFrame:
    """The frames DataFrame of one file (see :func:`read_frame_file`)."""
    return read_frame_file(
        source, path=path, features=features, frame_order_start=frame_order_start
    ).table
