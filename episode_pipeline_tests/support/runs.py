"""Dagster runs made by hand."""

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from episode_pipeline.instance.run_tags import EPISODE_JOB_NAME
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


@contextmanager
def backfill_daemon(instance: Any) -> Iterator[Callable[[], None]]:
    """Dagster's backfill daemon against the code location as the workspace file names it: each
    call of what this yields is one iteration (the requested backfills' runs made and submitted)."""
    import yaml

    from episode_pipeline.local.dev import WORKSPACE_FILE
    from episode_pipeline_tests.support.dagster_internals import (
        ModuleTarget,
        create_test_daemon_workspace_context,
        execute_backfill_iteration,
    )

    (location,) = yaml.safe_load(WORKSPACE_FILE.read_text())["load_from"]
    target = ModuleTarget(
        module_name=location["python_module"]["module_name"],
        attribute=None,
        working_directory=None,
        location_name=location["python_module"]["location_name"],
    )
    with create_test_daemon_workspace_context(target, instance) as workspace:
        yield (
            lambda: (
                list(execute_backfill_iteration(workspace, logging.getLogger(__name__))) and None
            )
        )
