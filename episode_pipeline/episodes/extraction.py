"""One pass over an uploaded archive: S3 → zstd → tar → `processed/` in S3, and the extracted.

Videos stream straight from the tar into a multipart upload; parquets are spooled to a temporary
file first (their row count lives in the footer), so peak temporary disk is the largest parquet.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from episode_pipeline.archive.stream import DEFAULT_LIMITS, ArchiveReader, spooled
from episode_pipeline.config.settings import ArchiveLimits
from episode_pipeline.episodes.extracted_files import (
    DATA,
    META,
    VIDEO,
    ArchiveObject,
    ExtractedFiles,
    ProcessedFile,
    SkippedFile,
)
from episode_pipeline.episodes.keys import (
    EpisodeRef,
    InvalidEpisodeKey,
    is_raw_archive_key,
    parse_s3_key,
)
from episode_pipeline.lerobot.cameras import camera_for
from episode_pipeline.lerobot.frames import FrameDataError, parquet_row_count
from episode_pipeline.lerobot.info import parse_info
from episode_pipeline.lerobot.layout import (
    INFO_JSON,
    TASKS_JSONL,
    TASKS_PARQUET,
    MemberKind,
    find_dataset_roots,
    is_dataset_file,
    member_kind,
)
from episode_pipeline.runtime.injection_points import MID_EXTRACTION, reach
from episode_pipeline.storage.bucket import Bucket, ObjectInfo


class ArchiveNotFound(LookupError):
    """No `.zst` upload under the episode's prefix."""


class NotALeRobotDataset(ValueError):
    """The archive has no `meta/info.json`: nothing says what its files are."""


# What `ExtractedFiles` calls each kind of member the pipeline keeps (None: skipped).
_MANIFEST_KIND = {
    MemberKind.VIDEO: VIDEO,
    MemberKind.DATA_PARQUET: DATA,
    MemberKind.OTHER_PARQUET: META,
    MemberKind.METADATA: META,
}


def _newest(objects: Iterable[ObjectInfo]) -> ObjectInfo | None:
    return max(
        objects, key=lambda o: (o.last_modified is not None, o.last_modified, o.key), default=None
    )


def find_archive(bucket: Bucket, ref: EpisodeRef) -> ArchiveObject:
    """The episode's newest upload (a robot may upload again after a bad take)."""
    newest = _newest(o for o in bucket.iter_objects(ref.prefix) if is_raw_archive_key(o.key))
    if newest is None:
        raise ArchiveNotFound(f"no .zst archive under {bucket.uri(ref.prefix)} for episode {ref}")
    head = bucket.head(newest.key) or newest  # HEAD carries the version id on versioned buckets
    return ArchiveObject(
        bucket=bucket.name,
        key=newest.key,
        size=head.size,
        etag=head.etag,
        version_id=head.version_id,
        last_modified=head.last_modified.isoformat() if head.last_modified else None,
    )


def latest_archive_versions(bucket: Bucket, partition_keys: set[str]) -> dict[str, str]:
    """Partition key → version of its newest upload, for the episodes Dagster knows about."""
    newest: dict[str, ObjectInfo] = {}
    for obj in bucket.iter_objects("orgs/"):
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
    bucket: Bucket,
    ref: EpisodeRef,
    archive: ArchiveObject,
    *,
    log: logging.Logger | None = None,
    limits: ArchiveLimits = DEFAULT_LIMITS,
) -> ExtractedFiles:
    """Upload the archive's videos, parquets and kept metadata under `processed/`.

    An archive over `limits` (or with duplicate, undecodable or too deep member paths) stops with
    a named `ArchiveError`; what was uploaded before that stays under `processed/` only.
    """
    log = log or logging.getLogger(__name__)
    extracted = ExtractedFiles(archive=archive)
    info_json: dict[str, bytes] = {}  # path → bytes; the members may come in any order
    body = bucket.open_stream(archive.key)
    try:
        reader = ArchiveReader(body, name=bucket.uri(archive.key), limits=limits)
        for member in reader:
            kind = _MANIFEST_KIND.get(member_kind(member.path))
            if kind is None:
                extracted.skipped.append(
                    SkippedFile(member.path, "not a video, parquet or kept metadata file")
                )
                continue
            key = ref.processed_key(member.path)
            rows = None
            if member.path.endswith(".parquet"):
                with spooled(member) as path:
                    if kind == DATA:
                        rows = _row_count_or_none(path, member.path, log)
                    result = bucket.upload_file(path, key)
            elif kind == META:
                data = member.read()
                if is_dataset_file(member.path, INFO_JSON):
                    info_json[member.path] = data
                result = bucket.put_bytes(key, data)
            else:
                result = bucket.upload_stream(key, member.fileobj, size=member.size)
            if extracted.tasks_key is None and (
                is_dataset_file(member.path, TASKS_PARQUET)
                or is_dataset_file(member.path, TASKS_JSONL)
            ):
                extracted.tasks_key = key
            extracted.files.append(
                ProcessedFile(member.path, key, result.size, result.sha256, kind, rows=rows)
            )
            reach(MID_EXTRACTION, about=ref.partition_key)
        extracted.skipped += [SkippedFile(s.path, s.reason) for s in reader.skipped]
    finally:
        body.close()

    roots = find_dataset_roots(info_json)
    if not roots:
        raise NotALeRobotDataset(
            f"{bucket.uri(archive.key)}: no meta/info.json in the archive "
            "(not a LeRobot dataset folder)"
        )
    root = roots[0]
    info_path = f"{root}/{INFO_JSON}" if root else INFO_JSON
    info = parse_info(info_json[info_path], source=f"{archive.key}:{info_path}")
    extracted.info = dict(info.raw)
    extracted.info_key = ref.processed_key(info_path)
    extracted.files = [
        _with_camera(f, camera_for(f.path, info, root=root)) if f.kind == VIDEO else f
        for f in extracted.files
    ]
    return extracted


def _row_count_or_none(path, member_path: str, log: logging.Logger) -> int | None:
    """The footer's row count; an unreadable file is still uploaded and reported by `frames`."""
    try:
        return parquet_row_count(path, path=member_path)
    except FrameDataError as error:
        log.warning(f"{error}")
        return None


def _with_camera(file: ProcessedFile, camera: str) -> ProcessedFile:
    return ProcessedFile(file.path, file.key, file.size, file.sha256, file.kind, camera, file.rows)
