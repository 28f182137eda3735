"""Launch failures from the real path: production's run launcher (`dagster_aws.ecs.EcsRunLauncher`,
as dagster.yaml configures it) driven by Dagster's own run queue daemon, with its ECS client
replaced by a STUB, the one part that cannot run here: ECS (and moto) never throttle RunTask or
run out of capacity on demand. The stub answers `RunTask` as ECS does in those cases: botocore's
`ClientError` for a `ThrottlingException` once boto3's retries ran out, or a response with no task
and a `failures` entry (`RESOURCE:CPU`), which dagster-aws turns into its own exception.

`RefusingEcsRunLauncher` is the same launcher for a real `dagster-daemon` (its instance's
dagster.yaml names it, `ecs_refusing_launcher`): a listed org's runs are refused that way, and
every other run (a retry run_retries made, another org's) is handed to the local instance's
launcher, a worker process of the code server that runs it for real
(test_campaign_daemon_faults.py).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from botocore.exceptions import ClientError
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, Field, Permissive
from dagster_aws.ecs import EcsRunLauncher

from episode_pipeline.instance.run_launcher import LocalRunLauncher
from episode_pipeline.instance.run_tags import EPISODE_JOB_NAME, ORG_TAG
from episode_pipeline_tests.support.dagster_internals import (
    PARENT_RUN_ID_TAG,
    CheckRunHealthResult,
    EmptyWorkspaceTarget,
    JobPythonOrigin,
    LaunchRunContext,
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


# What RunTask answers a refused launch, by name (`RefusingEcsRunLauncher`'s `refuse`).
REFUSALS = {"throttled": {"error": THROTTLED}, "no_capacity": {"response": NO_CAPACITY}}


class RefusingEcsRunLauncher(EcsRunLauncher):
    """Production's `EcsRunLauncher` whose ECS client is a STUB (ECS never refuses on demand):
    a run of an org in `refuse` (`{org: "throttled" | "no_capacity"}`), unless it is a retry
    run_retries made, goes through dagster-aws's whole launch, RunTask answering as `REFUSALS`
    names, and raises as it would in production. Every other run is launched by the local
    instance's launcher (`LocalRunLauncher`), which also answers run monitoring for it."""

    def __init__(self, inst_data: Any = None, refuse: dict[str, str] | None = None, **config: Any):
        super().__init__(inst_data=inst_data, **config)
        self.task_definition = TASK_DEFINITION  # set after: the config's would be described
        self.refuse = {org: REFUSALS[kind] for org, kind in (refuse or {}).items()}
        self.local = LocalRunLauncher()
        self._lock = threading.Lock()  # the run queue launches from its worker threads

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {**super().config_type(), "refuse": Field(Permissive(), is_required=False)}

    def register_instance(self, instance: DagsterInstance) -> None:
        super().register_instance(instance)
        self.local.register_instance(instance)

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        answer = self.refuse.get(run.tags.get(ORG_TAG, ""))
        if answer is None or PARENT_RUN_ID_TAG in run.tags:
            self.local.launch_run(context)
            return
        with self._lock:  # `self.ecs` is the launcher's one client
            self.ecs = StubEcs(**answer)
            super().launch_run(context)

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        return self.local.check_run_worker_health(run)

    def terminate(self, run_id: str) -> bool:
        return self.local.terminate(run_id)

    @property
    def supports_resume_run(self) -> bool:
        return False


# The run launcher of a daemon whose ECS refuses the runs of each org in `refuse` (not retries).
def ecs_refusing_launcher(refuse: dict[str, str]) -> dict[str, Any]:
    return {
        "module": __name__,
        "class": RefusingEcsRunLauncher.__name__,
        "config": {**ECS_RUN_LAUNCHER["config"], "refuse": refuse},
    }
