"""What `video_frames_in_sync` reads and concludes about one episode, without Dagster.

The rule is `lerobot/sync.py` (docs/sync.md); this module gathers its inputs, all recorded by
steps that already read the sources: the rows' timing the `frames` step recorded (fed while the
data parquets streamed), each mp4's probe the transcode recorded, and for v3.0 the episodes table
(`meta/episodes/*.parquet`, a small file). Nothing is decoded again. The check
(`defs/checks/sync.py`) and the timeline (`episodes/timeline_writer.py`) start from the same facts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from episode_pipeline.episodes.extracted_files import META, ExtractedFiles, videos_by_camera
from episode_pipeline.lerobot.cameras import locate_video
from episode_pipeline.lerobot.info import DatasetInfo
from episode_pipeline.lerobot.parquet import UnreadableParquet, read_rows
from episode_pipeline.lerobot.sync import (
    EPISODES_TABLE_PREFIX,
    TOLERANCE_S,
    EpisodesTable,
    EpisodeTiming,
    SyncReport,
    VideoFacts,
    check_sync,
    episodes_table,
    path_indices,
    timings_from_json,
)
from episode_pipeline.storage.bucket import Bucket

DESCRIPTION_FINDINGS = 5  # findings spelled out in the description; all are in the metadata


def video_facts(
    extracted: ExtractedFiles, info: DatasetInfo | None, recorded: dict[str, list[dict[str, Any]]]
) -> list[VideoFacts]:
    """Every mp4 with its path's indices and the transcode's probe of it."""
    facts = []
    for camera, files in videos_by_camera(extracted).items():
        probes = {row["key"]: row for row in recorded.get(camera, [])}
        for file in files:
            captured = locate_video(file.path, info).indices
            probe = probes.get(file.key)
            common = {
                "key": file.key,
                "camera": camera,
                "indices": path_indices(file.path, captured),
            }
            if probe is None or probe.get("error"):
                error = probe["error"] if probe else "no probe recorded by hls_renditions"
                facts.append(VideoFacts(**common, error=error))
                continue
            facts.append(
                VideoFacts(
                    **common,
                    frames=probe.get("frames"),
                    seconds=probe.get("seconds"),
                    fps=probe.get("fps"),
                    start_seconds=probe.get("start_seconds"),
                    last_frame_seconds=probe.get("last_frame_seconds"),
                )
            )
    return facts


def read_episodes_table(
    bucket: Bucket, extracted: ExtractedFiles, cameras: list[str]
) -> EpisodesTable | None:
    """The v3.0 episodes table (every `meta/episodes/*.parquet`), None when the archive has none."""
    parts = sorted(
        (f for f in extracted.files if f.kind == META and f.path.endswith(".parquet")),
        key=lambda f: f.path,
    )
    parts = [f for f in parts if f"/{EPISODES_TABLE_PREFIX}" in f"/{f.path}"]
    if not parts:
        return None
    wanted = {"episode_index", "length"} | {
        f"videos/{camera}/{name}"
        for camera in cameras
        for name in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
    }
    rows: list[dict[str, Any]] = []
    problems = []
    for part in parts:
        try:
            rows += read_rows(bucket.get_bytes(part.key), part.key, wanted)
        except UnreadableParquet as error:
            problems.append(f"{part.key}: unreadable episodes table ({error})")
    found = episodes_table(rows, cameras, ", ".join(part.key for part in parts))
    found.problems[:0] = problems
    return found


@dataclass(frozen=True)
class SyncInputs:
    """What the sync rule reads about one episode, gathered from the records of the steps that
    already read the sources (and, for v3.0, the episodes table): the check and the timeline
    (`episodes/timeline_writer.py`) start from the same facts."""

    codebase_version: str | None
    fps: float | None
    timings: dict[int, EpisodeTiming]
    videos: list[VideoFacts]
    table: EpisodesTable | None
    tolerance_s: float

    def report(self) -> SyncReport:
        return check_sync(
            codebase_version=self.codebase_version,
            fps=self.fps,
            timings=self.timings,
            videos=self.videos,
            table=self.table,
            tolerance_s=self.tolerance_s,
        )


def sync_inputs(
    timing: Mapping[str, Any],
    recorded: dict[str, list[dict[str, Any]]],
    extracted: ExtractedFiles,
    bucket: Bucket,
) -> SyncInputs:
    """The rule's inputs from the rows' timing `frames` recorded and the probes `hls_renditions`
    recorded (by camera)."""
    try:
        info: DatasetInfo | None = extracted.dataset_info()
    except ValueError:
        info = None  # the assets already failed on it; the paths still name the cameras
    videos = video_facts(extracted, info, recorded)
    version = info.codebase_version if info else None
    cameras = sorted({video.camera for video in videos})
    episodes = None
    if (version or "").startswith("v3") and cameras:
        episodes = read_episodes_table(bucket, extracted, cameras)
    return SyncInputs(
        codebase_version=version,
        fps=(info.fps if info else None) or timing.get("fps"),
        timings=timings_from_json(timing),
        videos=videos,
        table=episodes,
        tolerance_s=float(timing.get("tolerance_s") or TOLERANCE_S),  # what frames measured with
    )


def findings_description(report: SyncReport) -> str | None:
    """The first findings, one a line, and how many more the metadata holds (None: none)."""
    shown = report.findings[:DESCRIPTION_FINDINGS]
    more = len(report.findings) - len(shown)
    description = "\n".join(shown + ([f"... and {more} more (see findings)"] if more else []))
    return description or None


def sync_result_fields(evaluation: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The sync check's recorded evaluation (passed, severity, metadata) as `check` and `status`
    print it (None: never run)."""
    if evaluation is None:
        return None
    metadata = evaluation["metadata"]
    return {
        "passed": evaluation["passed"],
        "severity": evaluation["severity"],
        "failing": list(metadata.get("failing") or []),
        "findings": list(metadata.get("findings") or []),
    }


def sync_summary(result: dict[str, Any] | None) -> str:
    """One cell: `ok`, `2 finding(s): episode 1 / front`, or `-` (not run)."""
    if result is None:
        return "-"
    if result["passed"]:
        return "ok"
    failing = ", ".join(result["failing"]) or "see findings"
    return f"{len(result['findings'])} finding(s): {failing}"
