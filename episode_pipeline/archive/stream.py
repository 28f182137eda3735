"""Stream the members out of a `.tar.zst` in one pass, with safety limits.

The archive arrives as a binary stream (an S3 ``StreamingBody`` in production). It is decompressed
and untarred on the fly: nothing but the member currently being read is ever in flight, so the
whole archive is never held expanded in memory or on disk. Callers read each member's file object
before asking for the next one (tar streams cannot go back).
"""

from __future__ import annotations

import contextlib
import io
import posixpath
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import zstandard

from episode_pipeline.config.settings import ArchiveLimits
from episode_pipeline.storage.aws import aws_fault

READ_SIZE = 1 << 20  # 1 MiB: the measured sweet spot for zstandard.stream_reader + tarfile "r|"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# Long-name and pax headers are read into memory whole by tarfile: cap them before it does.
MAX_EXTENDED_HEADER_BYTES = 1 << 20
# Member names are UTF-8 (pax) or bytes (ustar); undecodable bytes become lone surrogates, so a
# name S3 cannot hold is recognised instead of silently mangled.
NAME_ENCODING = "utf-8"
NAME_ERRORS = "surrogateescape"


class ArchiveError(Exception):
    """A problem with one archive; the message always names the archive."""


class CorruptArchive(ArchiveError):
    """The zstd frame or the tar stream inside it cannot be read."""


class DuplicateMember(ArchiveError):
    """Two regular files in one archive share a path: which is the dataset's is unknown."""


class UndecodableMemberName(ArchiveError):
    """A member name is not valid UTF-8, so no S3 key can name it faithfully."""


class ArchiveLimitExceeded(ArchiveError):
    """The archive is larger (or has more members) than the configured limits allow."""


class TooManyMembers(ArchiveLimitExceeded):
    """More tar entries than `max_members`."""


class ArchiveTooLarge(ArchiveLimitExceeded):
    """The decompressed tar stream is over `max_total_bytes`."""


class DecompressionRatioExceeded(ArchiveLimitExceeded):
    """A small archive expanding enormously (a zstd bomb), stopped early."""


class MemberTooLarge(ArchiveLimitExceeded):
    """One member is over `max_member_bytes` (or a tar header over its own cap)."""


class MemberPathTooDeep(ArchiveLimitExceeded):
    """A member path has more folders than `max_path_depth` or more bytes than `max_path_bytes`."""


class MetadataTooLarge(ArchiveLimitExceeded):
    """A member read into memory (`meta/info.json`, task tables) is over `max_metadata_bytes`."""


DEFAULT_LIMITS = ArchiveLimits()


@dataclass(frozen=True)
class SkippedMember:
    """A tar entry that was not yielded, and why (logged by the caller, never fatal)."""

    name: str
    reason: str


class MemberReader(io.RawIOBase):
    """Read-only, deliberately non-seekable view of one member's bytes.

    ``seekable()`` is False so boto3's ``upload_fileobj`` streams it instead of trying to seek.
    It becomes unreadable once the archive iterator moves on to the next member.
    """

    def __init__(self, raw: BinaryIO, *, archive: str, path: str, size: int) -> None:
        super().__init__()
        self._raw = raw
        self.archive = archive
        self._path = path
        self._remaining = size
        self._expired = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def writable(self) -> bool:
        return False

    def readinto(self, buffer) -> int:  # type: ignore[override]
        if self._expired:
            raise ValueError(
                f"{self.archive}: member {self._path!r} was already passed; "
                "read it before advancing the archive iterator"
            )
        if self._remaining <= 0:
            return 0
        view = memoryview(buffer).cast("B")
        want = min(len(view), self._remaining)
        try:
            chunk = self._raw.read(want)
        except (zstandard.ZstdError, tarfile.TarError, EOFError, OSError) as error:
            if aws_fault(error) is not None:  # S3 failing (a read timeout is an OSError) is not
                raise  # a corrupt archive: the run fails on the storage, and is retried
            raise CorruptArchive(
                f"{self.archive}: cannot read member {self._path!r}: {error}"
            ) from error
        if not chunk:
            raise CorruptArchive(
                f"{self.archive}: member {self._path!r} is truncated "
                f"({self._remaining} bytes missing)"
            )
        view[: len(chunk)] = chunk
        self._remaining -= len(chunk)
        return len(chunk)

    def _expire(self) -> None:
        self._expired = True


@dataclass
class ArchiveMember:
    """One regular file of the archive: normalised relative path, size and its byte stream."""

    path: str
    size: int
    fileobj: MemberReader = field(repr=False)
    max_read_bytes: int = DEFAULT_LIMITS.max_metadata_bytes

    def read(self) -> bytes:
        """All the bytes, for small members such as meta/info.json (never a video)."""
        if self.size > self.max_read_bytes:
            raise MetadataTooLarge(
                f"{self.fileobj.archive}: member {self.path!r} has {self.size} bytes, more than "
                f"max_metadata_bytes={self.max_read_bytes} to read into memory"
            )
        return self.fileobj.read()


class _CountingReader(io.RawIOBase):
    """Counts bytes on both sides of the decompressor, so a zstd bomb stops early.

    `compressed` is the reader the decompressor pulls from; the decompressed total is checked
    against `max_total_bytes`, and its ratio to the compressed bytes against `max_ratio` once
    `ratio_grace_bytes` are out (small archives of repetitive metadata are not bombs).
    """

    def __init__(
        self,
        raw: BinaryIO,
        compressed: _MagicCheckingReader,
        *,
        archive: str,
        limits: ArchiveLimits,
    ) -> None:
        super().__init__()
        self._raw = raw
        self._compressed = compressed
        self._archive = archive
        self._limits = limits
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        try:
            chunk = self._raw.read(len(view))
        except zstandard.ZstdError as error:
            raise CorruptArchive(f"{self._archive}: corrupt zstd stream: {error}") from error
        self.count += len(chunk)
        limits = self._limits
        if self.count > limits.max_total_bytes:
            raise ArchiveTooLarge(
                f"{self._archive}: decompressed size exceeds max_total_bytes="
                f"{limits.max_total_bytes}"
            )
        compressed = max(1, self._compressed.count)
        if self.count > limits.ratio_grace_bytes and self.count > limits.max_ratio * compressed:
            raise DecompressionRatioExceeded(
                f"{self._archive}: {compressed} compressed bytes expanded to {self.count} "
                f"(ratio over max_ratio={limits.max_ratio:g}): refused as a decompression bomb"
            )
        view[: len(chunk)] = chunk
        return len(chunk)


class _MagicCheckingReader(io.RawIOBase):
    """Checks the first four bytes are the zstd magic, for a clear error on a plain tar/gzip."""

    def __init__(self, raw: BinaryIO, *, archive: str) -> None:
        super().__init__()
        self._raw = raw
        self._archive = archive
        self._pending: bytes | None = None
        self.count = 0  # compressed bytes handed to the decompressor

    def readable(self) -> bool:
        return True

    def _check(self) -> None:
        head = b""
        while len(head) < len(_ZSTD_MAGIC):
            more = self._raw.read(len(_ZSTD_MAGIC) - len(head))
            if not more:
                break
            head += more
        self.count += len(head)
        if head != _ZSTD_MAGIC:
            what = "empty input" if not head else f"starts with {head!r}"
            raise CorruptArchive(f"{self._archive}: not a zstd stream ({what})")
        self._pending = head  # handed back to the decompressor with the rest

    def readinto(self, buffer) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        if self._pending is None:
            self._check()
        if self._pending:
            size = min(len(view), len(self._pending))
            view[:size] = self._pending[:size]
            self._pending = self._pending[size:]
            return size
        chunk = self._raw.read(len(view))
        self.count += len(chunk)
        view[: len(chunk)] = chunk
        return len(chunk)


class _BoundedTarInfo(tarfile.TarInfo):
    """tarfile's header reader, refusing what it would otherwise swallow silently.

    - a long-name or pax header over `MAX_EXTENDED_HEADER_BYTES` (tarfile reads it into memory);
    - a garbage header after the first member (tarfile takes it for the end of the archive, so a
      damaged archive would look complete with members missing).
    """

    @classmethod
    def fromtarfile(cls, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:  # type: ignore[override]
        try:
            return super().fromtarfile(tarfile_)
        except tarfile.InvalidHeaderError as error:
            if tarfile_.offset == 0:
                raise  # tarfile names it "not a readable tar stream"
            raise CorruptArchive(
                f"invalid tar header at byte {tarfile_.offset}: {error}"
            ) from error

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        extended = (
            tarfile.GNUTYPE_LONGNAME,
            tarfile.GNUTYPE_LONGLINK,
            tarfile.XHDTYPE,
            tarfile.XGLTYPE,
            tarfile.SOLARIS_XHDTYPE,
        )
        if self.type in extended and self.size > MAX_EXTENDED_HEADER_BYTES:
            raise MemberTooLarge(
                f"a tar extended header of {self.size} bytes (more than "
                f"{MAX_EXTENDED_HEADER_BYTES}) at byte {self.offset}"
            )
        return super()._proc_member(tarfile_)  # type: ignore[misc]


def normalise_member_path(name: str) -> tuple[str | None, str | None]:
    """Return ``(relative_path, None)`` for a safe name or ``(None, reason)`` to skip it.

    Rejects absolute paths, ``..`` components, backslashes and NUL bytes, so a member path can be
    joined under an S3 prefix or a temp directory without escaping it.
    """
    if "\x00" in name:
        return None, "NUL byte in path"
    if "\\" in name:
        return None, "backslash in path"
    if name.startswith("/"):
        return None, "absolute path"
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if any(part == ".." for part in parts):
        return None, "path traversal ('..')"
    if not parts:
        return None, "empty path"
    if len(parts[0]) == 2 and parts[0][1] == ":":
        return None, "drive-letter path"
    return posixpath.join(*parts), None


class ArchiveReader:
    """Iterate the regular files of a ``.tar.zst`` stream exactly once.

    ``skipped`` collects the entries that were not yielded (links, devices, unsafe names) so the
    caller can log them; ``members_seen`` and ``bytes_decompressed`` are progress figures.
    """

    def __init__(
        self,
        fileobj: BinaryIO,
        *,
        name: str,
        limits: ArchiveLimits = DEFAULT_LIMITS,
        read_size: int = READ_SIZE,
    ) -> None:
        self.name = name
        self.limits = limits
        self.skipped: list[SkippedMember] = []
        self.members_seen = 0
        self._fileobj = fileobj
        self._read_size = read_size
        self._counter: _CountingReader | None = None
        self._started = False
        self._paths: set[str] = set()

    @property
    def bytes_decompressed(self) -> int:
        return self._counter.count if self._counter else 0

    def __iter__(self) -> Iterator[ArchiveMember]:
        if self._started:
            raise ArchiveError(f"{self.name}: an archive stream can be iterated only once")
        self._started = True
        checked = _MagicCheckingReader(self._fileobj, archive=self.name)
        decompressor = zstandard.ZstdDecompressor()
        reader = decompressor.stream_reader(
            checked, read_size=self._read_size, read_across_frames=True, closefd=False
        )
        self._counter = _CountingReader(reader, checked, archive=self.name, limits=self.limits)
        buffered = io.BufferedReader(self._counter, buffer_size=self._read_size)
        try:
            # Stream mode reads in `bufsize` blocks: tarfile's 10 KiB default caps throughput at
            # ~0.5 GB/s, 1 MiB reaches ~2.8 GB/s (benchmarks/, archive_extraction).
            tar = tarfile.open(  # noqa: SIM115
                fileobj=buffered,
                mode="r|",
                bufsize=self._read_size,
                tarinfo=_BoundedTarInfo,
                encoding=NAME_ENCODING,
                errors=NAME_ERRORS,
            )
        except (tarfile.TarError, EOFError) as error:
            raise CorruptArchive(f"{self.name}: not a readable tar stream: {error}") from error
        with tar:
            yield from self._members(tar)

    def _next_header(self, tar: tarfile.TarFile) -> tarfile.TarInfo | None:
        try:
            return tar.next()
        except ArchiveError as error:
            if str(error).startswith(self.name):
                raise
            raise type(error)(f"{self.name}: {error}") from error
        except (tarfile.TarError, EOFError) as error:
            raise CorruptArchive(f"{self.name}: corrupt tar stream: {error}") from error
        except RecursionError as error:  # a chain of thousands of long-name headers
            raise CorruptArchive(f"{self.name}: tar headers nested too deeply") from error

    def _checked_path(self, info: tarfile.TarInfo) -> str | None:
        """The member's normalised path, None to skip it (recorded), or a named error."""
        try:
            info.name.encode(NAME_ENCODING)
        except UnicodeEncodeError:
            raw = info.name.encode(NAME_ENCODING, NAME_ERRORS)
            raise UndecodableMemberName(
                f"{self.name}: member name {raw!r} is not valid UTF-8 (S3 keys are UTF-8)"
            ) from None
        path, reason = normalise_member_path(info.name)
        if path is None:
            self.skipped.append(SkippedMember(info.name, reason or "unsafe path"))
            return None
        limits = self.limits
        folders = path.count("/")
        if folders > limits.max_path_depth or len(path.encode()) > limits.max_path_bytes:
            raise MemberPathTooDeep(
                f"{self.name}: member path {path[:80]!r}… has {folders} folders and "
                f"{len(path.encode())} bytes (max_path_depth={limits.max_path_depth}, "
                f"max_path_bytes={limits.max_path_bytes})"
            )
        if path in self._paths:
            raise DuplicateMember(
                f"{self.name}: member {path!r} appears more than once; refusing to guess which "
                "copy is the dataset's"
            )
        self._paths.add(path)
        return path

    def _members(self, tar: tarfile.TarFile) -> Iterator[ArchiveMember]:
        while True:
            info = self._next_header(tar)
            if info is None:
                return
            self.members_seen += 1
            if self.members_seen > self.limits.max_members:
                raise TooManyMembers(
                    f"{self.name}: more than max_members={self.limits.max_members} entries"
                )
            if info.isdir():
                continue
            if not info.isfile() or info.issparse():
                kind = "link" if (info.issym() or info.islnk()) else "special file"
                self.skipped.append(SkippedMember(info.name, f"{kind}, not a regular file"))
                continue
            path = self._checked_path(info)
            if path is None:
                continue
            if info.size > self.limits.max_member_bytes:
                raise MemberTooLarge(
                    f"{self.name}: member {path!r} has {info.size} bytes, more than "
                    f"max_member_bytes={self.limits.max_member_bytes}"
                )
            raw = tar.extractfile(info)
            if raw is None:  # pragma: no cover - isfile() members always have data
                continue
            member = ArchiveMember(
                path=path,
                size=info.size,
                fileobj=MemberReader(raw, archive=self.name, path=path, size=info.size),
                max_read_bytes=self.limits.max_metadata_bytes,
            )
            try:
                yield member
            finally:
                member.fileobj._expire()


def spool_member(member: ArchiveMember, directory: str | Path) -> Path:
    """Copy one member to a file under ``directory`` (keeping its relative path) and return it.

    For readers that need to seek (parquet footers). Peak disk is the member's size.
    """
    target = Path(directory, *member.path.split("/"))
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as out:
        shutil.copyfileobj(member.fileobj, out, READ_SIZE)
    return target


@contextlib.contextmanager
def spooled(member: ArchiveMember, directory: str | Path | None = None) -> Iterator[Path]:
    """Spool a member to a temporary file that is deleted when the block ends."""
    with tempfile.TemporaryDirectory(prefix="member-", dir=directory) as tmp:
        yield spool_member(member, tmp)
