"""The one Definitions of the episode_pipeline code location.

Resources come from the environment (production) or from the embedded local stack's state file
(`episode-pipeline stack up`), through `settings.load_settings()`: the code is the same in both.
"""

from __future__ import annotations

from dagster import Definitions, in_process_executor

from episode_pipeline.defs.assets.archive import extracted_files, raw_archive
from episode_pipeline.defs.assets.episode import episode
from episode_pipeline.defs.assets.frames import frames
from episode_pipeline.defs.assets.hls import hls_playlists_valid, hls_renditions
from episode_pipeline.defs.assets.metadata import episode_metadata
from episode_pipeline.defs.checks import EPISODE_CHECKS
from episode_pipeline.defs.io_managers.postgres import PostgresPolarsIOManager
from episode_pipeline.defs.io_managers.s3 import S3IOManager
from episode_pipeline.defs.jobs import episode_job
from episode_pipeline.defs.resources.postgres import PostgresResource
from episode_pipeline.defs.resources.storage import EpisodeStorage
from episode_pipeline.defs.resources.transcoder import HlsTranscoder
from episode_pipeline.defs.sensors.reconcile import orphaned_runs_sensor, waiting_uploads_sensor
from episode_pipeline.defs.sensors.run_failure import episode_failed_on_run_failure
from episode_pipeline.defs.sensors.sqs import UPLOAD_QUEUE_SENSORS, upload_queue_resource
from episode_pipeline.settings import apply_local_stack_env, load_settings

apply_local_stack_env()
_settings = load_settings()


def postgres_resource() -> PostgresResource:
    return PostgresResource.from_settings(_settings.database)


def storage_resource() -> EpisodeStorage:
    return EpisodeStorage.from_settings(_settings)


_postgres = postgres_resource()
_storage = storage_resource()

defs = Definitions(
    assets=[raw_archive, extracted_files, hls_renditions, frames, episode_metadata, episode],
    asset_checks=[*EPISODE_CHECKS, hls_playlists_valid],
    jobs=[episode_job],
    sensors=[
        *UPLOAD_QUEUE_SENSORS,
        episode_failed_on_run_failure,
        orphaned_runs_sensor,
        waiting_uploads_sensor,
    ],
    resources={
        "postgres": _postgres,
        "storage": _storage,
        "upload_queue": upload_queue_resource(_settings),
        # FFmpeg runs out of process: a subprocess locally, an ECS task when
        # TRANSCODE_TASK_DEFINITION is set (production).
        "transcoder": HlsTranscoder.from_env(),
        "s3_io_manager": S3IOManager(storage=_storage),
        "postgres_io_manager": PostgresPolarsIOManager(postgres=_postgres),
    },
    # One episode is a handful of steps: in-process saves ~3.5 s of process start-up per step
    # (platform-notes) and keeps a run's temporary files in one place.
    executor=in_process_executor,
)
