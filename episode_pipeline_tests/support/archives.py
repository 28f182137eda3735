"""Archives built by hand."""

from __future__ import annotations

import io
import tarfile

import zstandard


def with_members(tar: bytes, extra: list[tuple[str, bytes]]) -> bytes:
    """The valid tar plus `extra` appended (GNU format: raw byte names stay raw)."""
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(tar)) as source,
        tarfile.open(
            fileobj=out, mode="w", format=tarfile.GNU_FORMAT, errors="surrogateescape"
        ) as target,
    ):
        for info in source.getmembers():
            target.addfile(info, source.extractfile(info) if info.isfile() else None)
        for name, data in extra:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            target.addfile(info, io.BytesIO(data))
    return zstandard.ZstdCompressor(level=3).compress(out.getvalue())
