"""The upload and its extraction: `raw_archive` (observed in S3) → `extracted_files`.

Staleness is the UI's answer to "does this episode need reprocessing?", so it must be true. The
data version of `raw_archive` is the upload's ETag: the one identity the bucket listing (the
observe function), HEAD (the run) and the S3 event (the sensors) all carry, and one that changes
exactly when new bytes are uploaded. Dagster records which `raw_archive` observation an
extraction was made from when its step *starts*, so `extracted_files` makes sure this episode's
newest observation is of the bytes it reads (logging one when not) and points its provenance at
that observation. A run leaves the episode fresh whoever launched it (sensor, backfill, the UI's
Materialize, `episode-pipeline process`), and a later observation with another ETag marks exactly
this episode's `extracted_files` stale.
"""

from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    DataVersion,
    DataVersionsByPartition,
    MetadataValue,
    Output,
    map_asset_specs,
    observable_source_asset,
)

from episode_pipeline.dagster_compat import create_external_asset_from_source_asset
from episode_pipeline.db.episodes import mark_processing
from episode_pipeline.defs.asset_keys import RAW_ARCHIVE_KEY
from episode_pipeline.defs.metadata import bucket_links, on_materialization, table
from episode_pipeline.defs.partitions import (
    EPISODE_GROUP,
    EPISODE_OWNERS,
    EPISODES_PARTITION_NAME,
    RAW,
    STAGING,
    episode_asset,
    episode_partitions,
)
from episode_pipeline.defs.resources.archive_limits import ArchiveLimitsResource
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.episodes.extracted_files import ArchiveObject, ExtractedFiles
from episode_pipeline.episodes.extraction import (
    extract_archive,
    find_archive,
    latest_archive_versions,
)
from episode_pipeline.episodes.keys import EpisodeRef, parse_partition_key
from episode_pipeline.orchestration.archive_versions import archive_provenance
from episode_pipeline.orchestration.runs import count_as_the_uploads_run
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.storage.links import BucketLinks

# Bump when the same upload would give other processed files or another `ExtractedFiles`
# (episodes/extraction.py, archive/, lerobot/layout.py member kinds). Part of the data version.
EXTRACTED_FILES_CODE_VERSION = "1"

FILES_COLUMNS = [
    ("path", "string", "Path inside the tar (normalised)"),
    ("kind", "string", "video, data (frame rows) or meta"),
    ("camera", "string", "Camera of a video"),
    ("rows", "int", "Rows of a data parquet, from its footer"),
    ("size_bytes", "int", "Size uploaded under processed/"),
]
SKIPPED_COLUMNS = [
    ("path", "string", "Path inside the tar"),
    ("reason", "string", "Why it was not uploaded"),
]


def _archive_metadata(archive: ArchiveObject, links: BucketLinks) -> dict[str, Any]:
    return {
        "key": archive.key,
        "size_bytes": archive.size,
        "etag": archive.etag,
        "version_id": archive.version_id or "(unversioned bucket)",
        "link": MetadataValue.url(links.object(archive.key)),
        "dagster/uri": f"s3://{archive.bucket}/{archive.key}",
    }


@observable_source_asset(
    key=RAW_ARCHIVE_KEY,
    partitions_def=episode_partitions,
    group_name=EPISODE_GROUP,
    # A source asset takes no `kinds=`: a kind is the tag `dagster/kind/<kind>`.
    tags={**RAW, "dagster/kind/s3": ""},
    description="The robot's upload of one episode: the newest `.tar.zst` under "
    "`orgs/<org>/episodes/<episode>/` in the data bucket. Its data version is the upload's "
    "ETag, so new bytes mark the episode's `extracted_files` stale. *Observe* re-reads the "
    "bucket listing for every known episode.",
)
def observe_raw_archive(context, s3: S3BucketResource) -> DataVersionsByPartition:
    known = set(context.instance.get_dynamic_partitions(EPISODES_PARTITION_NAME))
    # The listing carries no version ids: these are the ETags, like every other observation.
    versions = latest_archive_versions(s3.get_client(), known)
    return DataVersionsByPartition({key: DataVersion(v) for key, v in versions.items()})


def _owned_by_the_team(source: Any) -> AssetsDefinition:
    """The source asset as the `AssetsDefinition` `Definitions` makes of it, with the owner every
    asset of the graph has: a `SourceAsset` takes no `owners=` (only this per-partition observe
    function needs one; a multi-asset observation cannot report partitions)."""
    (owned,) = map_asset_specs(
        lambda spec: spec.replace_attributes(owners=EPISODE_OWNERS),
        [create_external_asset_from_source_asset(source)],
    )
    return owned


raw_archive = _owned_by_the_team(observe_raw_archive)


@episode_asset(
    deps=[RAW_ARCHIVE_KEY],
    io_manager_key="s3_io_manager",
    kinds={"s3"},
    tags=STAGING,
    code_version=EXTRACTED_FILES_CODE_VERSION,
    description="The upload's files, re-uploaded under `orgs/<org>/episodes/<episode>/processed/` "
    "with their tar paths: every .mp4 and .parquet plus the metadata files later steps read. "
    "The step marks the episode `processing` and streams S3 → zstd → tar in one pass; its "
    "output (what went where, `ExtractedFiles`) is stored as JSON beside the files.",
)
def extracted_files(
    context: AssetExecutionContext,
    s3: S3BucketResource,
    postgres: PostgresResource,
    archive_limits: ArchiveLimitsResource,
) -> Output[ExtractedFiles]:
    ref = parse_partition_key(context.partition_key)
    bucket = s3.get_client()
    links = bucket_links(s3)
    archive = find_archive(bucket, ref)
    count_as_the_uploads_run(
        context.instance, context.run, context.partition_key, archive.version, context.log
    )
    provenance = archive_provenance(
        context.instance,
        context.partition_key,
        archive.etag,
        _archive_metadata(archive, links),
        context.log_event,
    )
    with postgres.transaction() as conn:
        mark_processing(conn, postgres.database_schema(), ref)
    extracted = extract_archive(
        bucket, ref, archive, log=context.log, limits=archive_limits.get_limits()
    )
    on_materialization(context, _extraction_metadata(ref, bucket, links, archive, extracted))
    return Output(
        extracted,
        # The same upload extracted by the same code gives the same files: downstream assets
        # stay fresh when an episode is re-extracted without change.
        data_version=DataVersion(f"{archive.etag}@{EXTRACTED_FILES_CODE_VERSION}"),
        tags=provenance,
    )


def _extraction_metadata(
    ref: EpisodeRef,
    bucket: Bucket,
    links: BucketLinks,
    archive: ArchiveObject,
    extracted: ExtractedFiles,
) -> dict[str, Any]:
    """What the materialization shows: the archive, where its files went, what was skipped."""
    return {
        "archive": MetadataValue.url(links.object(archive.key)),
        "archive_etag": archive.etag,
        "processed_prefix": MetadataValue.url(links.folder(ref.processed_prefix)),
        "dagster/uri": bucket.uri(ref.processed_prefix),
        "files_uploaded": len(extracted.files),
        "bytes_extracted": extracted.bytes_extracted,
        "cameras": ", ".join(extracted.cameras) or "(none)",
        "files": table(
            FILES_COLUMNS,
            (
                {
                    "path": f.path,
                    "kind": f.kind,
                    "camera": f.camera,
                    "rows": f.rows,
                    "size_bytes": f.size,
                }
                for f in extracted.files
            ),
        ),
        "skipped_files": table(
            SKIPPED_COLUMNS,
            ({"path": s.path, "reason": s.reason} for s in extracted.skipped),
        ),
    }
