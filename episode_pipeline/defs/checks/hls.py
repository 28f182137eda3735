"""The checks of `hls_renditions`, one row per camera so the UI shows which camera failed.

What they conclude is `episodes/hls_checks.py`'s (from S3 now and the transcode's recorded
probes); each check here loads the episode's cameras, asks for one verdict and shows it.
"""

from dagster import AssetCheckResult, AssetCheckSeverity, MetadataValue

from episode_pipeline.defs.asset_keys import HLS_RENDITIONS_KEY
from episode_pipeline.defs.checks.family import (
    EXTRACTED_FILES_INS,
    EpisodeCheckContext,
    EpisodeCheckFamily,
)
from episode_pipeline.defs.metadata import table
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.episodes.extracted_files import ExtractedFiles
from episode_pipeline.episodes.hls_checks import CameraVerdicts, CheckedCameras
from episode_pipeline.episodes.keys import parse_partition_key
from episode_pipeline.orchestration.event_log import recorded_sources
from episode_pipeline.runtime import metrics

CHECK_COLUMNS = [
    ("camera", "string", "Camera"),
    ("passed", "bool", "Whether this camera passed"),
    ("problems", "string", "What is wrong, naming the object"),
]


def load_cameras(
    context: EpisodeCheckContext, extracted: ExtractedFiles, s3: S3BucketResource
) -> CheckedCameras:
    """The episode's cameras in S3 and the probes the transcode recorded of their sources."""
    ref = parse_partition_key(context.partition_key)
    bucket = s3.get_client()
    recorded = recorded_sources(context.instance, context.partition_key)
    return CheckedCameras.load(ref, extracted, bucket, recorded)


def camera_result(verdicts: CameraVerdicts) -> AssetCheckResult:
    """The check's result with a camera | passed | problems table (WARN for every HLS check: an
    episode is processed despite a video error, so a bad stream flags it without blocking it)."""
    return AssetCheckResult(
        passed=not verdicts.failing,
        description=verdicts.description,
        metadata={
            "cameras_checked": len(verdicts.rows),
            "failing_cameras": MetadataValue.json(verdicts.failing),
            "per_camera": table(CHECK_COLUMNS, verdicts.rows),
        },
    )


family = EpisodeCheckFamily("hls_renditions_checks", ins=EXTRACTED_FILES_INS)


@family.check(
    asset=HLS_RENDITIONS_KEY,
    severity=AssetCheckSeverity.WARN,
    description="Every mp4 of every camera was probed and decodes (PyAV: codec, size, rate, "
    "duration, frames; a file cut short holds fewer frames than its index). Fails naming the "
    "file. WARN: a bad source is left out and the episode goes on.",
)
def hls_sources_readable(
    context: EpisodeCheckContext, extracted_files: ExtractedFiles, s3: S3BucketResource
) -> AssetCheckResult:
    checked = load_cameras(context, extracted_files, s3)
    return camera_result(checked.verdicts(checked.unreadable_sources))


@family.check(
    asset=HLS_RENDITIONS_KEY,
    severity=AssetCheckSeverity.WARN,
    description="Per camera in S3: `master.m3u8` and every playlist it lists parse; every "
    "variant states BANDWIDTH, RESOLUTION, CODECS and FRAME-RATE, none above the source's size or "
    "rate, the baseline `playlist.m3u8` among them; every listed segment exists, each but the "
    "last at most 4 s (+0.1 s), ENDLIST present. WARN.",
)
def hls_playlists_valid(
    context: EpisodeCheckContext, extracted_files: ExtractedFiles, s3: S3BucketResource
) -> AssetCheckResult:
    checked = load_cameras(context, extracted_files, s3)
    return camera_result(checked.verdicts(checked.playlist_problems))


@family.check(
    asset=HLS_RENDITIONS_KEY,
    severity=AssetCheckSeverity.WARN,
    description="The drift canary: per camera, the baseline HLS lasts as long as its sources "
    "together (within 0.5 s). WARN.",
)
def hls_duration_matches_sources(
    context: EpisodeCheckContext, extracted_files: ExtractedFiles, s3: S3BucketResource
) -> AssetCheckResult:
    checked = load_cameras(context, extracted_files, s3)
    verdicts = checked.verdicts(checked.drift_problems)
    metrics.Emitter.from_env().findings(
        metrics.DRIFT_FINDINGS, len(verdicts.failing), context.partition_key, context.op.run.run_id
    )
    return camera_result(verdicts)


@family.check(
    asset=HLS_RENDITIONS_KEY,
    severity=AssetCheckSeverity.WARN,
    description="Decoding proves playback: per camera the baseline HLS decodes end to end to "
    "the sources' frame count (± one frame per source), and the first segment of every "
    "rendition decodes at the size the master claims. WARN.",
)
def hls_decodes_to_source_frames(
    context: EpisodeCheckContext, extracted_files: ExtractedFiles, s3: S3BucketResource
) -> AssetCheckResult:
    checked = load_cameras(context, extracted_files, s3)
    problems = checked.decode_problems()
    return camera_result(checked.verdicts(lambda camera: problems[camera]))


HLS_CHECKS = [family.definition()]
