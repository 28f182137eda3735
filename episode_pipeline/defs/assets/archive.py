"""The upload and its extraction: `raw_archive` (observed in S3) → `extracted_files`."""

from dagster import (
    AssetExecutionContext,
    AssetObservation,
    DataVersion,
    DataVersionsByPartition,
    MetadataValue,
    ObserveResult,
    Output,
    observable_source_asset,
)
from dagster._core.definitions.data_version import DATA_VERSION_TAG

from episode_pipeline.db.episodes import mark_processing
from episode_pipeline.defs.partitions import (
    EPISODE_GROUP,
    EPISODES_PARTITION_NAME,
    episode_asset,
    episode_partitions,
)
from episode_pipeline.defs.resources.archive_limits import ArchiveLimitsResource
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.extracted_files import ExtractedFiles
from episode_pipeline.extraction import extract_archive, find_archive, latest_archive_versions
from episode_pipeline.keys import parse_partition_key


@observable_source_asset(
    partitions_def=episode_partitions,
    group_name=EPISODE_GROUP,
    description="The robot's upload: `orgs/<org>/episodes/<episode>/*.tar.zst` in the data "
    "bucket. Its data version is the object's version id or ETag, so a re-upload shows every "
    "downstream asset as stale.",
)
def raw_archive(context, s3: S3BucketResource) -> DataVersionsByPartition | ObserveResult:
    known = set(context.instance.get_dynamic_partitions(EPISODES_PARTITION_NAME))
    versions = latest_archive_versions(s3.get_client(), known)
    return DataVersionsByPartition({key: DataVersion(v) for key, v in versions.items()})


@episode_asset(
    deps=[raw_archive],
    io_manager_key="s3_io_manager",
    kinds={"s3"},
    description="Marks the episode `processing`, streams the archive S3 → zstd → tar in one pass "
    "and re-uploads every .mp4 and .parquet (plus the metadata files later steps read) under "
    "`processed/`, keeping their tar paths. Output: what went where "
    "(`ExtractedFiles`), stored as JSON beside them.",
)
def extracted_files(
    context: AssetExecutionContext,
    s3: S3BucketResource,
    postgres: PostgresResource,
    archive_limits: ArchiveLimitsResource,
) -> Output[ExtractedFiles]:
    ref = parse_partition_key(context.partition_key)
    bucket = s3.get_client()
    archive = find_archive(bucket, ref)
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
                "uri": MetadataValue.url(bucket.uri(archive.key)),
            },
        )
    )
    with postgres.transaction() as conn:
        mark_processing(conn, postgres.database_schema(), ref)
    extracted = extract_archive(
        bucket, ref, archive, log=context.log, limits=archive_limits.get_limits()
    )
    return Output(
        extracted,
        data_version=DataVersion(archive.version),
        metadata={
            "archive": bucket.uri(archive.key),
            "archive_version": archive.version,
            "files_uploaded": len(extracted.files),
            "bytes_extracted": extracted.bytes_extracted,
            "cameras": ", ".join(extracted.cameras) or "(none)",
            "videos": MetadataValue.json([f.key for f in extracted.videos]),
            "data_files": MetadataValue.json([f.key for f in extracted.data_files]),
            "skipped_files": MetadataValue.json(
                [{"path": s.path, "reason": s.reason} for s in extracted.skipped]
            ),
            "processed_prefix": MetadataValue.url(bucket.uri(ref.processed_prefix)),
        },
    )
