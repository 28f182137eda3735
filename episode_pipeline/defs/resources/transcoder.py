"""Where the FFmpeg work runs: a local subprocess or an ECS task, both through Dagster Pipes.

The run worker stays small (1 vCPU / 2 GB) while the transcode gets its own task (2 vCPU / 4 GB,
infra/ecs.tf). Both modes run the same program, `python -m episode_pipeline.transcode`, send it a
`TranscodeJob` as Pipes extras and get its `TranscodeResult` back as a custom message:

- `subprocess` (laptop, tests): `PipesSubprocessClient`; the child is given this resource's AWS
  endpoint and keys, so it reaches the same S3;
- `ecs` (production): `PipesECSClient` runs the `TRANSCODE_TASK_DEFINITION` task on
  `ECS_CLUSTER` (Fargate, private subnets, no public IP) and reads the Pipes messages from the
  container's CloudWatch log stream (the task definition's `awslogs` driver with a stream prefix).
"""

from __future__ import annotations

import sys
from typing import Any, Literal

from dagster import AssetExecutionContext, PipesSubprocessClient
from pydantic import Field

from episode_pipeline.aws import aws_client
from episode_pipeline.defs.resources.aws import AwsResource, aws_fields
from episode_pipeline.settings import DEFAULT_PRESET, SUBPROCESS, Settings
from episode_pipeline.transcode.job import TranscodeJob, TranscodeResult, find_result

TRANSCODE_MODULE = "episode_pipeline.transcode"


def messages_only_cloudwatch_reader(logs_client: Any) -> Any:
    """A CloudWatch Pipes message reader that does not also tail the container's raw log.

    dagster-aws 0.29.27's `PipesCloudWatchLogReader` (which `PipesECSClient` adds per container
    to echo its output) loops on GetLogEvents without sleeping and only checks that the session
    closed after a *new* event arrives: after the task ends it polls CloudWatch for the rest of the
    run worker's life, one thread per transcode. The Pipes messages (logs, the result) still
    arrive through the message reader; the raw output stays in the task's CloudWatch log group.
    """
    from dagster_aws.pipes import PipesCloudWatchMessageReader

    class MessagesOnlyCloudWatchReader(PipesCloudWatchMessageReader):
        def add_log_reader(self, log_reader: Any) -> None:
            return None

    return MessagesOnlyCloudWatchReader(client=logs_client)


class TranscodeFailed(RuntimeError):
    """The external process ended without reporting a result."""


class HlsTranscoder(AwsResource):
    """Runs one camera's transcode as an external process and returns its result."""

    mode: Literal["subprocess", "ecs"] = Field(
        default=SUBPROCESS, description="`subprocess` locally, `ecs` in production."
    )
    python_executable: str | None = Field(
        default=None, description="subprocess mode: the interpreter (default: this one)."
    )
    ecs_cluster: str | None = Field(default=None, description="ECS_CLUSTER")
    ecs_subnets: list[str] = Field(default_factory=list, description="ECS_SUBNETS")
    ecs_security_groups: list[str] = Field(default_factory=list, description="ECS_SECURITY_GROUPS")
    task_definition: str | None = Field(default=None, description="TRANSCODE_TASK_DEFINITION")
    container_name: str = Field(default="transcode", description="TRANSCODE_CONTAINER_NAME")
    poll_seconds: int = Field(default=6, description="ecs mode: seconds between task polls.")
    preset: str = Field(default=DEFAULT_PRESET, description="x264 preset (TRANSCODE_PRESET).")

    @classmethod
    def from_settings(cls, settings: Settings) -> HlsTranscoder:
        """ECS mode when TRANSCODE_TASK_DEFINITION is set (production), else a subprocess."""
        transcode = settings.transcode
        return cls(
            mode=transcode.mode,
            preset=transcode.preset,
            ecs_cluster=transcode.ecs_cluster,
            ecs_subnets=list(transcode.ecs_subnets),
            ecs_security_groups=list(transcode.ecs_security_groups),
            task_definition=transcode.task_definition,
            container_name=transcode.container_name,
            **aws_fields(settings.aws),
        )

    # -- clients (tests override these to play the container) ---------------------------------

    def ecs_client(self) -> Any:
        return aws_client(
            "ecs", self.aws_settings(), retries={"mode": "standard", "max_attempts": 5}
        )

    def logs_client(self) -> Any:
        return aws_client(
            "logs", self.aws_settings(), retries={"mode": "standard", "max_attempts": 5}
        )

    # -- running --------------------------------------------------------------------------------

    def run_task_params(self) -> dict[str, Any]:
        """The `run_task` request for one transcode (PipesECSClient adds env and tags)."""
        if not self.task_definition or not self.ecs_cluster or not self.ecs_subnets:
            raise RuntimeError(
                "HlsTranscoder(mode='ecs') needs task_definition, ecs_cluster and ecs_subnets "
                "(TRANSCODE_TASK_DEFINITION, ECS_CLUSTER, ECS_SUBNETS)"
            )
        network: dict[str, Any] = {"subnets": self.ecs_subnets, "assignPublicIp": "DISABLED"}
        if self.ecs_security_groups:
            network["securityGroups"] = self.ecs_security_groups
        return {
            "cluster": self.ecs_cluster,
            "taskDefinition": self.task_definition,
            "launchType": "FARGATE",
            "count": 1,
            "networkConfiguration": {"awsvpcConfiguration": network},
            "overrides": {"containerOverrides": [{"name": self.container_name}]},
        }

    def _run(self, context: AssetExecutionContext, extras: dict[str, Any]) -> list[Any]:
        if self.mode == SUBPROCESS:
            # The child reaches the same S3 as this resource, whatever this process's environment.
            invocation = PipesSubprocessClient(env=self.aws_settings().to_env()).run(
                context=context,
                command=[self.python_executable or sys.executable, "-m", TRANSCODE_MODULE],
                extras=extras,
            )
            return list(invocation.get_custom_messages())
        from dagster_aws.pipes import PipesECSClient
        from dagster_aws.pipes.clients.ecs import WaiterConfig

        # A new client per task: the CloudWatch reader keeps per-session state (stream, start).
        client = PipesECSClient(
            client=self.ecs_client(),
            message_reader=messages_only_cloudwatch_reader(self.logs_client()),
        )
        invocation = client.run(
            context=context,
            run_task_params=self.run_task_params(),  # type: ignore[arg-type]
            extras=extras,
            pipes_container_name=self.container_name,
            waiter_config=WaiterConfig(Delay=self.poll_seconds, MaxAttempts=24 * 3600),
        )
        return list(invocation.get_custom_messages())

    def transcode(self, context: AssetExecutionContext, job: TranscodeJob) -> TranscodeResult:
        """Run the job in the configured place; raises when the process fails or reports nothing."""
        messages = self._run(context, job.to_extras())
        result = find_result(messages)
        if result is None:
            raise TranscodeFailed(
                f"transcode of camera {job.camera} ({self.mode}) ended without reporting a result"
            )
        return result
