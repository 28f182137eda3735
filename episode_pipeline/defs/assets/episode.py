"""`episode`: the row the application shows, marked `processed` once every output is complete.

The same transaction replaces the episode's durable record (`episode_outputs`): the code
versions that produced it and the figures a campaign's canary compares
(docs/operations.md#reprocess-the-fleet).
"""

import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from dagster import AssetCheckKey, AssetExecutionContext, MaterializeResult, MetadataValue
from dagster._core.event_api import PartitionKeyFilter

from episode_pipeline.campaign.canary import (
    FRAME_ROWS,
    RENDITIONS,
    SECONDS_BY_CAMERA,
    SYNC_FINDINGS,
)
from episode_pipeline.db.episodes import frame_rows, mark_processed
from episode_pipeline.db.outputs import has_outputs_table, record_output
from episode_pipeline.defs.asset_keys import FRAMES_KEY, HLS_RENDITIONS_KEY
from episode_pipeline.defs.code_versions import code_versions
from episode_pipeline.defs.event_log import latest_materialization_metadata
from episode_pipeline.defs.metadata import bucket_links, materialized, table_schema
from episode_pipeline.defs.partitions import SERVING, episode_asset
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.episodes.episode_rows import episode_columns
from episode_pipeline.episodes.extracted_files import DATA, ExtractedFiles
from episode_pipeline.episodes.keys import EpisodeRef, parse_partition_key
from episode_pipeline.storage.links import BucketLinks
from episode_pipeline.video.hls import PLAYLIST_NAME

EPISODES_TABLE = "public.episodes"
# The columns this asset sets (db/episodes.mark_processed, docs/contract.md#episode-columns).
EPISODE_COLUMNS = [
    ("status", "text", "'processed'"),
    ("processed_at", "timestamptz", "When the row was marked processed"),
    ("mp4_s3_path", "text", "Processed key of the first .mp4 in tar order"),
    ("parquet_s3_path", "text", "Processed key of the first data parquet in tar order"),
    ("frame_count", "integer", "`total_frames` from meta/info.json"),
    ("fps", "double precision", "`fps` from meta/info.json"),
    ("duration_seconds", "integer", "total_frames / fps, rounded half up"),
]


def playlist_links(keys: Iterable[str], ref: EpisodeRef, links: BucketLinks) -> str:
    """Markdown: a link to each camera's `hls/<camera>/playlist.m3u8` found in S3."""
    cameras = sorted(
        key[len(ref.hls_root) :].removesuffix("/" + PLAYLIST_NAME)
        for key in keys
        if key.startswith(ref.hls_root) and key.endswith("/" + PLAYLIST_NAME)
    )
    lines = [
        f"- [{camera}]({links.object(ref.hls_prefix(camera) + PLAYLIST_NAME)})"
        for camera in cameras
        if "/" not in camera
    ]
    return "\n".join(lines) or "(no playlist)"


def renditions(keys: Iterable[str], ref: EpisodeRef) -> list[str]:
    """Every playlist under the episode's HLS root (`front`, `front/720`, ...), sorted."""
    return sorted(
        key[len(ref.hls_root) :].removesuffix("/" + PLAYLIST_NAME)
        for key in keys
        if key.startswith(ref.hls_root) and key.endswith("/" + PLAYLIST_NAME)
    )


def seconds_by_camera(hls_metadata: dict[str, Any]) -> dict[str, float]:
    """Each camera's source seconds as the transcode probed them (`sources` table)."""
    seconds: dict[str, float] = defaultdict(float)
    for record in getattr(hls_metadata.get("sources"), "records", None) or []:
        if record.data.get("seconds") is not None:
            seconds[record.data["camera"]] += float(record.data["seconds"])
    return {camera: round(value, 3) for camera, value in sorted(seconds.items())}


def sync_findings_of_run(context: AssetExecutionContext) -> int | None:
    """The sync check's findings if it already ran in this run (None: not yet, or not here)."""
    from episode_pipeline.defs.checks.sync import CHECK_NAME

    key = AssetCheckKey(HLS_RENDITIONS_KEY, CHECK_NAME)
    latest = context.instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [key], partition_filter=PartitionKeyFilter(key=context.partition_key)
    ).get(key)
    if latest is None or latest.run_id != context.run_id or latest.event is None:
        return None
    evaluation = (
        latest.event.dagster_event.event_specific_data if latest.event.dagster_event else None
    )
    findings = getattr(evaluation, "metadata", {}).get("findings")
    return len(findings.value) if findings is not None else None


def run_wall_seconds(context: AssetExecutionContext) -> float | None:
    record = context.instance.get_run_record_by_id(context.run_id)
    started = record.start_time if record else None
    return round(time.time() - started, 2) if started else None


@episode_asset(
    deps=[FRAMES_KEY, HLS_RENDITIONS_KEY],
    kinds={"postgres"},
    tags=SERVING,
    # Bump when the same upload sets other column values (episode_rows.episode_columns).
    code_version="1",
    metadata={
        "dagster/table_name": EPISODES_TABLE,
        "dagster/column_schema": table_schema(EPISODE_COLUMNS),
    },
    description="The episode's row in `episodes`, the one the application shows: it says "
    "`processed` once every output is complete. One statement sets `status`, `processed_at`, "
    "`mp4_s3_path`, `parquet_s3_path`, `frame_count`, `fps` and `duration_seconds`, after "
    "extraction, HLS and frames (and their blocking checks) succeeded.",
)
def episode(
    context: AssetExecutionContext,
    extracted_files: ExtractedFiles,
    s3: S3BucketResource,
    postgres: PostgresResource,
) -> MaterializeResult:
    ref = parse_partition_key(context.partition_key)
    bucket = s3.get_client()
    links = bucket_links(s3)
    columns = episode_columns(
        mp4_keys=[f.key for f in extracted_files.videos],
        data_parquet_keys=[f.key for f in extracted_files.files if f.kind == DATA],
        info=extracted_files.dataset_info(),
    )
    keys = bucket.list_keys(ref.hls_root)
    versions = code_versions(context.job_def.asset_layer.asset_graph)
    hls_metadata = latest_materialization_metadata(
        context.instance, HLS_RENDITIONS_KEY, context.partition_key
    )
    with postgres.transaction() as conn:
        processed_at = mark_processed(conn, postgres.database_schema(), ref, columns)
        recorded = None
        if has_outputs_table(conn):
            figures = {
                FRAME_ROWS: frame_rows(conn, ref),
                SECONDS_BY_CAMERA: seconds_by_camera(hls_metadata),
                RENDITIONS: renditions(keys, ref),
                SYNC_FINDINGS: sync_findings_of_run(context),
            }
            recorded = record_output(
                conn,
                ref,
                versions,
                figures,
                run_id=context.run_id,
                wall_seconds=run_wall_seconds(context),
                archive_bytes=extracted_files.archive.size,
            )
    if recorded is None:
        context.log.warning("no episode_outputs table (migration 004): the record is not kept")
    return materialized(
        context,
        {
            "status": "processed",
            "processed_at": MetadataValue.timestamp(processed_at),
            "frame_count": columns.frame_count,
            "fps": columns.fps,
            "duration_seconds": columns.duration_seconds,
            "cameras": ", ".join(extracted_files.cameras) or "(none)",
            "playlists": MetadataValue.md(playlist_links(keys, ref, links)),
            "code_version_digest": recorded or "(not recorded)",
            "mp4_s3_path": MetadataValue.url(links.object(columns.mp4_s3_path))
            if columns.mp4_s3_path
            else "(none)",
            "parquet_s3_path": MetadataValue.url(links.object(columns.parquet_s3_path))
            if columns.parquet_s3_path
            else "(none)",
            "dagster/row_count": 1,
        },
    )
