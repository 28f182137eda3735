"""One partition's rows of an application table, in SQL: replaced atomically with COPY, or read.

The statements behind the PostgreSQL IO manager (`defs/io_managers/postgres_tables.py`, which
maps Dagster's partitions and metadata onto these): in ONE transaction, an advisory lock on
(table, partition), DELETE the partition's rows, then COPY the new ones in COPY's text format
written column-wise by polars, slice by slice, each part under a savepoint. The frames table's
rows are written here (`frames` asset → the IO manager → `replace_partition`).

Text format, not CSV: JSON is full of commas and quotes that CSV would quote and double, which
costs more than the COPY itself on the client; tab-separated text needs escaping only for a
backslash, tab, newline or carriage return, which float vectors never contain. NULL is `\\N`
and an empty string an empty field, so NULL and '' survive the trip distinctly. Nested columns
(struct, list, array) are sent as JSON text (for jsonb/json columns). Read back, json/jsonb
columns come as **text** (JSON strings, exactly as PostgreSQL prints them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl
import psycopg
from psycopg import sql
from psycopg.types.string import TextLoader

from episode_pipeline.runtime.injection_points import MID_COPY, reach

# Rows per COPY write: a few MB of text at most, so the client's memory stays flat.
COPY_SLICE_ROWS = 10_000
_JSON_TAG = "__v"
_NULL = "\\N"
# COPY text format's escapes; the backslash first, so the others' backslashes stay single.
_TEXT_ESCAPES = (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r"))
_TEXT_SPECIAL = "[\\\\\t\n\r]"

# PostgreSQL type name (pg_type.typname) → polars dtype for loaded frames. Others are inferred.
_PG_TO_POLARS: dict[str, pl.DataType] = {
    "int2": pl.Int16(),
    "int4": pl.Int32(),
    "int8": pl.Int64(),
    "float4": pl.Float32(),
    "float8": pl.Float64(),
    "bool": pl.Boolean(),
    "text": pl.String(),
    "varchar": pl.String(),
    "bpchar": pl.String(),
    "json": pl.String(),
    "jsonb": pl.String(),
    "uuid": pl.String(),
    "date": pl.Date(),
    "timestamp": pl.Datetime("us"),
    "timestamptz": pl.Datetime("us", "UTC"),
}


class TableMismatch(ValueError):
    """The frame's columns do not fit the table (or the table does not exist)."""


class SkippedRows(Exception):
    """Raised by a `RowBatches` part's producer: drop that part's rows, copy the other parts."""


# A `PartitionTable`'s definition-metadata keys, one per field, as the UI shows them.
_TABLE_KEY = "table"
_PARTITION_COLUMN_KEY = "partition_expr"
_ORDER_BY_KEY = "order_by"
_OPTIONAL_COLUMNS_KEY = "optional_columns"


@dataclass(frozen=True)
class PartitionTable:
    """Where an asset's rows live, one partition at a time, as the asset declares it for the
    PostgreSQL IO manager: the table, the column holding the partition's value, the order its
    rows load in (a column or several), and the columns written only when the table has them
    (an application's table may lack what the pipeline can fill).

    It travels as the asset's definition metadata (`as_metadata`, under the keys the UI has
    always shown) and the IO manager reads it back (`from_metadata`).
    """

    table: str
    partition_column: str
    order_by: str | tuple[str, ...] | None = None
    optional_columns: tuple[str, ...] = ()

    def as_metadata(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {
            _TABLE_KEY: self.table,
            _PARTITION_COLUMN_KEY: self.partition_column,
        }
        if self.order_by is not None:
            order_by = self.order_by
            metadata[_ORDER_BY_KEY] = order_by if isinstance(order_by, str) else list(order_by)
        if self.optional_columns:
            metadata[_OPTIONAL_COLUMNS_KEY] = list(self.optional_columns)
        return metadata

    @classmethod
    def from_metadata(
        cls, metadata: Mapping[str, Any] | None, asset_path: Sequence[str]
    ) -> PartitionTable:
        """The declaration in an asset's definition metadata; the table defaults to the asset's
        name, the partition column has none."""
        metadata = metadata or {}
        partition_column = metadata.get(_PARTITION_COLUMN_KEY)
        if not partition_column:
            raise ValueError(
                f"asset {'/'.join(asset_path)!r} is partitioned but has no "
                f'"{_PARTITION_COLUMN_KEY}" definition metadata naming the column that holds '
                f"the partition (e.g. metadata={{'{_PARTITION_COLUMN_KEY}': 'episode_id'}})"
            )
        order_by = metadata.get(_ORDER_BY_KEY)
        return cls(
            table=str(metadata.get(_TABLE_KEY) or asset_path[-1]),
            partition_column=str(partition_column),
            order_by=order_by if order_by is None or isinstance(order_by, str) else tuple(order_by),
            optional_columns=tuple(metadata.get(_OPTIONAL_COLUMNS_KEY) or ()),
        )


@dataclass(frozen=True)
class RowBatches:
    """A partition's rows as DataFrames made one after another: an asset's streamed output.

    The IO manager copies each batch as it comes, so a long episode is never held in memory
    whole. `parts` are groups of batches (one per source file, say), each copied under a
    savepoint so that a producer raising `SkippedRows` part-way drops exactly that part's rows.
    `schema` names the columns (and stands for an empty stream); `metadata`, called after the
    last batch, is what the producer learned while producing (rows read, files skipped), added
    to the output's metadata.
    """

    parts: Iterable[Iterable[pl.DataFrame]]
    schema: Mapping[str, pl.DataType]
    metadata: Callable[[], Mapping[str, Any]] | None = None


def text_ready(df: pl.DataFrame) -> pl.DataFrame:
    """The frame as COPY's text format wants it: nested columns as JSON text, strings escaped.

    A null stays null (SQL NULL), not the JSON literal `null`. Only string columns that hold a
    backslash, tab, newline or carriage return are rewritten (one vectorised scan finds them).
    """
    nested = [
        name
        for name, dtype in df.schema.items()
        if isinstance(dtype, pl.Struct | pl.List | pl.Array)
    ]
    if nested:
        df = df.with_columns(
            pl.when(pl.col(name).is_null())
            .then(None)
            .otherwise(
                pl.struct(pl.col(name).alias(_JSON_TAG))
                .struct.json_encode()
                .str.strip_prefix(f'{{"{_JSON_TAG}":')
                .str.strip_suffix("}")
            )
            .alias(name)
            for name in nested
        )
    strings = [name for name, dtype in df.schema.items() if dtype == pl.String]
    if not strings or df.height == 0:
        return df
    needs = df.select(pl.col(name).str.contains(_TEXT_SPECIAL).any() for name in strings).row(0)
    escape = [name for name, flag in zip(strings, needs, strict=True) if flag]
    if not escape:
        return df
    escaped = [pl.col(name) for name in escape]
    for raw, text in _TEXT_ESCAPES:
        escaped = [e.str.replace_all(raw, text, literal=True) for e in escaped]
    return df.with_columns(e.alias(name) for e, name in zip(escaped, escape, strict=True))


@contextlib.contextmanager
def closed_after(iterable: Iterable[Any]) -> Iterator[Iterator[Any]]:
    """Iterate `iterable`, then close it however the loop ends: a producer's generator that
    holds a temporary folder across its yields removes it now, not when it is collected."""
    iterator = iter(iterable)
    try:
        yield iterator
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


def copy_chunks(df: pl.DataFrame, slice_rows: int = COPY_SLICE_ROWS) -> Iterator[bytes]:
    """COPY text-format bytes of `df`, `slice_rows` rows at a time: bounded memory."""
    for frame in df.iter_slices(slice_rows):
        text = text_ready(frame).write_csv(
            None, include_header=False, separator="\t", quote_style="never", null_value=_NULL
        )
        yield text.encode("utf-8")


def qualified(schema: str, table: str) -> str:
    return f"{schema}.{table}"


def replace_partition(
    conn: psycopg.Connection,
    schema: str,
    table: str,
    rows: pl.DataFrame | RowBatches,
    partition_column: str,
    partition_value: Any,
    optional_columns: Sequence[str] = (),
) -> int:
    """Make `rows` (one DataFrame, or batches of them) the rows of one partition, inside the
    caller's transaction: DELETE the partition's rows, COPY the rows batch by batch (the
    partition column added when missing). Returns the rows copied. Any error, in any batch,
    leaves the previous rows in place once the caller's transaction rolls back."""
    if isinstance(rows, pl.DataFrame):
        rows = RowBatches([[rows]], rows.schema)
    target = sql.Identifier(schema, table)
    present = table_columns(conn, schema, table)
    columns = [name for name in rows.schema if name != partition_column]
    columns = [name for name in columns if name in present or name not in optional_columns]
    extra = [name for name in columns if name not in present]
    if extra:
        raise TableMismatch(
            f"{qualified(schema, table)} has no column(s) {', '.join(extra)} "
            f"(frame columns: {', '.join(rows.schema)}; "
            f"table columns: {', '.join(present)})"
        )
    columns.append(partition_column)
    # Two runs replacing the same partition would interleave DELETE and COPY: serialize.
    conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
        (f"{schema}.{table}:{partition_column}={partition_value}",),
    )
    conn.execute(
        sql.SQL("DELETE FROM {} WHERE {} = %s").format(target, sql.Identifier(partition_column)),
        (partition_value,),
    )
    copy_sql = sql.SQL("COPY {} ({}) FROM STDIN").format(
        target, sql.SQL(", ").join(sql.Identifier(name) for name in columns)
    )
    written = 0
    with conn.cursor() as cur, closed_after(rows.parts) as parts:
        for part in parts:
            cur.execute("SAVEPOINT copy_part")
            try:
                with cur.copy(copy_sql) as copy:
                    copied = 0
                    for batch in part:
                        if batch.height == 0:
                            continue
                        batch = with_partition_column(
                            batch, partition_column, partition_value, qualified(schema, table)
                        ).select(columns)
                        for chunk in copy_chunks(batch):
                            copy.write(chunk)
                        copied += batch.height
                        reach(MID_COPY, about=f"{table}:{partition_value}")
            except SkippedRows:
                cur.execute("ROLLBACK TO SAVEPOINT copy_part")
                continue
            cur.execute("RELEASE SAVEPOINT copy_part")
            written += copied
    return written


def select_partitions(
    conn: psycopg.Connection,
    schema: str,
    table: str,
    column: str,
    values: Sequence[Any],
    order_by: str | Sequence[str] | None = None,
) -> pl.DataFrame:
    """The partitions' rows as a DataFrame (json/jsonb as text), typed from the result."""
    query = sql.SQL("SELECT * FROM {} WHERE {} = ANY(%s)").format(
        sql.Identifier(schema, table), sql.Identifier(column)
    )
    params = (list(values),)
    if order_by:
        names = [order_by] if isinstance(order_by, str) else list(order_by)
        query += sql.SQL(" ORDER BY {}").format(
            sql.SQL(", ").join(sql.Identifier(name) for name in names)
        )
    with conn.cursor() as cur:
        for json_type in ("json", "jsonb"):
            cur.adapters.register_loader(json_type, TextLoader)
        try:
            cur.execute(query, params)
        except psycopg.errors.UndefinedTable as error:
            raise TableMismatch(f"table {qualified(schema, table)} does not exist") from error
        except psycopg.errors.UndefinedColumn as error:
            raise TableMismatch(
                f"{qualified(schema, table)}: {error.diag.message_primary} "
                f"(partition_expr {column!r}, order_by {order_by!r})"
            ) from error
        names = [desc.name for desc in cur.description]
        dtypes = [_PG_TO_POLARS.get(_type_name(conn, desc.type_code)) for desc in cur.description]
        rows = cur.fetchall()
    overrides = {name: dtype for name, dtype in zip(names, dtypes, strict=True) if dtype}
    return pl.DataFrame(
        rows, schema=names, schema_overrides=overrides, orient="row", infer_schema_length=None
    )


def with_partition_column(frame: pl.DataFrame, column: str, value: Any, table: str) -> pl.DataFrame:
    """Add the partition column when missing; refuse rows that belong to another partition."""
    if column not in frame.columns:
        return frame.with_columns(pl.lit(value).alias(column))
    stray = frame.filter(pl.col(column).ne_missing(pl.lit(value)))
    if stray.height:
        sample = stray.get_column(column).head(3).to_list()
        raise ValueError(
            f"{stray.height} row(s) for {table} have {column} other "
            f"than the partition's {value!r} (e.g. {sample}); they would escape the replace"
        )
    return frame


def table_columns(conn: psycopg.Connection, schema: str, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        (schema, table),
    ).fetchall()
    if not rows:
        raise TableMismatch(
            f"table {qualified(schema, table)} does not exist (or has no columns visible "
            "to this user): run the migrations"
        )
    return [row[0] for row in rows]


def _type_name(conn: psycopg.Connection, oid: int) -> str | None:
    info = conn.adapters.types.get(oid)
    return info.name if info is not None else None
