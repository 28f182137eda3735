"""Dagster runs made by hand."""

from episode_pipeline.defs.jobs import EPISODE_JOB_NAME
from episode_pipeline_tests.support.dagster_internals import (
    InProcessCodeLocationOrigin,
    LoadableTargetOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)

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
