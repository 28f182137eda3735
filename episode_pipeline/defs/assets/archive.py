"""The upload and its extraction: `raw_archive` (observed in S3) → `extracted_files` (manifest)."""

from dagster import (
    AssetExecutionContext,
    AssetObservation,
    DataVersion,
    DataVersionsByPartition,
    MetadataValue,
    ObserveResult,
    Output,
    asset,
    observable_source_asset,
)
from dagster._core.definitions.data_version import DATA_VERSION_TAG

from episode_pipeline.db.episodes import mark_processing
from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME, episode_partitions
from episode_pipeline.defs.resources.postgres import PostgresResource
from episode_pipeline.defs.resources.storage import EpisodeStorage
from episode_pipeline.extraction import extract_archive, find_archive, latest_archive_versions
from episode_pipeline.keys import parse_partition_key
from episode_pipeline.manifest import Manifest

GROUP = "episode"


@observable_source_asset(
    partitions_def=episode_partitions,
    group_name=GROUP,
    description="The robot's upload: `orgs/<org>/episodes/<episode>/*.tar.zst` in the data "
    "bucket. Its data version is the object's version id or ETag, so a re-upload shows every "
    "downstream asset as stale.",
)
def raw_archive(context, storage: EpisodeStorage) -> DataVersionsByPartition | ObserveResult:
    known = set(context.instance.get_dynamic_partitions(EPISODES_PARTITION_NAME))
    versions = latest_archive_versions(storage, known)
    return DataVersionsByPartition({key: DataVersion(v) for key, v in versions.items()})


@asset(
    partitions_def=episode_partitions,
    deps=[raw_archive],
    group_name=GROUP,
    io_manager_key="s3_io_manager",
    kinds={"s3"},
    description="Marks the episode `processing`, streams the archive S3 → zstd → tar in one pass "
    "and re-uploads every .mp4 and .parquet (plus the metadata files later steps read) under "
    "`processed/`, keeping their tar paths. Output: the manifest, stored as JSON beside them.",
)
def extracted_files(
    context: AssetExecutionContext, storage: EpisodeStorage, postgres: PostgresResource
) -> Output[Manifest]:
    ref = parse_partition_key(context.partition_key)
    archive = find_archive(storage, ref)
    context.log_event(
        AssetObservation(
            asset_key=raw_archive.key,
            partition=context.partition_key,
            tags={DATA_VERSION_TAG: archive.version},
            metadata={
                "bucket": archive.bucket,
                "key": archive.key,
                "size_bytes": archive.size,
                "etag": archive.etag,
                "version_id": archive.version_id or "",
                "uri": MetadataValue.url(storage.uri(archive.key)),
            },
        )
    )
    with postgres.transaction() as conn:
        mark_processing(conn, ref)
    manifest = extract_archive(storage, ref, archive, log=context.log)
    return Output(
        manifest,
        data_version=DataVersion(archive.version),
        metadata={
            "archive": storage.uri(archive.key),
            "archive_version": archive.version,
            "files_uploaded": len(manifest.files),
            "bytes_extracted": manifest.bytes_extracted,
            "cameras": ", ".join(manifest.cameras) or "(none)",
            "videos": MetadataValue.json([f.key for f in manifest.videos]),
            "data_files": MetadataValue.json([f.key for f in manifest.data_files]),
            "skipped_files": MetadataValue.json(
                [{"path": s.path, "reason": s.reason} for s in manifest.skipped]
            ),
            "processed_prefix": MetadataValue.url(storage.uri(ref.processed_prefix)),
        },
    )
