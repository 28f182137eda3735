"""The two images, built with podman and run as production runs them, against the local stack.

`scripts/build-images.sh` (`make image`) builds the Dockerfile's `run` and `webserver` targets
once per session, on production's base where a registry is reachable, else on its stand-in made
from Debian's packages (the output says which, and these tests check it says so). Then:

- the run image's default command (the code server) answers gRPC and serves the definitions;
- one episode's run executes in the run image as `EcsRunLauncher` starts it: the run is created
  in the local instance from the code server's job, the launcher's `run_task` goes to moto's
  ECS, and its container (`dagster api execute_run ...`, the launcher's command) ends with the
  episode `processed` in PostgreSQL, its transcode done by the image's FFmpeg;
- the transcode task's command (`python -m episode_pipeline.transcode`, infra/ecs.tf) runs
  under Pipes in the run image, started by `PipesECSClient`, its messages read back from
  CloudWatch Logs;
- the dlq task's command (`episode-pipeline dlq list`) lists a dead letter;
- the webserver image's command serves `/server_info` and the code server's jobs.

What differs from ECS, and why: moto's ECS never runs a container, so `PodmanEcs` (the fake of
test_hls.py with podman in place of a local process) starts each task's container from the
image with the task's environment and command. Containers share the host's network, to reach the
stack on 127.0.0.1; so the code server and the webserver get free ports instead of 4000 and 3000
(other processes here may hold those), the rest of their default commands as the image has them.
The tasks' environment is the stack's (database, S3/SQS endpoint and keys; `DB_HOST` set, so the
production settings path), and DAGSTER_HOME is a folder holding the local instance's dagster.yaml,
mounted at its own path (the serialized instance names it), where production's dagster.yaml names
RDS, ECS and S3 compute logs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from dagster import DagsterInstance, DagsterRunStatus

from episode_pipeline.definitions import build_definitions
from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME
from episode_pipeline.instance.run_tags import EPISODE_JOB_NAME
from episode_pipeline.local import aws_setup
from episode_pipeline.local.upload import upload_episode
from episode_pipeline.orchestration import upload_runs
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.uploads.upload_queue import UploadQueue
from episode_pipeline_tests import test_hls
from episode_pipeline_tests.dagster_ui import REPOSITORIES_QUERY, DagsterDev, free_port
from episode_pipeline_tests.leftovers import session_env
from episode_pipeline_tests.support import in_ci, new_ref
from episode_pipeline_tests.support.dagster_internals import (
    PARTITION_NAME_TAG,
    GrpcServerCodeLocationOrigin,
    LaunchRunContext,
)
from episode_pipeline_tests.support.deploy import ROOT
from episode_pipeline_tests.test_hls import (
    ECS_TASK_TAGS,
    LocalContainerEcs,
    ecs_transcoder,
    register_fargate_task,
    run_hls,
    run_launcher,
    wait_for_run,
)

BUILD_DEADLINE_SECONDS = 2400  # a cold build downloads every wheel; a cached one takes seconds

# test_hls.py's module fixture: moto's cluster, log group and the transcode task definition.
moto_ecs = test_hls.ecs_setup

# One worker builds the images once for all of this module's tests (all slow: the longest first).
# The first test's set-up builds the images, which may take longer than the suite's timeout.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.xdist_group("test_images.py"),
    pytest.mark.timeout(BUILD_DEADLINE_SECONDS + 600),
]

BUILD_SCRIPT = ROOT / "scripts" / "build-images.sh"
CONTAINERS_CONF = os.environ.get("CONTAINERS_CONF") or str(ROOT / "scripts" / "containers.conf")
PODMAN_SECONDS = 120
STARTUP_SECONDS = 180
IMAGE_USER = "10001:10001"  # the Dockerfile's USER: mounted folders are given to it
IMAGE_LINE = re.compile(r"^build-images: image (\S+):(run|webserver): (\d+) MiB, base (\S+)$", re.M)


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": CONTAINERS_CONF}


def podman(*args: str, timeout: float = PODMAN_SECONDS) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args],
        env=podman_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclass(frozen=True)
class Images:
    run: str
    webserver: str
    base: str
    mib: dict[str, int]
    output: str
    seconds: float


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Images:
    """Both targets, built by `make image`'s script (its layer cache makes a rebuild quick);
    its output goes to a log as it comes, for a build that runs long."""
    if shutil.which("podman") is None:
        reason = "podman is not installed (scripts/bootstrap.sh installs it with apt)"
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    log = tmp_path_factory.mktemp("build-images") / "build-images.log"
    started = time.monotonic()
    with log.open("wb") as out:
        build = subprocess.Popen(
            ["bash", str(BUILD_SCRIPT)],
            cwd=ROOT,
            env=podman_env(),
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
        try:
            returncode = build.wait(timeout=BUILD_DEADLINE_SECONDS)
        finally:
            if build.poll() is None:  # past the deadline: the script and its podman builds
                os.killpg(build.pid, signal.SIGKILL)
                build.wait()
    output = log.read_text(errors="replace")
    assert returncode == 0, f"{BUILD_SCRIPT.name} failed (log {log}):\n{output[-5000:]}"
    built = {
        target: (name, int(mib), base) for name, target, mib, base in IMAGE_LINE.findall(output)
    }
    assert set(built) == {"run", "webserver"}, output[-3000:]
    (base,) = {base for _, _, base in built.values()}
    return Images(
        run=f"{built['run'][0]}:run",
        webserver=f"{built['webserver'][0]}:webserver",
        base=base,
        mib={target: mib for target, (_, mib, _) in built.items()},
        output=output,
        seconds=time.monotonic() - started,
    )


def inspect(image: str, template: str) -> Any:
    result = podman("image", "inspect", "--format", template, image)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def default_command(image: str, port: int) -> list[str]:
    """The image's CMD with its `-p` port changed to `port` (the host's network is shared)."""
    command = list(inspect(image, "{{json .Config.Cmd}}"))
    command[command.index("-p") + 1] = str(port)
    return command


def ecs_command(task: str) -> list[str]:
    """The `command` infra/ecs.tf gives the task family `task` (a one-line list)."""
    text = (ROOT / "infra" / "ecs.tf").read_text()
    block = re.search(rf"^\s+{re.escape(task)} = \{{\n(.*?)^\s+\}}\n", text, re.M | re.S)
    assert block, f"infra/ecs.tf: no task {task}"
    command = re.search(r"command = (\[[^\]]*\])", block.group(1))
    assert command, f"infra/ecs.tf: task {task} has no command"
    return json.loads(command.group(1))


@pytest.fixture(scope="module")
def dagster_home(stack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The local instance's dagster.yaml in a folder of its own, which the image's user may
    write (compute logs), mounted into every container at the same path."""
    home = tmp_path_factory.mktemp("image-dagster-home")
    shutil.copy(Path(stack.dagster_home) / "dagster.yaml", home / "dagster.yaml")
    (home / "storage").mkdir()
    uid, gid = (int(part) for part in IMAGE_USER.split(":"))
    for path in (home, home / "storage", home / "dagster.yaml"):
        os.chown(path, uid, gid)
    return home


def task_env(stack, home: Path, **overrides: str) -> dict[str, str]:
    """What infra/ecs.tf gives every task, with the stack's values: the database, the S3/SQS
    endpoint and keys, the queues, the bucket; DAGSTER_HOME the mounted local instance."""
    return {**stack.env, "DAGSTER_HOME": str(home), **overrides}


def env_flags(env: dict[str, str]) -> list[str]:
    return [flag for name, value in env.items() for flag in ("-e", f"{name}={value}")]


def mount_flags(*folders: Path) -> list[str]:
    return [flag for folder in folders for flag in ("-v", f"{folder}:{folder}")]


@dataclass
class Container:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def running(
    image: str, command: list[str], env: dict[str, str], log: Path, *folders: Path
) -> Iterator[Container]:
    """A container of `image` running `command` on the host's network, its output in `log`;
    killed and removed at the end."""
    name = f"episode-pipeline-test-{uuid.uuid4().hex[:8]}"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                *("podman", "run", "--rm", "--name", name, "--network", "host"),
                *env_flags({**env, **session_env()}),
                *mount_flags(*folders),
                image,
                *command,
            ],
            env=podman_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield Container(name, process, log)
    finally:
        podman("kill", name)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=PODMAN_SECONDS)
        podman("rm", "--force", "--ignore", name)


class PodmanEcs(LocalContainerEcs):
    """moto's ECS, whose tasks' containers podman starts from `image`: the task definition's
    environment and the overrides' (command, Pipes variables), on the host's network, with
    `folders` mounted. `stop_task` kills the container as Fargate would."""

    def __init__(self, ecs: Any, logs: Any, image: str, *folders: Path) -> None:
        super().__init__(ecs, logs)
        self.image = image
        self.folders = folders

    @staticmethod
    def container_name(scratch: str) -> str:
        return f"episode-pipeline-{Path(scratch).name}"

    def start_container(self, command: list[str], env: dict[str, str]) -> subprocess.Popen:
        # PATH, HOME and TMPDIR are the image's own, not this machine's.
        task = {k: v for k, v in env.items() if k not in {"PATH", "HOME", "TMPDIR"}}
        return subprocess.Popen(
            [
                *("podman", "run", "--rm", "--name", self.container_name(env["TMPDIR"])),
                *("--network", "host", *env_flags(task), *mount_flags(*self.folders)),
                self.image,
                *command,
            ],
            env=podman_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def stop_task(self, **kwargs: Any) -> Any:
        scratch = self._tasks[kwargs["task"]].scratch
        if scratch is not None:
            podman("kill", self.container_name(str(scratch)))
        return super().stop_task(**kwargs)


@dataclass(frozen=True)
class CodeServer:
    container: Container
    port: int

    @property
    def origin(self) -> GrpcServerCodeLocationOrigin:
        return GrpcServerCodeLocationOrigin(
            host="127.0.0.1", port=self.port, location_name="episode_pipeline"
        )


@pytest.fixture(scope="module")
def code_server(
    images: Images, stack, dagster_home: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CodeServer]:
    """The run image's default command, the code server, up once its ECS health check (the
    image's `dagster api grpc-health-check`, infra/ecs.tf) passes."""
    port = free_port()
    log = tmp_path_factory.mktemp("code-server") / "code-server.log"
    command = default_command(images.run, port)
    with running(images.run, command, task_env(stack, dagster_home), log, dagster_home) as server:
        deadline = time.monotonic() + STARTUP_SECONDS
        check = ["dagster", "api", "grpc-health-check", "-p", str(port)]
        while podman("exec", server.name, *check).returncode != 0:
            assert server.process.poll() is None, f"the code server exited:\n{server.tail()}"
            assert time.monotonic() < deadline, f"no healthy code server:\n{server.tail()}"
            time.sleep(2)
        yield CodeServer(server, port)


@pytest.mark.slow(seconds=360)  # the images' build, its setup: 357 s on 2 cores
def test_both_targets_build_on_the_base_the_output_names(images: Images) -> None:
    """Cold, the build downloads every wheel (minutes); with podman's layer cache, seconds."""
    production_base = re.search(r"^ARG BASE=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M)
    assert production_base
    if images.base != production_base.group(1):
        assert f"base: {images.base} -- A STAND-IN, NOT PRODUCTION'S BASE" in images.output
        assert production_base.group(1) in images.output  # what it stands in for
    for image in (images.run, images.webserver):
        assert inspect(image, "{{json .Config.Labels}}")["episode-pipeline.base"] == images.base
        assert inspect(image, "{{json .Config.User}}") == IMAGE_USER
    # The UI is in the webserver image only; both run Python 3.11 from /opt/venv.
    probe = (
        "import importlib.util, sys; print(sys.version_info[:2], sys.prefix, "
        "importlib.util.find_spec('dagster_webserver') is not None)"
    )
    outputs = {}
    for target, image in (("run", images.run), ("webserver", images.webserver)):
        result = podman("run", "--rm", image, "python", "-c", probe)
        assert result.returncode == 0, result.stderr
        outputs[target] = result.stdout.strip()
    assert outputs == {"run": "(3, 11) /opt/venv False", "webserver": "(3, 11) /opt/venv True"}


@pytest.mark.slow(seconds=40)
def test_the_code_server_answers_grpc_and_serves_the_definitions(code_server: CodeServer) -> None:
    with (
        DagsterInstance.ephemeral() as instance,
        code_server.origin.create_location(instance) as location,
    ):
        repository = location.get_repository("__repository__")
        job = repository.get_full_job(EPISODE_JOB_NAME)
        sensors = {sensor.name for sensor in repository.get_sensors()}
        origin = job.get_python_origin()
    assert {"episode_uploads", "waiting_uploads"} <= sensors, sensors
    assert origin.executable_path == "/opt/venv/bin/python"  # the image's, not this machine's
    assert origin.repository_origin.code_pointer.module == "episode_pipeline.definitions"


@pytest.mark.slow(seconds=120)
def test_an_episode_run_executes_in_the_run_image_as_ecs_run_launcher_starts_it(
    tmp_path, stack, settings, db_conn, images, code_server, dagster_home, moto_ecs, record_property
) -> None:
    name = f"image-run-{uuid.uuid4().hex[:8]}"
    resources = aws_setup.ensure_resources(stack.s3_endpoint, bucket=name, queue_name=name)
    own = replace(settings, bucket=resources.bucket, sqs_queue_url=resources.queue_url)
    ref = new_ref()
    archive = tmp_path / "in-the-image.tar.zst"
    write_sample(archive, SampleSpec(codebase_version="v3.0", cameras=1, seconds=1.0))
    upload_episode(archive, ref, own)  # the row, 'uploaded', and the upload's S3 event
    family = f"{moto_ecs['env']['ECS_CLUSTER']}-image-run"
    environment = task_env(
        stack, dagster_home, DATA_BUCKET=own.bucket, SQS_QUEUE_URL=resources.queue_url
    )
    register_fargate_task(moto_ecs["ecs"], family, "run", environment, moto_ecs["log_group"])

    with DagsterInstance.from_config(str(dagster_home)) as instance:
        context = SimpleNamespace(instance=instance, log=logging.getLogger("episode_uploads"))
        queue = UploadQueue(resources.queue_url, own.aws)
        bucket = Bucket(resources.bucket, own.aws)
        (request,) = upload_runs.evaluate_uploads(context, queue, bucket).run_requests  # type: ignore[arg-type]
        instance.add_dynamic_partitions(EPISODES_PARTITION_NAME, [request.partition_key])
        # As the daemon does: the job (and its origin, the image's Python) from the code server.
        with code_server.origin.create_location(instance) as location:
            remote_job = location.get_repository("__repository__").get_full_job(EPISODE_JOB_NAME)
            run = instance.create_run_for_job(
                job_def=build_definitions(own).resolve_job_def(EPISODE_JOB_NAME),
                tags={**request.tags, PARTITION_NAME_TAG: request.partition_key},
                remote_job_origin=remote_job.get_remote_origin(),
                job_code_origin=remote_job.get_python_origin(),
                status=DagsterRunStatus.NOT_STARTED,
            )
        fake = PodmanEcs(moto_ecs["ecs"], moto_ecs["logs"], images.run, dagster_home)
        launcher = run_launcher(moto_ecs, family, fake)
        launcher.register_instance(instance)
        started = time.monotonic()
        launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
        try:
            finished = wait_for_run(instance, run.run_id)
        finally:
            fake.finish()
        seconds = time.monotonic() - started
        (task,) = fake._tasks.values()
        assert finished.status == DagsterRunStatus.SUCCESS, "".join(task.output[-60:])
        (materialization,) = [
            event.asset_materialization
            for event in instance.all_logs(run.run_id)
            if event.asset_materialization
            and event.asset_materialization.asset_key.to_user_string() == "hls_renditions"
        ]
    record_property("in_container_run_seconds", round(seconds, 1))
    print(f"the episode's run in the run image took {seconds:.1f} s from launch to success")

    (launched,) = fake.run_task_requests
    (override,) = launched["overrides"]["containerOverrides"]
    assert override["command"][:3] == ["dagster", "api", "execute_run"]
    status = db_conn.execute(
        "SELECT status FROM episodes WHERE org_id = %s AND id = %s", (ref.org_id, ref.episode_id)
    ).fetchone()
    assert status == ("processed",)
    # Its transcode ran in the same container: the image's transcode program and FFmpeg.
    metadata = {k: v.value for k, v in materialization.metadata.items()}
    assert metadata["transcoder"] == "subprocess"
    assert metadata["failed_videos"] == []


@pytest.mark.slow(seconds=60)
def test_the_transcode_task_runs_in_the_run_image_under_pipes(
    tmp_path, settings, images, moto_ecs
) -> None:
    """The transcode task as PipesECSClient starts it (ECS_TASK_TAGS), two cameras."""
    fake = PodmanEcs(moto_ecs["ecs"], moto_ecs["logs"], images.run)
    ref = new_ref()
    archive = tmp_path / "transcode-task.tar.zst"
    write_sample(archive, SampleSpec(codebase_version="v3.0", cameras=2, seconds=1.0))
    upload_episode(archive, ref)
    with DagsterInstance.ephemeral() as instance:
        try:
            run = run_hls(
                instance, settings, ref, ecs_transcoder(settings, moto_ecs, fake), ECS_TASK_TAGS
            )
        finally:
            fake.finish()
    (task,) = fake._tasks.values()
    assert run.metadata["transcoder"] == "ecs", "".join(task.output[-60:])
    assert run.metadata["failed_videos"] == [], "".join(task.output[-60:])
    assert len(run.cameras()) == 2
    assert all(check.passed for check in run.checks.values())
    definition = moto_ecs["ecs"].describe_task_definition(
        taskDefinition=moto_ecs["env"]["TRANSCODE_TASK_DEFINITION"]
    )
    (container,) = definition["taskDefinition"]["containerDefinitions"]
    assert container["command"] == ecs_command("transcode")


@pytest.mark.slow(seconds=30)
def test_the_dlq_task_lists_a_dead_letter_in_the_run_image(
    tmp_path, stack, sqs_client, s3_client, images, dagster_home
) -> None:
    name = f"image-dlq-{uuid.uuid4().hex[:8]}"
    resources = aws_setup.ensure_resources(stack.s3_endpoint, bucket=name, queue_name=name)
    ref = new_ref()
    key = f"{ref.prefix}dead.tar.zst"
    s3_client.put_object(Bucket=name, Key=key, Body=b"never read")
    # The upload's S3 event (after the bucket's s3:TestEvent), moved to the dead-letter queue
    # as three failed receives would move it.
    deadline = time.monotonic() + 60
    event = None
    while event is None:
        assert time.monotonic() < deadline, f"no S3 event for {key} on {resources.queue_url}"
        received = sqs_client.receive_message(
            QueueUrl=resources.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1
        )
        for message in received.get("Messages", []):
            sqs_client.delete_message(
                QueueUrl=resources.queue_url, ReceiptHandle=message["ReceiptHandle"]
            )
            if ref.episode_id in message["Body"]:  # the event's key is URL-encoded
                event = message["Body"]
    sqs_client.send_message(QueueUrl=resources.dlq_url, MessageBody=event)

    env = task_env(
        stack, dagster_home, SQS_QUEUE_URL=resources.queue_url, SQS_DLQ_URL=resources.dlq_url
    )
    result = podman(
        "run", "--rm", "--network", "host", *env_flags({**env, **session_env()}),
        *mount_flags(dagster_home), images.run, *ecs_command("dlq"),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert ref.partition_key in result.stdout, result.stdout
    assert key in result.stdout, result.stdout


@pytest.mark.slow(seconds=60)
def test_the_webserver_image_serves_server_info_and_the_code_servers_jobs(
    tmp_path, stack, images, code_server, dagster_home
) -> None:
    port = free_port()
    env = task_env(
        stack,
        dagster_home,
        DAGSTER_CODE_SERVER_HOST="127.0.0.1",
        DAGSTER_CODE_SERVER_PORT=str(code_server.port),
    )
    command = default_command(images.webserver, port)
    log = tmp_path / "webserver.log"
    with running(images.webserver, command, env, log, dagster_home) as webserver:
        ui = DagsterDev(webserver.process, port, log)  # type: ignore[arg-type]
        ui.wait_until_up()
        repositories = ui.graphql(REPOSITORIES_QUERY)["repositoriesOrError"]
    assert repositories["__typename"] == "RepositoryConnection", repositories
    jobs = {job["name"] for node in repositories["nodes"] for job in node["jobs"]}
    assert EPISODE_JOB_NAME in jobs
    assert {node["location"]["name"] for node in repositories["nodes"]} == {"episode_pipeline"}
