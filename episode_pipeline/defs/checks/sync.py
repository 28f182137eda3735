"""`video_frames_in_sync`: each LeRobot episode's rows against each camera's frames.

The rule is `lerobot/sync.py` (docs/sync.md); this check only gathers its inputs, all recorded
by steps that already read the sources: the rows' timing from the `frames` materialization (fed
while the data parquets streamed), each mp4's probe from the `hls_renditions` materialization
(the transcode's), and for v3.0 the episodes table (`meta/episodes/*.parquet`, a small file).
Nothing is decoded again.

WARN by default; `SYNC_CHECK_BLOCKING=1` makes it an ERROR that blocks the episode row.
"""

from dataclasses import dataclass
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    DagsterInstance,
    MetadataValue,
)

from episode_pipeline.dagster_compat import PartitionKeyFilter
from episode_pipeline.defs.asset_keys import FRAMES_KEY, HLS_RENDITIONS_KEY
from episode_pipeline.defs.checks.family import (
    EXTRACTED_FILES_INS,
    EpisodeCheckContext,
    EpisodeCheckFamily,
)
from episode_pipeline.defs.checks.hls import recorded_sources
from episode_pipeline.defs.metadata import EPISODE_TIMING_METADATA, table
from episode_pipeline.defs.resources.s3 import S3BucketResource
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
from episode_pipeline.orchestration.event_log import latest_materialization_metadata
from episode_pipeline.runtime import metrics
from episode_pipeline.storage.bucket import Bucket

CHECK_NAME = "video_frames_in_sync"
DESCRIPTION_FINDINGS = 5  # findings spelled out in the description; all are in the metadata
SYNC_COLUMNS = [
    ("episode", "int", "LeRobot episode_index"),
    ("camera", "string", "Camera (the LeRobot feature key)"),
    ("file", "string", "The mp4 holding the episode's frames"),
    ("rows", "int", "Data rows of the episode"),
    ("frames", "int", "The camera's frames for the episode (v3.0: inside its range)"),
    ("drift_frames", "int", "frames - rows (± 1 allowed)"),
    ("drift_seconds", "float", "drift_frames / fps"),
    ("start_offset_seconds", "float", "First frame minus the first row's time (late: > 0)"),
    ("timestamps", "string", "ok, or where the rows' timestamps are not 1/fps apart"),
    ("passed", "bool", "Whether this episode and camera line up"),
    ("problems", "string", "What does not line up, with the offset"),
]


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
    (`defs/assets/timeline.py`) start from the same facts."""

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


def gather_sync_inputs(
    instance: DagsterInstance, partition: str, extracted: ExtractedFiles, bucket: Bucket
) -> SyncInputs | None:
    """The rule's inputs; None when no `frames` materialization recorded the rows' timing."""
    timing = latest_materialization_metadata(instance, FRAMES_KEY, partition).get(
        EPISODE_TIMING_METADATA
    )
    if not isinstance(timing, dict):
        return None
    try:
        info: DatasetInfo | None = extracted.dataset_info()
    except ValueError:
        info = None  # the assets already failed on it; the paths still name the cameras
    videos = video_facts(extracted, info, recorded_sources(instance, partition))
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


def sync_result(report: SyncReport, tolerance: float) -> AssetCheckResult:
    """The report as the UI shows it: findings in the description, the episode by camera table."""
    rows = [
        {
            **{name: getattr(row, name) for name, _, _ in SYNC_COLUMNS if hasattr(row, name)},
            "passed": not row.problems,
            "problems": "; ".join(row.problems),
        }
        for row in report.rows
    ]
    shown = report.findings[:DESCRIPTION_FINDINGS]
    more = len(report.findings) - len(shown)
    description = "\n".join(shown + ([f"... and {more} more (see findings)"] if more else []))
    return AssetCheckResult(
        passed=report.passed,
        description=description or None,
        metadata={
            "per_episode_camera": table(SYNC_COLUMNS, rows),
            "findings": MetadataValue.json(report.findings),
            "failing": MetadataValue.json(report.failing),
            "episodes_checked": len({row.episode for row in report.rows}),
            "tolerance_s": tolerance,
        },
    )


def video_frames_in_sync(blocking: bool = False) -> AssetChecksDefinition:
    """The check; `blocking` (SYNC_CHECK_BLOCKING) makes a failure an ERROR that stops the
    episode row."""
    severity = AssetCheckSeverity.ERROR if blocking else AssetCheckSeverity.WARN
    # Its own step, not one of the HLS family's: it runs after `frames` (whose timing it reads),
    # and the HLS checks need not wait for frames nor be skipped when frames fails.
    family = EpisodeCheckFamily("hls_renditions_sync_check", ins=EXTRACTED_FILES_INS)

    @family.check(
        severity=severity,
        name=CHECK_NAME,
        asset=HLS_RENDITIONS_KEY,
        blocking=blocking,
        additional_deps=[FRAMES_KEY],  # reads the timing frames recorded: runs after it
        description="Video and data line up, per LeRobot episode and camera, the way LeRobot "
        "checks: rows vs the camera's frames (± 1), its duration vs rows / fps, timestamps "
        f"1/fps apart (± {TOLERANCE_S:g} s), and for v3.0 the episode's from_timestamp.."
        "to_timestamp inside the concatenated mp4. Counts come from the transcode's probe and "
        f"the frames step's read (docs/sync.md). {severity.value}.",
    )
    def video_frames_in_sync_check(
        context: EpisodeCheckContext, extracted_files: ExtractedFiles, s3: S3BucketResource
    ) -> AssetCheckResult:
        partition = context.partition_key
        inputs = gather_sync_inputs(context.instance, partition, extracted_files, s3.get_client())
        if inputs is None:
            return AssetCheckResult(
                passed=False,
                description="Not checked: no `frames` materialization recorded the rows' timing "
                f"({EPISODE_TIMING_METADATA}); materialize frames.",
            )
        report = inputs.report()
        metrics.Emitter.from_env().findings(
            metrics.SYNC_FINDINGS, len(report.findings), partition, context.op.run.run_id
        )
        return sync_result(report, inputs.tolerance_s)

    return family.definition()


def latest_sync_result(instance: DagsterInstance, partition_key: str) -> dict[str, Any] | None:
    """The episode's latest sync evaluation as `check` and `status` print it (None: never run)."""
    key = AssetCheckKey(HLS_RENDITIONS_KEY, CHECK_NAME)
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [key], partition_filter=PartitionKeyFilter(key=partition_key)
    ).get(key)
    event = latest.event if latest else None
    evaluation = event.dagster_event.event_specific_data if event and event.dagster_event else None
    if not isinstance(evaluation, AssetCheckEvaluation):
        return None
    metadata = {name: value.value for name, value in evaluation.metadata.items()}
    return {
        "passed": evaluation.passed,
        "severity": evaluation.severity.value,
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
