"""Reading a parquet from any source the readers accept, with errors that name the file.

Polars reads the files itself (one columnar library in the image, docs/deploy-aws.md#image-size).
Its streaming reader can end a corrupt file's stream early without raising, or panic in a worker
thread, so `ParquetFile.batches` counts the rows it got against the footer's count.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import polars as pl

ParquetSource = str | Path | BinaryIO | bytes
# What polars raises for a file it cannot read: its own errors, the OS's, and a Rust panic
# (a BaseException, not an Exception).
READ_ERRORS = (pl.exceptions.PolarsError, pl.exceptions.PanicException, OSError)


class UnreadableParquet(ValueError):
    """A parquet that cannot be read; the message names the file."""


@dataclass(frozen=True)
class ParquetFile:
    """One parquet opened from its footer: schema, row count and key-value metadata."""

    source: str | Path | bytes
    path: str  # the name errors use (the file's path inside the archive)
    schema: pl.Schema
    num_rows: int
    error: type[Exception]

    @property
    def names(self) -> list[str]:
        return list(self.schema.names())

    def key_value_metadata(self) -> dict[str, str]:
        """The footer's key-value metadata (pandas and arrow writers store theirs here)."""
        try:
            return pl.read_parquet_metadata(self.source)
        except READ_ERRORS as cause:
            raise self.error(f"{self.path}: cannot read the footer: {cause}") from cause

    def read(self, columns: Sequence[str]) -> pl.DataFrame:
        """The whole file's `columns` at once (small tables)."""
        try:
            return pl.read_parquet(self.source, columns=list(columns))
        except READ_ERRORS as cause:
            raise self.error(f"{self.path}: cannot read rows: {cause}") from cause

    def batches(self, columns: Sequence[str], batch_rows: int) -> Iterator[pl.DataFrame]:
        """The file's `columns` in batches of `batch_rows`, streamed: memory stays flat."""
        read = 0
        try:
            query = pl.scan_parquet(self.source).select(list(columns))
            for batch in query.collect_batches(chunk_size=batch_rows, maintain_order=True):
                read += batch.height
                # Made of the reader's morsels (~10 chunks a column): one chunk each, or every
                # column computed from it, the COPY text included, is written piece by piece.
                yield batch.rechunk()
        except READ_ERRORS as cause:
            raise self.error(f"{self.path}: cannot read rows: {cause}") from cause
        if read != self.num_rows:
            raise self.error(
                f"{self.path}: cannot read rows: the stream ended after {read} of the "
                f"{self.num_rows} rows its footer counts (a corrupt page)"
            )


def open_parquet(source: ParquetSource, path: str, error: type[Exception]) -> ParquetFile:
    """The file's footer (no column data read); raises `error` naming `path` when it is none.

    A file object is read into memory once (polars would read it again for every query); the
    frames asset passes a local path, which polars streams from.
    """
    if isinstance(source, bytearray | memoryview):
        source = bytes(source)
    elif not isinstance(source, str | Path | bytes):
        source = source.read()
    try:
        schema = pl.read_parquet_schema(source)
        rows = pl.scan_parquet(source).select(pl.len()).collect().item()
    except READ_ERRORS as cause:
        raise error(f"{path}: not a readable parquet file: {cause}") from cause
    return ParquetFile(source, path, pl.Schema(schema), int(rows), error)


def read_rows(
    source: ParquetSource, path: str, wanted: set[str], error: type[Exception] = UnreadableParquet
) -> list[dict]:
    """The rows of a small table as dicts, with only the `wanted` columns the file has."""
    parquet = open_parquet(source, path, error)
    return parquet.read([name for name in parquet.names if name in wanted]).to_dicts()
