"""`episode`: the row the application shows, marked `processed` once every output is complete."""

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from episode_pipeline.db.episodes import mark_processed
from episode_pipeline.defs.assets.frames import frames
from episode_pipeline.defs.assets.hls import hls_renditions
from episode_pipeline.defs.partitions import episode_partitions
from episode_pipeline.defs.resources.postgres import PostgresResource
from episode_pipeline.defs.resources.storage import EpisodeStorage
from episode_pipeline.keys import parse_partition_key
from episode_pipeline.manifest import DATA, Manifest
from episode_pipeline.metadata import episode_columns


@asset(
    partitions_def=episode_partitions,
    group_name="episode",
    deps=[frames, hls_renditions],
    kinds={"postgres"},
    description="Sets `status = 'processed'`, `processed_at`, `mp4_s3_path`, `parquet_s3_path`, "
    "`frame_count`, `fps` and `duration_seconds` in one statement, after extraction, HLS and "
    "frames (and their blocking checks) succeeded: S3 outputs are complete before it says so.",
)
def episode(
    context: AssetExecutionContext,
    extracted_files: Manifest,
    storage: EpisodeStorage,
    postgres: PostgresResource,
) -> MaterializeResult:
    ref = parse_partition_key(context.partition_key)
    manifest = extracted_files
    info = manifest.dataset_info()
    columns = episode_columns(
        mp4_keys=[f.key for f in manifest.videos],
        data_parquet_keys=[f.key for f in manifest.files if f.kind == DATA],
        info=info,
    )
    with postgres.transaction() as conn:
        processed_at = mark_processed(conn, ref, columns)
    return MaterializeResult(
        metadata={
            "status": "processed",
            "processed_at": processed_at.isoformat(),
            "frame_count": columns.frame_count,
            "fps": columns.fps,
            "duration_seconds": columns.duration_seconds,
            "cameras": ", ".join(manifest.cameras) or "(none)",
            "mp4_s3_path": MetadataValue.url(storage.uri(columns.mp4_s3_path))
            if columns.mp4_s3_path
            else "(none)",
            "parquet_s3_path": MetadataValue.url(storage.uri(columns.parquet_s3_path))
            if columns.parquet_s3_path
            else "(none)",
        }
    )
