"""`episode`: the row the application shows, marked `processed` once every output is complete.

The same transaction replaces the episode's durable record (`episode_outputs`): the code
versions that produced it and the figures a campaign's canary compares
(docs/operations.md#reprocess-the-fleet).
"""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dagster import AssetCheckKey, AssetExecutionContext, MaterializeResult, MetadataValue

from episode_pipeline.campaign.canary import (
    FRAME_ROWS,
    RENDITIONS,
    SECONDS_BY_CAMERA,
    SYNC_FINDINGS,
)
from episode_pipeline.dagster_compat import PartitionKeyFilter
from episode_pipeline.db.episodes import frame_rows, mark_processed
from episode_pipeline.db.outputs import has_outputs_table, record_output
from episode_pipeline.defs.asset_keys import FRAMES_KEY, HLS_RENDITIONS_KEY
from episode_pipeline.defs.assets.timeline import write_timeline
from episode_pipeline.defs.checks.sync import CHECK_NAME
from episode_pipeline.defs.code_versions import code_versions
from episode_pipeline.defs.metadata import bucket_links, materialized, table_schema
from episode_pipeline.defs.partitions import SERVING, episode_asset
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.episodes.episode_rows import episode_columns
from episode_pipeline.episodes.extracted_files import DATA, ExtractedFiles
from episode_pipeline.episodes.keys import EpisodeRef, parse_partition_key
from episode_pipeline.orchestration.event_log import latest_materialization_metadata
from episode_pipeline.runtime import metrics
from episode_pipeline.storage.bucket import ObjectInfo
from episode_pipeline.storage.links import BucketLinks
from episode_pipeline.video.hls import PLAYLIST_NAME
from episode_pipeline.viewer.routes import how_to_view, view_command

EPISODES_TABLE = "public.episodes"
# The materialization's latency, read back by `episode-pipeline health` (p50/p95).
UPLOAD_TO_PROCESSED_METADATA = "upload_to_processed_seconds"
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


@dataclass(frozen=True)
class ProcessedOutcome:
    """What the `EpisodesProcessed` line and the materialization say about the episode's run."""

    latency_seconds: float | None  # upload (archive LastModified) → processed
    run_wall_seconds: float | None
    bytes_in: int
    bytes_out: int

    def as_metadata(self) -> dict[str, Any]:
        shown = {
            UPLOAD_TO_PROCESSED_METADATA: self.latency_seconds,
            "run_wall_seconds": self.run_wall_seconds,
        }
        return {
            **{key: round(value, 3) for key, value in shown.items() if value is not None},
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
        }


def processed_outcome(
    context: AssetExecutionContext,
    extracted: ExtractedFiles,
    processed_at: datetime,
    hls_objects: Iterable[ObjectInfo],
) -> ProcessedOutcome:
    uploaded = extracted.archive.last_modified
    latency = None
    if uploaded:
        latency = max(0.0, (processed_at - datetime.fromisoformat(uploaded)).total_seconds())
    record = context.instance.get_run_record_by_id(context.run.run_id)
    started = record.start_time if record else None
    return ProcessedOutcome(
        latency_seconds=latency,
        run_wall_seconds=max(0.0, processed_at.timestamp() - started) if started else None,
        bytes_in=extracted.archive.size,
        bytes_out=extracted.bytes_extracted + sum(o.size for o in hls_objects),
    )


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
    key = AssetCheckKey(HLS_RENDITIONS_KEY, CHECK_NAME)
    latest = context.instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [key], partition_filter=PartitionKeyFilter(key=context.partition_key)
    ).get(key)
    if latest is None or latest.run_id != context.run.run_id or latest.event is None:
        return None
    evaluation = (
        latest.event.dagster_event.event_specific_data if latest.event.dagster_event else None
    )
    findings = getattr(evaluation, "metadata", {}).get("findings")
    return len(findings.value) if findings is not None else None


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
    links = bucket_links(s3)
    columns = episode_columns(
        mp4_keys=[f.key for f in extracted_files.videos],
        data_parquet_keys=[f.key for f in extracted_files.files if f.kind == DATA],
        info=extracted_files.dataset_info(),
    )
    # One listing of the HLS tree serves the playlist links, the renditions and the bytes written.
    hls_objects = list(bucket.iter_objects(ref.hls_root))
    keys = [o.key for o in hls_objects]
    versions = code_versions(context.job_def.asset_layer.asset_graph)
    hls_metadata = latest_materialization_metadata(
        context.instance, HLS_RENDITIONS_KEY, context.partition_key
    )
    # The last output, complete before the row says processed (docs/contract.md#timeline).
    timeline = write_timeline(context.instance, context.partition_key, ref, extracted_files, bucket)
    for skipped in timeline.skipped_files:
        context.log.warning(f"timeline: skipped {skipped}")
    with postgres.transaction() as conn:
        processed_at = mark_processed(conn, postgres.database_schema(), ref, columns)
        outcome = processed_outcome(context, extracted_files, processed_at, hls_objects)
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
                run_id=context.run.run_id,
                wall_seconds=outcome.run_wall_seconds,
                archive_bytes=extracted_files.archive.size,
            )
    if recorded is None:
        context.log.warning("no episode_outputs table (migration 004): the record is not kept")
    metrics.Emitter.from_env().episode_processed(
        ref.partition_key,
        context.run.run_id,
        latency_seconds=outcome.latency_seconds,
        run_wall_seconds=outcome.run_wall_seconds,
        bytes_in=outcome.bytes_in,
        bytes_out=outcome.bytes_out,
    )
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
            "timeline": MetadataValue.url(links.object(timeline.key)),
            "timeline_bytes": timeline.size,
            "timeline_episodes": timeline.episodes,
            "timeline_downsampled_episodes": timeline.downsampled,
            "viewer": MetadataValue.url(how_to_view(ref, s3.viewer_url))
            if s3.viewer_url
            else view_command(ref),
            "code_version_digest": recorded or "(not recorded)",
            **outcome.as_metadata(),
            "mp4_s3_path": MetadataValue.url(links.object(columns.mp4_s3_path))
            if columns.mp4_s3_path
            else "(none)",
            "parquet_s3_path": MetadataValue.url(links.object(columns.parquet_s3_path))
            if columns.parquet_s3_path
            else "(none)",
            "dagster/row_count": 1,
        },
    )
