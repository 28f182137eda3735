"""Writing `processed/timeline.json`, the last output before the `episode` row says `processed`
(the document and its rules: `episodes/timeline.py`, docs/contract.md#timeline).

Its facts are the ones the other steps recorded, read back, nothing decoded again: the cameras'
outputs and their sources' places in each stream (`hls_renditions` metadata), the sync rule's
placements and findings over the same inputs as the `video_frames_in_sync` check, and the state
and action of every row, read from the data parquets with the `frames` step's own column rule.
The `episode` asset reads the recorded facts from Dagster's instance and passes them in.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from episode_pipeline.episodes.extracted_files import ExtractedFiles
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.episodes.sync_check import SyncInputs
from episode_pipeline.episodes.timeline import (
    TIMELINE_NAME,
    CameraSource,
    CameraTrack,
    SeriesCollector,
    build_timeline,
    feature_names,
)
from episode_pipeline.lerobot.features import features_from_info
from episode_pipeline.lerobot.frames import BATCH_ROWS, FrameDataError, open_frame_file
from episode_pipeline.lerobot.sync import place_episodes
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.video.storyboard import STORYBOARD_VTT


@dataclass(frozen=True)
class WrittenTimeline:
    key: str
    size: int
    episodes: int
    downsampled: int  # episodes whose series were downsampled
    skipped_files: list[str]  # data files that could not be read (frames skipped them too)
    # The sync rule's findings on the same inputs as `video_frames_in_sync` (None: no `frames`
    # timing recorded): the episode's record keeps their count, whichever step runs first.
    sync_findings: int | None = None


def camera_tracks(
    camera_rows: list[dict[str, Any]], source_rows: list[dict[str, Any]], ref: EpisodeRef
) -> list[CameraTrack]:
    """Every camera of the latest `hls_renditions` materialization (its `per_camera` and
    `sources` tables' rows), keys relative to processed/ (the viewer resolves them), sources
    with their places in the stream."""

    def relative(key: str | None) -> str | None:
        return key.removeprefix(ref.processed_prefix) if key else None

    sources: dict[str, list[CameraSource]] = {}
    for row in source_rows:
        sources.setdefault(row["camera"], []).append(
            CameraSource(
                key=row["key"],
                stream_start=row.get("stream_start_seconds"),
                stream_end=row.get("stream_end_seconds"),
                fps=row.get("fps"),
                error=row.get("error"),
            )
        )
    tracks = []
    for row in camera_rows:
        board = row.get("storyboard")
        storyboard = None
        if board:
            storyboard = {
                "image": relative(board),
                "vtt": relative(board.rsplit("/", 1)[0] + "/" + STORYBOARD_VTT),
                "interval": row.get("storyboard_interval"),
                "tiles": row.get("storyboard_tiles"),
            }
        status = str(row.get("status") or "")
        tracks.append(
            CameraTrack(
                name=row["camera"],
                master=relative(row.get("master")),
                playlist=relative(row.get("playlist")),
                poster=relative(row.get("poster")),
                storyboard=storyboard,
                seconds=float(row.get("hls_seconds") or 0.0),
                sources=sources.get(row["camera"], []),
                error=status if status.startswith("failed") else None,
            )
        )
    return tracks


def collect_series(
    bucket: Bucket, extracted: ExtractedFiles
) -> tuple[SeriesCollector, list[str], dict[str, list[str] | None]]:
    """Every data file's rows by LeRobot episode, with the frames step's state/action rule;
    a file that does not read is skipped and named (as `frames` does)."""
    info = extracted.dataset_info()
    features = features_from_info(info)
    collector, skipped = SeriesCollector(), []
    with tempfile.TemporaryDirectory(prefix="timeline-") as tmp:
        for data_file in extracted.data_files:
            local = bucket.download_file(data_file.key, Path(tmp) / "data.parquet")
            file_rows = SeriesCollector()  # joins the rest only once the whole file read
            try:
                stream = open_frame_file(local, path=data_file.path, features=features)
                columns = stream.columns
                for batch in stream.parquet.batches(columns.read, BATCH_ROWS):
                    file_rows.add(batch, columns.state, columns.action)
            except FrameDataError as error:
                skipped.append(f"{data_file.path}: {error}")
                continue
            collector.extend(file_rows)
    names = {
        "state": feature_names(info.features.get(features.state)) if features else None,
        "action": feature_names(info.features.get(features.action)) if features else None,
    }
    return collector, skipped, names


def write_timeline(
    ref: EpisodeRef,
    extracted: ExtractedFiles,
    bucket: Bucket,
    hls_cameras: list[dict[str, Any]],
    hls_sources: list[dict[str, Any]],
    inputs: SyncInputs | None,
) -> WrittenTimeline:
    """Build the episode's timeline from the recorded facts and put it at
    `processed/timeline.json`: the `hls_renditions` materialization's `per_camera` and `sources`
    rows, and the sync rule's inputs (None: no `frames` materialization recorded the rows'
    timing)."""
    collector, skipped, names = collect_series(bucket, extracted)
    placements: dict = {}
    located: list = []
    findings: int | None = None
    fps = extracted.dataset_info().fps
    if inputs is not None:
        report = inputs.report()
        located, findings = report.located, len(report.findings)
        rate = inputs.fps or fps
        if rate:
            placements, _ = place_episodes(
                inputs.codebase_version,
                rate,
                inputs.timings,
                inputs.videos,
                inputs.table,
                tolerance_s=inputs.tolerance_s,
            )
    document = build_timeline(
        episode=ref.partition_key,
        fps=fps,
        codebase_version=extracted.dataset_info().codebase_version,
        series=collector.series(),
        cameras=camera_tracks(hls_cameras, hls_sources, ref),
        placements=placements,
        findings=located,
        names=names,
    )
    body = json.dumps(document, separators=(",", ":"), allow_nan=False).encode()
    key = ref.processed_prefix + TIMELINE_NAME
    bucket.put_bytes(key, body, content_type="application/json")
    return WrittenTimeline(
        key=key,
        size=len(body),
        episodes=len(document["episodes"]),
        downsampled=sum(e["series"]["sampling"] != "every_frame" for e in document["episodes"]),
        skipped_files=skipped,
        sync_findings=findings,
    )
