"""The data bucket: the few S3 operations the pipeline needs, done one way, as a plain class.

Dagster's `S3BucketResource` (defs/resources/s3.py) hands one out; the transcode program, the
CLI and the local stack build their own from `AwsSettings`. One boto3 client per `Bucket`, made on
first use under a lock (clients are thread-safe; creating them is not), with a connection pool
large enough for `upload_files`' threads. Every call is bounded (`S3Deadlines`): connect and read
timeouts, and standard-mode retries (exponential backoff with jitter) up to a fixed attempt count.
"""

from __future__ import annotations

import hashlib
import math
import mimetypes
import os
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError
from botocore.response import StreamingBody

from episode_pipeline.config.settings import AwsSettings, S3Deadlines
from episode_pipeline.storage.aws import LazyClient

MiB = 1024 * 1024
MAX_POOL_CONNECTIONS = 32
DEFAULT_UPLOAD_WORKERS = 8
# S3 allows 10,000 parts; stay below it with room to spare when the size is known.
MAX_PARTS = 9_000
READ_CHUNK = MiB

# The only place a content type is chosen. HLS types per RFC 8216; parquet per its IANA entry.
_CONTENT_TYPES = {
    ".m3u8": "application/vnd.apple.mpegurl",
    ".ts": "video/mp2t",
    ".m4s": "video/iso.segment",
    ".mp4": "video/mp4",
    ".parquet": "application/vnd.apache.parquet",
    ".json": "application/json",
    ".jsonl": "application/x-ndjson",
    ".zst": "application/zstd",
}
DEFAULT_CONTENT_TYPE = "application/octet-stream"


def content_type_for(key: str) -> str:
    """The Content-Type for an object key, by its extension (players need the HLS ones right)."""
    suffix = Path(key).suffix.lower()
    if suffix in _CONTENT_TYPES:
        return _CONTENT_TYPES[suffix]
    guessed, _ = mimetypes.guess_type(key)
    return guessed or DEFAULT_CONTENT_TYPE


class MissingStoredOutput(LookupError):
    """An asset's input is not in the bucket: the upstream asset never materialized there (raised
    by the S3 IO manager; a campaign then runs that episode's whole graph)."""


def is_not_found(error: ClientError) -> bool:
    code = str(error.response.get("Error", {}).get("Code", ""))
    return code in {"404", "NoSuchKey", "NotFound"}


@dataclass(frozen=True)
class ObjectInfo:
    """What HEAD says about an object. `etag` is without its quotes."""

    key: str
    size: int
    etag: str
    version_id: str | None
    last_modified: datetime | None

    @classmethod
    def listed(cls, item: Mapping[str, Any]) -> ObjectInfo:
        """An entry of a `list_objects_v2` page's `Contents` (a listing names no version)."""
        return cls(
            key=item["Key"],
            size=int(item["Size"]),
            etag=str(item.get("ETag", "")).strip('"'),
            version_id=None,
            last_modified=item.get("LastModified"),
        )


@dataclass(frozen=True)
class UploadResult:
    """One uploaded object: its key, the bytes sent and their SHA-256 (for manifests)."""

    key: str
    size: int
    sha256: str


class _HashingReader:
    """Counts and hashes what is read, and says it cannot seek.

    boto3 trusts `seekable()`; tar members from a stream claim to seek and then fail, so every
    stream goes through here and s3transfer takes its non-seekable (buffered parts) path.
    """

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self.size = 0
        self._sha = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.size += len(data)
        self._sha.update(data)
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    @property
    def hexdigest(self) -> str:
        return self._sha.hexdigest()


def _sha256_file(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(READ_CHUNK), b""):
            sha.update(chunk)
    return sha.hexdigest()


def transfer_config(size: int | None = None) -> TransferConfig:
    """Multipart settings: 8 MiB parts (bigger when `size` needs it to stay under 10k parts).

    Memory for a non-seekable stream is about part size x concurrency, so concurrency stays at 4.
    """
    part = 8 * MiB
    if size is not None:
        part = max(part, math.ceil(size / MAX_PARTS / MiB) * MiB)
    return TransferConfig(
        multipart_threshold=part, multipart_chunksize=part, max_concurrency=4, use_threads=True
    )


class Bucket:
    """One S3 bucket: uploads, downloads, listings and deletes under episode prefixes."""

    def __init__(self, name: str, aws: AwsSettings, deadlines: S3Deadlines | None = None) -> None:
        self.name = name
        self.aws = aws
        self.deadlines = deadlines or S3Deadlines()
        self._client = LazyClient(
            "s3",
            aws,
            retries={"mode": "standard", "total_max_attempts": self.deadlines.max_attempts},
            connect_timeout=self.deadlines.connect_timeout_seconds,
            read_timeout=self.deadlines.read_timeout_seconds,
            max_pool_connections=MAX_POOL_CONNECTIONS,
            # moto and S3 both accept path-style; virtual hosts do not resolve against localhost.
            s3={"addressing_style": "path"} if aws.endpoint_url else None,
        )

    @property
    def client(self) -> Any:
        return self._client.get()

    def uri(self, key: str) -> str:
        return f"s3://{self.name}/{key}"

    # -- reads ----------------------------------------------------------------------------------

    def head(self, key: str) -> ObjectInfo | None:
        """The object's size, ETag and version, or None when it does not exist."""
        try:
            response = self.client.head_object(Bucket=self.name, Key=key)
        except ClientError as error:
            if is_not_found(error):
                return None
            raise
        return ObjectInfo(
            key=key,
            size=int(response["ContentLength"]),
            etag=str(response.get("ETag", "")).strip('"'),
            version_id=response.get("VersionId"),
            last_modified=response.get("LastModified"),
        )

    def get_bytes(self, key: str) -> bytes:
        """The whole object in memory: for small objects (manifests, info.json)."""
        return self.client.get_object(Bucket=self.name, Key=key)["Body"].read()

    def open_stream(self, key: str) -> StreamingBody:
        """A one-pass reader over the object (close it when done); nothing touches the disk."""
        return self.client.get_object(Bucket=self.name, Key=key)["Body"]

    def download_file(self, key: str, path: str | os.PathLike[str]) -> Path:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        self.client.download_file(self.name, key, str(target), Config=transfer_config())
        return target

    def list_keys(self, prefix: str, suffix: str | None = None) -> list[str]:
        """Every key under `prefix` (all pages), in S3's lexicographic order."""
        return [
            info.key
            for info in self.iter_objects(prefix)
            if not suffix or info.key.endswith(suffix)
        ]

    def iter_objects(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object under `prefix` with its size and ETag, page after page."""
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.name, Prefix=prefix):
            for item in page.get("Contents", []):
                yield ObjectInfo.listed(item)

    # -- writes ---------------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes, content_type: str | None = None) -> UploadResult:
        """One PUT: the object appears whole or not at all (what the IO manager relies on)."""
        self.client.put_object(
            Bucket=self.name,
            Key=key,
            Body=data,
            ContentType=content_type or content_type_for(key),
        )
        return UploadResult(key=key, size=len(data), sha256=hashlib.sha256(data).hexdigest())

    def upload_stream(
        self,
        key: str,
        fileobj: IO[bytes],
        size: int | None = None,
        content_type: str | None = None,
    ) -> UploadResult:
        """Upload from a reader read once, front to back (a tar member out of a zstd stream).

        `size`, when known, sizes the multipart parts and is checked against the bytes read, so a
        truncated stream fails here instead of leaving a short object unnoticed.
        """
        reader = _HashingReader(fileobj)
        self.client.upload_fileobj(
            reader,
            self.name,
            key,
            ExtraArgs={"ContentType": content_type or content_type_for(key)},
            Config=transfer_config(size),
        )
        if size is not None and reader.size != size:
            raise OSError(
                f"upload of s3://{self.name}/{key}: read {reader.size} bytes, expected {size}"
            )
        return UploadResult(key=key, size=reader.size, sha256=reader.hexdigest)

    def upload_file(
        self, path: str | os.PathLike[str], key: str, content_type: str | None = None
    ) -> UploadResult:
        source = Path(path)
        digest = _sha256_file(source)
        size = source.stat().st_size
        self.client.upload_file(
            str(source),
            self.name,
            key,
            ExtraArgs={"ContentType": content_type or content_type_for(key)},
            Config=transfer_config(size),
        )
        return UploadResult(key=key, size=size, sha256=digest)

    def upload_files(
        self,
        pairs: Iterable[tuple[str | os.PathLike[str], str]],
        max_workers: int = DEFAULT_UPLOAD_WORKERS,
    ) -> list[UploadResult]:
        """Upload (path, key) pairs on a thread pool (moto: 73 objects/s alone, 122/s with 8).

        Results come back in the order of `pairs`; the first failure is raised after the others
        finish, so no upload is left running behind the caller.
        """
        items = list(pairs)
        if not items:
            return []
        self.client  # noqa: B018 - create the shared client before the threads race for it
        with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(items)))) as pool:
            futures = [pool.submit(self.upload_file, path, key) for path, key in items]
        return [future.result() for future in futures]

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix` (1,000 per request); returns how many went."""
        if not prefix or not prefix.strip("/"):
            raise ValueError(f"refusing to delete under an empty prefix {prefix!r} in {self.name}")
        return self.delete_keys(self.list_keys(prefix), what=prefix)

    def delete_keys(self, keys: Iterable[str], what: str = "") -> int:
        """Delete these objects (1,000 per request); returns how many. `what` names them in an
        error (a prefix)."""
        keys = list(keys)
        for start in range(0, len(keys), 1000):
            batch = keys[start : start + 1000]
            response = self.client.delete_objects(
                Bucket=self.name,
                Delete={"Objects": [{"Key": key} for key in batch], "Quiet": True},
            )
            errors = response.get("Errors") or []
            if errors:
                first = errors[0]
                raise OSError(
                    f"deleting under s3://{self.name}/{what}: {len(errors)} failed, first "
                    f"{first.get('Key')}: {first.get('Code')} {first.get('Message')}"
                )
        return len(keys)
