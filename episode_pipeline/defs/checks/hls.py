"""The checks of `hls_renditions`, one row per camera so the UI shows which camera failed.

The checks read what S3 holds now (playlists, segments, decoded frames); the sources' facts
(size, rate, duration, frames) come from the probes the transcode recorded in the materialization
(`sources`), since probing them again would download every mp4 a second time.
"""

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagster import AssetCheckResult, AssetCheckSeverity, MetadataValue

from episode_pipeline.defs.asset_keys import HLS_RENDITIONS_KEY
from episode_pipeline.defs.checks.family import (
    EXTRACTED_FILES_INS,
    EpisodeCheckContext,
    EpisodeCheckFamily,
)
from episode_pipeline.defs.metadata import table
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.episodes.extracted_files import ExtractedFiles, videos_by_camera
from episode_pipeline.episodes.keys import parse_partition_key
from episode_pipeline.orchestration.event_log import recorded_sources
from episode_pipeline.runtime import metrics
from episode_pipeline.video.stored import (
    StoredCamera,
    decode_problems,
    drift_problems,
    playlist_problems,
)
from episode_pipeline.video.verify import SourceFacts

CHECK_COLUMNS = [
    ("camera", "string", "Camera"),
    ("passed", "bool", "Whether this camera passed"),
    ("problems", "string", "What is wrong, naming the object"),
]


def usable_sources(rows: list[dict[str, Any]]) -> list[SourceFacts]:
    fields = ("key", "width", "height", "fps", "frames", "seconds")
    return [SourceFacts(**{f: row[f] for f in fields}) for row in rows if not row.get("error")]


@dataclass
class CheckedCameras:
    """What every HLS check starts from: the episode's cameras as S3 holds them now, and each
    camera's usable sources as the transcode probed them."""

    stored: dict[str, StoredCamera]
    sources: dict[str, list[SourceFacts]]
    recorded: dict[str, list[dict[str, Any]]]

    @classmethod
    def load(
        cls,
        context: EpisodeCheckContext,
        extracted: ExtractedFiles,
        s3: S3BucketResource,
    ) -> "CheckedCameras":
        ref = parse_partition_key(context.partition_key)
        bucket = s3.get_client()
        recorded = recorded_sources(context.instance, context.partition_key)
        cameras = list(videos_by_camera(extracted))
        return cls(
            stored={c: StoredCamera(bucket, ref.hls_prefix(c)) for c in cameras},
            sources={c: usable_sources(recorded.get(c, [])) for c in cameras},
            recorded=recorded,
        )

    def result(self, problems_of: Callable[[str], list[str]]) -> AssetCheckResult:
        """The check's result with a camera | passed | problems table (WARN for every HLS check:
        an episode is processed despite a video error, so a bad stream flags it without blocking
        it)."""
        rows = []
        for camera in self.stored:
            problems = problems_of(camera)
            rows.append({"camera": camera, "passed": not problems, "problems": "; ".join(problems)})
        failing = [row["camera"] for row in rows if not row["passed"]]
        return AssetCheckResult(
            passed=not failing,
            description=f"failing camera(s): {', '.join(failing)}" if failing else None,
            metadata={
                "cameras_checked": len(rows),
                "failing_cameras": MetadataValue.json(failing),
                "per_camera": table(CHECK_COLUMNS, rows),
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
    checked = CheckedCameras.load(context, extracted_files, s3)
    files = videos_by_camera(extracted_files)

    def problems_of(camera: str) -> list[str]:
        rows = {row["key"]: row for row in checked.recorded.get(camera, [])}
        return [
            rows[f.key]["error"] if f.key in rows else f"{f.key}: not probed (see the asset)"
            for f in files[camera]
            if f.key not in rows or rows[f.key].get("error")
        ]

    return checked.result(problems_of)


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
    checked = CheckedCameras.load(context, extracted_files, s3)
    return checked.result(lambda c: playlist_problems(checked.stored[c], checked.sources[c]))


@family.check(
    asset=HLS_RENDITIONS_KEY,
    severity=AssetCheckSeverity.WARN,
    description="The drift canary: per camera, the baseline HLS lasts as long as its sources "
    "together (within 0.5 s). WARN.",
)
def hls_duration_matches_sources(
    context: EpisodeCheckContext, extracted_files: ExtractedFiles, s3: S3BucketResource
) -> AssetCheckResult:
    checked = CheckedCameras.load(context, extracted_files, s3)
    result = checked.result(lambda c: drift_problems(checked.stored[c], checked.sources[c]))
    drifting = result.metadata["failing_cameras"].value if result.metadata else []
    metrics.Emitter.from_env().findings(
        metrics.DRIFT_FINDINGS, len(drifting), context.partition_key, context.op.run.run_id
    )
    return result


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
    checked = CheckedCameras.load(context, extracted_files, s3)
    cameras = {c: (stored, checked.sources[c]) for c, stored in checked.stored.items()}
    with tempfile.TemporaryDirectory(prefix="hls-decode-") as tmp:
        problems = decode_problems(cameras, Path(tmp))
    return checked.result(lambda c: problems[c])


HLS_CHECKS = [family.definition()]
