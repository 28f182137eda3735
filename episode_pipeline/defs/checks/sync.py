"""`video_frames_in_sync`: each LeRobot episode's rows against each camera's frames.

The rule is `lerobot/sync.py` (docs/sync.md) and its inputs are gathered by
`episodes/sync_check.py`; this check reads what the `frames` and `hls_renditions`
materializations recorded, calls them and shows the report.

WARN by default; `SYNC_CHECK_BLOCKING=1` makes it an ERROR that blocks the episode row.
"""

from typing import Any

from dagster import (
    AssetCheckKey,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    DagsterInstance,
    MetadataValue,
)

from episode_pipeline.defs.asset_keys import FRAMES_KEY, HLS_RENDITIONS_KEY
from episode_pipeline.defs.checks.family import (
    EXTRACTED_FILES_INS,
    EpisodeCheckContext,
    EpisodeCheckFamily,
)
from episode_pipeline.defs.metadata import EPISODE_TIMING_METADATA, table
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.episodes.extracted_files import ExtractedFiles
from episode_pipeline.episodes.sync_check import (
    SyncInputs,
    findings_description,
    sync_inputs,
    sync_result_fields,
)
from episode_pipeline.lerobot.sync import TOLERANCE_S, SyncReport
from episode_pipeline.orchestration.event_log import (
    latest_check_evaluation,
    latest_materialization_metadata,
    recorded_sources,
)
from episode_pipeline.runtime import metrics
from episode_pipeline.storage.bucket import Bucket

CHECK_NAME = "video_frames_in_sync"
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


def gather_sync_inputs(
    instance: DagsterInstance, partition: str, extracted: ExtractedFiles, bucket: Bucket
) -> SyncInputs | None:
    """The rule's inputs; None when no `frames` materialization recorded the rows' timing."""
    timing = latest_materialization_metadata(instance, FRAMES_KEY, partition).get(
        EPISODE_TIMING_METADATA
    )
    if not isinstance(timing, dict):
        return None
    return sync_inputs(timing, recorded_sources(instance, partition), extracted, bucket)


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
    return AssetCheckResult(
        passed=report.passed,
        description=findings_description(report),
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
    return sync_result_fields(latest_check_evaluation(instance, key, partition_key))
