"""Launch failures from the real path: production's run launcher (`dagster_aws.ecs.EcsRunLauncher`,
as dagster.yaml configures it) driven by Dagster's own run queue daemon, with its ECS client
replaced by a STUB, the one part that cannot run here: ECS (and moto) never throttle RunTask or
run out of capacity on demand. The stub answers `RunTask` as ECS does in those cases: botocore's
`ClientError` for a `ThrottlingException` once boto3's retries ran out, or a response with no task
and a `failures` entry (`RESOURCE:CPU`), which dagster-aws turns into its own exception.
"""

from __future__ import annotations

import sys
from typing import Any

from botocore.exceptions import ClientError
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus

from episode_pipeline.defs.jobs import EPISODE_JOB_NAME
from episode_pipeline_tests.support.dagster_internals import (
    EmptyWorkspaceTarget,
    JobPythonOrigin,
    ModuleCodePointer,
    QueuedRunCoordinatorDaemon,
    RepositoryPythonOrigin,
    create_run_for_test,
    create_test_daemon_workspace_context,
)
from episode_pipeline_tests.support.runs import JOB_ORIGIN

# dagster.yaml's run launcher, with what needs the daemon's own ECS task left out (the stub has
# no task metadata endpoint); the task definition is set on the launcher after it is built.
ECS_RUN_LAUNCHER = {
    "module": "dagster_aws.ecs",
    "class": "EcsRunLauncher",
    "config": {
        "container_name": "run",
        "use_current_ecs_task_config": False,
        "include_sidecars": False,
        "secrets_tag": None,
        "run_resources": {"cpu": "2048", "memory": "4096"},
    },
}
TASK_DEFINITION = "arn:aws:ecs:us-west-2:123456789012:task-definition/episode-pipeline-run:1"

THROTTLED = ClientError(
    {
        "Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"},
        "ResponseMetadata": {"HTTPStatusCode": 400, "MaxAttemptsReached": True},
    },
    "RunTask",
)
NO_CAPACITY = {"tasks": [], "failures": [{"reason": "RESOURCE:CPU"}]}


class StubEcs:
    """STUB of the boto3 ECS client: `run_task` raises `error` or returns `response`."""

    def __init__(self, error: Exception | None = None, response: dict | None = None) -> None:
        self.error, self.response = error, response
        self.calls: list[dict[str, Any]] = []

        class Exceptions:  # what dagster-aws catches around run_task
            InvalidParameterException = type("InvalidParameterException", (ClientError,), {})

        self.exceptions = Exceptions

    def run_task(self, **kwargs: Any) -> dict:
        self.calls.append(kwargs)
        if self.error is not None:
            raise self.error
        assert self.response is not None
        return self.response


def queued_run(instance: DagsterInstance, tags: dict[str, str]) -> DagsterRun:
    """A run waiting in the queue, from the code location as the daemon launches it."""
    return create_run_for_test(
        instance,
        job_name=EPISODE_JOB_NAME,
        tags=tags,
        status=DagsterRunStatus.QUEUED,
        remote_job_origin=JOB_ORIGIN,
        job_code_origin=job_origin_for_launch(),
    )


def job_origin_for_launch() -> JobPythonOrigin:
    """The run's code origin: the ECS launcher builds the task's command from it."""
    return JobPythonOrigin(
        EPISODE_JOB_NAME,
        RepositoryPythonOrigin(
            executable_path=sys.executable,
            code_pointer=ModuleCodePointer("episode_pipeline.definitions", "defs", None),
        ),
    )


def dequeue_with_ecs(instance: DagsterInstance, ecs: StubEcs) -> None:
    """One iteration of Dagster's run queue daemon, launching through the ECS run launcher."""
    launcher = instance.run_launcher
    launcher.ecs = ecs
    launcher.task_definition = TASK_DEFINITION
    with create_test_daemon_workspace_context(EmptyWorkspaceTarget(), instance) as workspace:
        list(QueuedRunCoordinatorDaemon(interval_seconds=1).run_iteration(workspace))
