"""One pass over an uploaded archive: S3 → zstd → tar → `processed/` in S3, and the manifest.

Videos stream straight from the tar into a multipart upload; parquets are spooled to a temporary
file first (their row count lives in the footer), so peak temporary disk is the largest parquet.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from episode_pipeline.archive.stream import ArchiveReader, spooled
from episode_pipeline.defs.resources.storage import EpisodeStorage, ObjectInfo
from episode_pipeline.keys import EpisodeRef, InvalidEpisodeKey, is_raw_archive_key, parse_s3_key
from episode_pipeline.lerobot import layout
from episode_pipeline.lerobot.frames import parquet_row_count
from episode_pipeline.lerobot.info import parse_info
from episode_pipeline.manifest import (
    DATA,
    META,
    VIDEO,
    ArchiveObject,
    Manifest,
    ProcessedFile,
    SkippedFile,
)


class ArchiveNotFound(LookupError):
    """No `.zst` upload under the episode's prefix."""


def _newest(objects: Iterable[ObjectInfo]) -> ObjectInfo | None:
    return max(objects, key=lambda o: (o.last_modified is not None, o.last_modified, o.key), default=None)


def find_archive(storage: EpisodeStorage, ref: EpisodeRef) -> ArchiveObject:
    """The episode's newest upload (a robot may upload again after a bad take)."""
    newest = _newest(o for o in storage.iter_objects(ref.prefix) if is_raw_archive_key(o.key))
    if newest is None:
        raise ArchiveNotFound(f"no .zst archive under {storage.uri(ref.prefix)} for episode {ref}")
    head = storage.head(newest.key) or newest  # HEAD carries the version id on versioned buckets
    return ArchiveObject(
        bucket=storage.bucket,
        key=newest.key,
        size=head.size,
        etag=head.etag,
        version_id=head.version_id,
    )


def latest_archive_versions(storage: EpisodeStorage, partition_keys: set[str]) -> dict[str, str]:
    """Partition key → version of its newest upload, for the episodes Dagster knows about."""
    newest: dict[str, ObjectInfo] = {}
    for obj in storage.iter_objects("orgs/"):
        if not is_raw_archive_key(obj.key):
            continue
        try:
            partition_key = parse_s3_key(obj.key).partition_key
        except InvalidEpisodeKey:
            continue
        if partition_key in partition_keys:
            best = _newest([obj, newest[partition_key]]) if partition_key in newest else obj
            newest[partition_key] = best  # type: ignore[assignment]
    return {key: obj.version_id or obj.etag for key, obj in newest.items()}


def extract_archive(
    storage: EpisodeStorage,
    ref: EpisodeRef,
    archive: ArchiveObject,
    *,
    log: logging.Logger | None = None,
) -> Manifest:
    """Upload the archive's videos, parquets and kept metadata under `processed/`."""
    log = log or logging.getLogger(__name__)
    manifest = Manifest(archive=archive)
    info_bytes: bytes | None = None
    body = storage.open_stream(archive.key)
    try:
        reader = ArchiveReader(body, name=storage.uri(archive.key))
        for member in reader:
            kind = layout.member_kind(member.path)
            if kind is None:
                manifest.skipped.append(SkippedFile(member.path, "not a video, parquet or kept metadata file"))
                continue
            key = ref.processed_key(member.path)
            rows = None
            if member.path.endswith(".parquet"):
                with spooled(member) as path:
                    rows = parquet_row_count(path) if kind == DATA else None
                    result = storage.upload_file(path, key)
            elif kind == META:
                data = member.read()
                if layout.is_info_json(member.path):
                    info_bytes, manifest.info_key = data, key
                result = storage.put_bytes(key, data)
            else:
                result = storage.upload_stream(key, member.fileobj, size=member.size)
            if layout.is_task_table(member.path):
                manifest.tasks_key = key
            manifest.files.append(
                ProcessedFile(member.path, key, result.size, result.sha256, kind, rows=rows)
            )
            log.info(f"uploaded {member.path} → {key} ({result.size} bytes)")
        manifest.skipped += [SkippedFile(s.path, s.reason) for s in reader.skipped]
    finally:
        body.close()

    if info_bytes is None:
        raise layout.LayoutError(f"{storage.uri(archive.key)}: no meta/info.json in the archive")
    info = parse_info(info_bytes, source=f"{archive.key}:meta/info.json")
    manifest.info = info.raw
    manifest.files = [
        _with_camera(f, layout.camera_for(f.path, info)) if f.kind == VIDEO else f
        for f in manifest.files
    ]
    return manifest


def _with_camera(file: ProcessedFile, camera: str) -> ProcessedFile:
    return ProcessedFile(file.path, file.key, file.size, file.sha256, file.kind, camera, file.rows)
