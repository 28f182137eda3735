"""`episode`: the row the application shows, marked `processed` once every output is complete."""

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue

from episode_pipeline.db.episodes import mark_processed
from episode_pipeline.defs.assets.frames import frames
from episode_pipeline.defs.assets.hls_renditions import hls_renditions
from episode_pipeline.defs.partitions import episode_asset
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.episode_rows import episode_columns
from episode_pipeline.extracted_files import DATA, ExtractedFiles
from episode_pipeline.keys import parse_partition_key


@episode_asset(
    deps=[frames, hls_renditions],
    kinds={"postgres"},
    description="Sets `status = 'processed'`, `processed_at`, `mp4_s3_path`, `parquet_s3_path`, "
    "`frame_count`, `fps` and `duration_seconds` in one statement, after extraction, HLS and "
    "frames (and their blocking checks) succeeded: S3 outputs are complete before it says so.",
)
def episode(
    context: AssetExecutionContext,
    extracted_files: ExtractedFiles,
    s3: S3BucketResource,
    postgres: PostgresResource,
) -> MaterializeResult:
    ref = parse_partition_key(context.partition_key)
    bucket = s3.get_client()
    columns = episode_columns(
        mp4_keys=[f.key for f in extracted_files.videos],
        data_parquet_keys=[f.key for f in extracted_files.files if f.kind == DATA],
        info=extracted_files.dataset_info(),
    )
    with postgres.transaction() as conn:
        processed_at = mark_processed(conn, postgres.database_schema(), ref, columns)
    return MaterializeResult(
        metadata={
            "status": "processed",
            "processed_at": processed_at.isoformat(),
            "frame_count": columns.frame_count,
            "fps": columns.fps,
            "duration_seconds": columns.duration_seconds,
            "cameras": ", ".join(extracted_files.cameras) or "(none)",
            "mp4_s3_path": MetadataValue.url(bucket.uri(columns.mp4_s3_path))
            if columns.mp4_s3_path
            else "(none)",
            "parquet_s3_path": MetadataValue.url(bucket.uri(columns.parquet_s3_path))
            if columns.parquet_s3_path
            else "(none)",
        }
    )
