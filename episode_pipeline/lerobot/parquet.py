"""Opening a parquet from any source the readers accept, with an error that names the file."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

ParquetSource = str | Path | BinaryIO | bytes


def open_parquet(source: ParquetSource, path: str, error: type[Exception]) -> pq.ParquetFile:
    """A ParquetFile (footer read only); raises `error` naming `path` when it is not one.

    Without `pre_buffer`: pyarrow's default reads every requested row group's column chunks
    into memory before the first batch, so streaming a long episode would hold the whole file.
    """
    try:
        if isinstance(source, bytes | bytearray | memoryview):
            return pq.ParquetFile(pa.BufferReader(bytes(source)), pre_buffer=False)
        return pq.ParquetFile(source, pre_buffer=False)
    except (pa.ArrowException, OSError) as cause:
        raise error(f"{path}: not a readable parquet file: {cause}") from cause
