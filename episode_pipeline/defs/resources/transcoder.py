"""Where the FFmpeg work runs: a subprocess of the run or an ECS task, both through Dagster Pipes.

One process per episode: every camera goes to the same `python -m episode_pipeline.transcode`,
which encodes them in parallel. The resource sends it a `TranscodeJob` as Pipes extras and
collects one `TranscodeResult` per camera from its custom messages. The run's
`episode_pipeline/transcoder` tag (set by the uploads sensor, `transcode.placement`) chooses,
else the resource's `mode`:

- `subprocess` (the default, on a laptop and on AWS: the run's own task transcodes, so an
  episode pays one cold start): the child is started in its own session with this resource's
  AWS endpoint and keys (so it reaches the same S3); past the step's deadline it gets SIGTERM
  (it kills its FFmpegs and exits), then SIGKILL for its whole process group;
- `ecs` (large episodes, a second cold start): `PipesECSClient` runs the
  `TRANSCODE_TASK_DEFINITION` task on `ECS_CLUSTER` (Fargate, private subnets, no public IP),
  sized to the episode (`task_size`), and reads the Pipes messages from the container's
  CloudWatch log stream (the task definition's `awslogs` driver with a stream prefix); past the
  deadline the task is stopped (`StopTask`).

Either way a late transcode is reported with the cameras it finished; the rest are not the
videos' fault (the process died, was stopped or ran past the whole transcode's deadline, or ECS
refused the task): `hls_renditions` fails the step for them, to be retried
(`step_retries`, `step_retry_seconds`), and removes nothing.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import botocore.exceptions
from dagster import (
    AssetExecutionContext,
    PipesTempFileContextInjector,
    PipesTempFileMessageReader,
    open_pipes_session,
)
from pydantic import Field

from episode_pipeline.config.settings import (
    SUBPROCESS,
    S3Deadlines,
    Settings,
    TranscodeSettings,
    VideoSettings,
)
from episode_pipeline.defs.resources.aws import AwsResource, aws_fields
from episode_pipeline.defs.resources.settings_fields import SettingsFields, settings_resource
from episode_pipeline.instance.run_tags import TRANSCODER_TAG, transcoder_of
from episode_pipeline.storage.aws import aws_client, aws_fault
from episode_pipeline.transcode.job import (
    TaskSize,
    TranscodeDeadlineExceeded,
    TranscodeJob,
    TranscodeOutcome,
    find_results,
    step_deadline,
    task_size,
)
from episode_pipeline.video.process import terminate_group

TRANSCODE_MODULE = "episode_pipeline.transcode"


def messages_only_cloudwatch_reader(logs_client: Any) -> Any:
    """A CloudWatch Pipes message reader that does not also tail the container's raw log, and
    keeps the session's message handler so a stopped task's finished cameras are not lost.

    dagster-aws 0.29.27's `PipesCloudWatchLogReader` (which `PipesECSClient` adds per container
    to echo its output) loops on GetLogEvents without sleeping and only checks that the session
    closed after a *new* event arrives: after the task ends it polls CloudWatch for the rest of the
    run worker's life, one thread per transcode. The Pipes messages (logs, the results) still
    arrive through the message reader; the raw output stays in the task's CloudWatch log group.
    """
    # Imported here: dagster_aws.pipes takes seconds to import and only ECS mode uses it.
    from dagster_aws.pipes import PipesCloudWatchMessageReader

    class MessagesOnlyCloudWatchReader(PipesCloudWatchMessageReader):
        handler: Any = None

        def add_log_reader(self, log_reader: Any) -> None:
            return None

        @contextmanager
        def read_messages(self, handler: Any) -> Iterator[Any]:
            self.handler = handler
            with super().read_messages(handler) as params:
                yield params

    return MessagesOnlyCloudWatchReader(client=logs_client)


class TaskRecordingEcs:
    """The ECS client `PipesECSClient` is given, remembering the tasks it starts.

    The step's deadline is the `tasks_stopped` waiter's MaxAttempts x Delay. When the waiter gives
    up, the task must be stopped (it would otherwise run on, unwatched and billed); this is how
    the step knows its ARN without reaching into the Pipes client.
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self.task_arns: list[str] = []

    def run_task(self, **kwargs: Any) -> Any:
        response = self._client.run_task(**kwargs)
        self.task_arns += [task["taskArn"] for task in response.get("tasks", [])]
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


_TRANSCODE = SettingsFields(TranscodeSettings)
# What the transcode program makes of each camera (`TranscodeSettings.video`).
_VIDEO = SettingsFields(VideoSettings)


class HlsTranscoder(settings_resource(_TRANSCODE, _VIDEO, base=AwsResource)):
    """Runs one episode's transcode as an external process and returns its cameras' results.

    Its fields: every `TranscodeSettings` and `VideoSettings` setting, and the three below,
    which no variable sets.
    """

    mode: Literal["subprocess", "ecs"] = Field(
        default=SUBPROCESS,
        description="Where a run without the `episode_pipeline/transcoder` tag transcodes: "
        "`subprocess` (in the run's own task) or `ecs` (a transcode task of its own).",
    )
    python_executable: str | None = Field(
        default=None, description="subprocess mode: the interpreter (default: this one)."
    )
    poll_seconds: int = Field(default=6, description="ecs mode: seconds between task polls.")

    @classmethod
    def from_settings(cls, settings: Settings) -> HlsTranscoder:
        """A subprocess by default; the ECS task is available when TRANSCODE_TASK_DEFINITION is
        set (production), for the runs whose tag asks for it."""
        transcode = settings.transcode
        return cls(
            **_TRANSCODE.values(transcode),
            **_VIDEO.values(transcode.video),
            **aws_fields(settings.aws),
        )

    def video(self) -> VideoSettings:
        return _VIDEO.read(self)

    def job(
        self, bucket: str, cameras: Sequence[Any], s3_deadlines: S3Deadlines | None = None
    ) -> TranscodeJob:
        return TranscodeJob(
            bucket=bucket,
            cameras=list(cameras),
            video=self.video(),
            s3_deadlines=s3_deadlines or S3Deadlines(),
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

    def run_task_params(self, size: TaskSize | None = None) -> dict[str, Any]:
        """The `run_task` request for one transcode (PipesECSClient adds env and tags)."""
        if not self.task_definition or not self.ecs_cluster or not self.ecs_subnets:
            raise RuntimeError(
                "the ECS transcode (mode 'ecs' or run tag "
                f"{TRANSCODER_TAG}=ecs) needs task_definition, ecs_cluster and ecs_subnets "
                "(TRANSCODE_TASK_DEFINITION, ECS_CLUSTER, ECS_SUBNETS)"
            )
        network: dict[str, Any] = {"subnets": self.ecs_subnets, "assignPublicIp": "DISABLED"}
        if self.ecs_security_groups:
            network["securityGroups"] = self.ecs_security_groups
        overrides: dict[str, Any] = {"containerOverrides": [{"name": self.container_name}]}
        if size is not None:  # Fargate takes a task-level size that differs from the definition's
            overrides |= {"cpu": str(size.cpu), "memory": str(size.memory)}
        return {
            "cluster": self.ecs_cluster,
            "taskDefinition": self.task_definition,
            "launchType": "FARGATE",
            "count": 1,
            "networkConfiguration": {"awsvpcConfiguration": network},
            "overrides": overrides,
        }

    def _run_subprocess(
        self, context: AssetExecutionContext, extras: dict[str, Any], deadline: float
    ) -> tuple[Sequence[Any], BaseException | str | None]:
        """The child in its own session; past `deadline` its whole process group is killed."""
        command = [self.python_executable or sys.executable, "-m", TRANSCODE_MODULE]
        error = None
        with open_pipes_session(
            context=context,
            context_injector=PipesTempFileContextInjector(),
            message_reader=PipesTempFileMessageReader(),
            extras=extras,
        ) as session:
            # The child reaches the same S3 as this resource, whatever this process's environment.
            env = {**os.environ, **self.aws_settings().to_env(), **session.get_bootstrap_env_vars()}
            process = subprocess.Popen(command, env=env, start_new_session=True)
            try:
                code = process.wait(timeout=deadline)
                if code != 0:
                    error = f"the transcode process exited {code}"
            except subprocess.TimeoutExpired:
                terminate_group(process)
                error = str(
                    TranscodeDeadlineExceeded(
                        f"the transcode process ran past its deadline of {deadline:g} s and was "
                        "killed"
                    )
                )
            except BaseException:  # interrupted (run cancelled): no transcode outlives its run
                terminate_group(process)
                raise
        return session.get_custom_messages(), error

    def _run_ecs(
        self,
        context: AssetExecutionContext,
        extras: dict[str, Any],
        deadline: float,
        size: TaskSize,
    ) -> tuple[Sequence[Any], BaseException | str | None]:
        # Imported here: dagster_aws.pipes takes seconds to import and only ECS mode uses it.
        from dagster_aws.pipes import PipesECSClient
        from dagster_aws.pipes.clients.ecs import WaiterConfig

        # A new reader per task: the CloudWatch reader keeps per-session state (stream, start).
        reader = messages_only_cloudwatch_reader(self.logs_client())
        ecs = TaskRecordingEcs(self.ecs_client())
        # startedBy: the ECS console shows which Dagster run a transcode task belongs to.
        params = {**self.run_task_params(size), "startedBy": f"dagster-run/{context.run.run_id}"}
        attempts = max(1, math.ceil(deadline / self.poll_seconds))
        try:
            invocation = PipesECSClient(client=ecs, message_reader=reader).run(
                context=context,
                run_task_params=params,  # type: ignore[arg-type]
                extras=extras,
                pipes_container_name=self.container_name,
                waiter_config=WaiterConfig(Delay=self.poll_seconds, MaxAttempts=attempts),
            )
        except Exception as error:  # the task failed, was stopped or ran past its deadline
            messages = reader.handler.get_custom_messages() if reader.handler else []
            if isinstance(error, botocore.exceptions.WaiterError):
                reason = f"transcode deadline of {deadline:g} s passed"
                for arn in ecs.task_arns:
                    ecs.stop_task(cluster=params["cluster"], task=arn, reason=reason)
                error = TranscodeDeadlineExceeded(
                    f"ECS task {', '.join(ecs.task_arns)} ran past its deadline of {deadline:g} s "
                    f"and was stopped ({error})"
                )
            return messages, error
        return invocation.get_custom_messages(), None

    def transcode(
        self,
        context: AssetExecutionContext,
        job: TranscodeJob,
        episode_seconds: float | None = None,
    ) -> TranscodeOutcome:
        """Run the episode's job in the configured place, within its deadline.

        Never raises for the process's sake: a camera the process did not report is missing
        from `results`, and `error` says why.
        """
        cameras = len(job.cameras)
        deadline = step_deadline(self.deadline_seconds, self.video(), cameras, episode_seconds)
        mode = transcoder_of(context.run.tags, self.mode)
        outcome = TranscodeOutcome(deadline_seconds=deadline, mode=mode)
        if mode == SUBPROCESS:
            messages, error = self._run_subprocess(context, job.to_extras(), deadline)
        else:
            outcome.task_size = task_size(cameras, self.max_vcpu)
            messages, error = self._run_ecs(context, job.to_extras(), deadline, outcome.task_size)
        outcome.results = find_results(list(messages))
        missing = [c.camera for c in job.cameras if c.camera not in outcome.results]
        fault = aws_fault(error) if isinstance(error, BaseException) else None
        if fault is not None:  # ECS refused the task (throttled, no capacity), or CloudWatch
            outcome.error_code, outcome.retry_after_seconds = fault.code, fault.retry_after_seconds
            error = f"{error} [{fault.describe()}]"
        if error or missing:
            outcome.error = (
                str(error)
                if error
                else (
                    f"the transcode ({mode}) ended without reporting camera(s) {', '.join(missing)}"
                )
            )
        return outcome
