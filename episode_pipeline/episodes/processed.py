"""Marking an episode processed: its row, and in the same transaction its durable record
(`episode_outputs`): the code versions that produced it and the figures a campaign's canary
compares (docs/operations.md#reprocess-the-fleet); then what the run's outcome says.

What only Dagster's instance knows (the run, the graph's code versions, the sync check's
findings) the `episode` asset reads and passes in (`RunFacts`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from episode_pipeline.campaign.canary import (
    FRAME_ROWS,
    RENDITIONS,
    SECONDS_BY_CAMERA,
    SYNC_FINDINGS,
)
from episode_pipeline.db.episodes import frame_rows, mark_processed
from episode_pipeline.db.outputs import has_outputs_table, record_output
from episode_pipeline.db.schema_check import DatabaseSchema
from episode_pipeline.episodes.episode_rows import EpisodeColumns, episode_columns
from episode_pipeline.episodes.extracted_files import DATA, ExtractedFiles
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.runtime import metrics
from episode_pipeline.storage.bucket import ObjectInfo
from episode_pipeline.video.hls import PLAYLIST_NAME

# The materialization's latency, read back by `episode-pipeline health` (p50/p95).
UPLOAD_TO_PROCESSED_METADATA = "upload_to_processed_seconds"


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

    def emit(self, ref: EpisodeRef, run_id: str) -> None:
        """The `EpisodesProcessed` metric line."""
        metrics.Emitter.from_env().episode_processed(
            ref.partition_key,
            run_id,
            latency_seconds=self.latency_seconds,
            run_wall_seconds=self.run_wall_seconds,
            bytes_in=self.bytes_in,
            bytes_out=self.bytes_out,
        )


@dataclass(frozen=True)
class RunFacts:
    """What Dagster's instance knows of the run marking the episode processed."""

    run_id: str
    started: float | None  # the run's start (epoch seconds), None when not recorded
    code_versions: Mapping[str, str]  # of the episode job's assets


@dataclass(frozen=True)
class ProcessedEpisode:
    processed_at: datetime
    outcome: ProcessedOutcome
    recorded: str | None  # the code versions' digest; None: no `episode_outputs` table


def processed_columns(extracted: ExtractedFiles) -> EpisodeColumns:
    """The columns the episode row gets from what the extraction found."""
    return episode_columns(
        mp4_keys=[f.key for f in extracted.videos],
        data_parquet_keys=[f.key for f in extracted.files if f.kind == DATA],
        info=extracted.dataset_info(),
    )


def processed_outcome(
    extracted: ExtractedFiles,
    processed_at: datetime,
    hls_objects: Iterable[ObjectInfo],
    run_started: float | None,
) -> ProcessedOutcome:
    uploaded = extracted.archive.last_modified
    latency = None
    if uploaded:
        latency = max(0.0, (processed_at - datetime.fromisoformat(uploaded)).total_seconds())
    return ProcessedOutcome(
        latency_seconds=latency,
        run_wall_seconds=max(0.0, processed_at.timestamp() - run_started) if run_started else None,
        bytes_in=extracted.archive.size,
        bytes_out=extracted.bytes_extracted + sum(o.size for o in hls_objects),
    )


def renditions(keys: Iterable[str], ref: EpisodeRef) -> list[str]:
    """Every playlist under the episode's HLS root (`front`, `front/720`, ...), sorted."""
    return sorted(
        key[len(ref.hls_root) :].removesuffix("/" + PLAYLIST_NAME)
        for key in keys
        if key.startswith(ref.hls_root) and key.endswith("/" + PLAYLIST_NAME)
    )


def seconds_by_camera(hls_sources: list[dict[str, Any]]) -> dict[str, float]:
    """Each camera's source seconds as the transcode probed them (`sources` rows)."""
    seconds: dict[str, float] = defaultdict(float)
    for row in hls_sources:
        if row.get("seconds") is not None:
            seconds[row["camera"]] += float(row["seconds"])
    return {camera: round(value, 3) for camera, value in sorted(seconds.items())}


def record_processed(
    conn: psycopg.Connection,
    schema: DatabaseSchema,
    ref: EpisodeRef,
    columns: EpisodeColumns,
    extracted: ExtractedFiles,
    hls_objects: list[ObjectInfo],
    hls_sources: list[dict[str, Any]],
    run: RunFacts,
    sync_findings: int | None,
) -> ProcessedEpisode:
    """Mark the episode processed and replace its record, in the caller's transaction:
    `hls_objects` is the listing of its HLS tree, `hls_sources` the `hls_renditions`
    materialization's `sources` rows, `sync_findings` the sync rule's count (the timeline's)."""
    processed_at = mark_processed(conn, schema, ref, columns)
    outcome = processed_outcome(extracted, processed_at, hls_objects, run.started)
    recorded = None
    if has_outputs_table(conn):
        figures = {
            FRAME_ROWS: frame_rows(conn, ref),
            SECONDS_BY_CAMERA: seconds_by_camera(hls_sources),
            RENDITIONS: renditions([o.key for o in hls_objects], ref),
            SYNC_FINDINGS: sync_findings,
        }
        recorded = record_output(
            conn,
            ref,
            run.code_versions,
            figures,
            run_id=run.run_id,
            wall_seconds=outcome.run_wall_seconds,
            archive_bytes=extracted.archive.size,
        )
    return ProcessedEpisode(processed_at, outcome, recorded)
