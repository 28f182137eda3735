"""Dagster runs made by hand."""

from dagster._core.remote_origin import (
    InProcessCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

from episode_pipeline.defs.jobs import EPISODE_JOB_NAME

# A queued run must name the code it came from (the daemon launches it from there).
JOB_ORIGIN = RemoteJobOrigin(
    repository_origin=RemoteRepositoryOrigin(
        code_location_origin=InProcessCodeLocationOrigin(
            LoadableTargetOrigin(module_name="episode_pipeline.definitions")
        ),
        repository_name="__repository__",
    ),
    job_name=EPISODE_JOB_NAME,
)
