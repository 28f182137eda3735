"""The episode_pipeline code location: one `Definitions`, built by a function from `Settings`.

Importing this module does nothing: Dagster calls `defs()` when it loads the code location, and
that reads the settings once from the environment (production's; on a laptop the one
`episode-pipeline dev` exported from the local stack). It never imports `episode_pipeline.local`
(an import contract in pyproject.toml). The runner, the report and the tests call
`build_definitions(settings)` with their own.
"""

from __future__ import annotations

from typing import Any

from dagster import Definitions, definitions, in_process_executor

from episode_pipeline.config.daemon_throughput import apply_run_status_sensor_limits
from episode_pipeline.config.settings import Settings, settings_from_environment
from episode_pipeline.defs.assets.archive import extracted_files, raw_archive
from episode_pipeline.defs.assets.episode import episode
from episode_pipeline.defs.assets.episode_metadata import episode_metadata
from episode_pipeline.defs.assets.frames import frames
from episode_pipeline.defs.assets.hls_renditions import hls_renditions
from episode_pipeline.defs.batches import batch_job
from episode_pipeline.defs.checks import EPISODE_CHECKS
from episode_pipeline.defs.checks.sync import video_frames_in_sync
from episode_pipeline.defs.io_managers.postgres_tables import PostgresPolarsIOManager
from episode_pipeline.defs.io_managers.s3_outputs import S3IOManager
from episode_pipeline.defs.jobs import episode_job
from episode_pipeline.defs.partitions import with_setting_in_code_version
from episode_pipeline.defs.resources.archive_limits import ArchiveLimitsResource
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.defs.resources.sqs import UploadQueueResource
from episode_pipeline.defs.resources.transcoder import HlsTranscoder
from episode_pipeline.defs.sensors.campaign import campaign_driver
from episode_pipeline.defs.sensors.metered import metered
from episode_pipeline.defs.sensors.reconcile import orphaned_runs, reconciliation_sensors
from episode_pipeline.defs.sensors.retention import retention_sensor
from episode_pipeline.defs.sensors.run_failure import episode_failed_on_run_failure
from episode_pipeline.defs.sensors.sqs import upload_queue_sensors
from episode_pipeline.instance.run_tags import EPISODE_JOB_NAME


def build_resources(settings: Settings) -> dict[str, Any]:
    """Every resource the assets, checks and sensors use, from one `Settings`."""
    postgres = PostgresResource.from_settings(settings.database)
    s3 = S3BucketResource.from_settings(settings)
    return {
        "postgres": postgres,
        "s3": s3,
        "upload_queue": UploadQueueResource.from_settings(settings),
        # FFmpeg runs out of process: a subprocess of the run (by default, also on AWS), or an
        # ECS task of its own when the run's tags say so (transcode.placement).
        "transcoder": HlsTranscoder.from_settings(settings),
        "s3_io_manager": S3IOManager(s3=s3),
        "postgres_io_manager": PostgresPolarsIOManager(postgres=postgres),
        "archive_limits": ArchiveLimitsResource.from_settings(settings.archive_limits),
    }


def hls_settings(settings: Settings) -> str:
    """The settings that change what the same videos transcode to (part of its code version)."""
    video = settings.transcode.video
    ladder = "-".join(video.ladder) or "none"
    return f"preset={video.preset},ladder={ladder},ladder_preset={video.ladder_preset}"


def build_definitions(settings: Settings) -> Definitions:
    defs = Definitions(
        assets=[
            raw_archive,
            extracted_files,
            with_setting_in_code_version(hls_renditions, hls_settings(settings)),
            frames,
            episode_metadata,
            episode,
        ],
        asset_checks=[
            *EPISODE_CHECKS,
            video_frames_in_sync(blocking=settings.sync_check_blocking),
        ],
        # A campaign's batch runs its episodes as runs of these definitions' own episode job.
        jobs=[episode_job, batch_job(lambda: defs.resolve_job_def(EPISODE_JOB_NAME))],
        # Every evaluation of every sensor writes its metric line (defs/sensors/metered.py).
        sensors=[
            metered(sensor)
            for sensor in (
                *upload_queue_sensors(settings.queue, settings.transcode),
                episode_failed_on_run_failure,
                orphaned_runs,
                *reconciliation_sensors(settings.reconcile),
                retention_sensor(settings.retention),
                campaign_driver(settings.campaign, settings.retention),
            )
        ],
        resources=build_resources(settings),
        # One episode is a handful of steps: in-process saves ~3.5 s of process start-up per
        # step and keeps a run's temporary files in one place.
        executor=in_process_executor,
    )
    return defs


@definitions
def defs() -> Definitions:
    # The code server evaluates the run-status sensors: their per-tick limits are set here.
    apply_run_status_sensor_limits()
    return build_definitions(settings_from_environment())
