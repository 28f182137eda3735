"""`episode`: the row the application shows, marked `processed` once every output is complete.

The same transaction replaces the episode's durable record (`episode_outputs`,
`episodes/processed.py`): the code versions that produced it and the figures a campaign's canary
compares (docs/operations.md#reprocess-the-fleet).
"""

from collections.abc import Iterable
from typing import Any

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue

from episode_pipeline.defs.asset_keys import FRAMES_KEY, HLS_RENDITIONS_KEY
from episode_pipeline.defs.checks.sync import gather_sync_inputs
from episode_pipeline.defs.code_versions import code_versions
from episode_pipeline.defs.metadata import bucket_links, materialized, table_schema
from episode_pipeline.defs.partitions import SERVING, episode_asset
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.episodes.episode_rows import EpisodeColumns
from episode_pipeline.episodes.extracted_files import ExtractedFiles
from episode_pipeline.episodes.keys import EpisodeRef, parse_partition_key
from episode_pipeline.episodes.processed import (
    ProcessedEpisode,
    RunFacts,
    processed_columns,
    record_processed,
    renditions,
)
from episode_pipeline.episodes.timeline_writer import WrittenTimeline, write_timeline
from episode_pipeline.orchestration.event_log import (
    latest_materialization_metadata,
    table_rows,
)
from episode_pipeline.orchestration.runs import run_start_time
from episode_pipeline.storage.links import BucketLinks
from episode_pipeline.video.hls import PLAYLIST_NAME
from episode_pipeline.viewer.routes import how_to_view, view_command

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
    lines = [
        f"- [{camera}]({links.object(ref.hls_prefix(camera) + PLAYLIST_NAME)})"
        for camera in renditions(keys, ref)
        if "/" not in camera
    ]
    return "\n".join(lines) or "(no playlist)"


@episode_asset(
    deps=[FRAMES_KEY, HLS_RENDITIONS_KEY],
    kinds={"postgres"},
    tags=SERVING,
    # Bump when the same upload sets other column values (episode_rows.episode_columns) or
    # writes another timeline (episodes/timeline.py).
    code_version="2",
    metadata={
        "dagster/table_name": EPISODES_TABLE,
        "dagster/column_schema": table_schema(EPISODE_COLUMNS),
    },
    description="The episode's row in `episodes`, the one the application shows: it says "
    "`processed` once every output is complete. One statement sets `status`, `processed_at`, "
    "`mp4_s3_path`, `parquet_s3_path`, `frame_count`, `fps` and `duration_seconds`, after "
    "extraction, HLS and frames (and their blocking checks) succeeded, and after writing "
    "`processed/timeline.json` (every camera on one clock with the state, action and sync "
    "findings, for a viewer).",
)
def episode(
    context: AssetExecutionContext,
    extracted_files: ExtractedFiles,
    s3: S3BucketResource,
    postgres: PostgresResource,
) -> MaterializeResult:
    ref = parse_partition_key(context.partition_key)
    bucket = s3.get_client()
    columns = processed_columns(extracted_files)
    # One listing of the HLS tree serves the playlist links, the renditions and the bytes written.
    hls_objects = list(bucket.iter_objects(ref.hls_root))
    run = run_facts(context)
    hls = latest_materialization_metadata(
        context.instance, HLS_RENDITIONS_KEY, context.partition_key
    )
    hls_sources = table_rows(hls, "sources")
    # The last output, complete before the row says processed (docs/contract.md#timeline).
    timeline = write_timeline(
        ref,
        extracted_files,
        bucket,
        table_rows(hls, "per_camera"),
        hls_sources,
        gather_sync_inputs(context.instance, context.partition_key, extracted_files, bucket),
    )
    for skipped in timeline.skipped_files:
        context.log.warning(f"timeline: skipped {skipped}")
    with postgres.transaction() as conn:
        processed = record_processed(
            conn,
            postgres.database_schema(),
            ref,
            columns,
            extracted_files,
            hls_objects,
            hls_sources,
            run,
            timeline.sync_findings,
        )
    if processed.recorded is None:
        context.log.warning("no episode_outputs table (migration 004): the record is not kept")
    processed.outcome.emit(ref, context.run.run_id)
    return materialized(
        context,
        materialization_metadata(
            ref, columns, processed, timeline, [o.key for o in hls_objects], extracted_files, s3
        ),
    )


def run_facts(context: AssetExecutionContext) -> RunFacts:
    """What Dagster's instance knows of this run, for the episode's record."""
    run_id = context.run.run_id
    return RunFacts(
        run_id=run_id,
        started=run_start_time(context.instance, run_id),
        code_versions=code_versions(context.job_def.asset_layer.asset_graph),
    )


def materialization_metadata(
    ref: EpisodeRef,
    columns: EpisodeColumns,
    processed: ProcessedEpisode,
    timeline: WrittenTimeline,
    hls_keys: list[str],
    extracted: ExtractedFiles,
    s3: S3BucketResource,
) -> dict[str, Any]:
    """What the materialization shows: the row's columns, links to the outputs, the run."""
    links = bucket_links(s3)
    return {
        "status": "processed",
        "processed_at": MetadataValue.timestamp(processed.processed_at),
        "frame_count": columns.frame_count,
        "fps": columns.fps,
        "duration_seconds": columns.duration_seconds,
        "cameras": ", ".join(extracted.cameras) or "(none)",
        "playlists": MetadataValue.md(playlist_links(hls_keys, ref, links)),
        "timeline": MetadataValue.url(links.object(timeline.key)),
        "timeline_bytes": timeline.size,
        "timeline_episodes": timeline.episodes,
        "timeline_downsampled_episodes": timeline.downsampled,
        "viewer": MetadataValue.url(how_to_view(ref, s3.viewer_url))
        if s3.viewer_url
        else view_command(ref),
        "code_version_digest": processed.recorded or "(not recorded)",
        **processed.outcome.as_metadata(),
        "mp4_s3_path": MetadataValue.url(links.object(columns.mp4_s3_path))
        if columns.mp4_s3_path
        else "(none)",
        "parquet_s3_path": MetadataValue.url(links.object(columns.parquet_s3_path))
        if columns.parquet_s3_path
        else "(none)",
        "dagster/row_count": 1,
    }
