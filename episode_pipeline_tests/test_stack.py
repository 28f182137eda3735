"""The embedded stack: lifecycle, idempotence, production's queue wiring, and the Dagster instance.

Lifecycle tests run on their own stack in a module-scoped home (`own_home`), so stopping and
restarting never disturbs the session stack other tests use. They run in file order and each one
starts the stack first (a no-op when it is already up).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus

import psutil
import pytest

from episode_pipeline.config.env import variables
from episode_pipeline.config.settings import Settings
from episode_pipeline.db.connection import connect
from episode_pipeline.local import aws_setup
from episode_pipeline.local.dagster_home import POOLED_STORAGE_CLASSES, instance_config
from episode_pipeline.local.stack import (
    PortTakenError,
    StackInfo,
    ensure_stack,
    stack_status,
    start_stack,
    stop_stack,
)
from episode_pipeline.local.stack_env import (
    HOME_ENV,
    STACK_STATE_FILE,
    load_settings,
    local_stack_env,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).parents[1]

# What the stack publishes (declared on the settings), and where Dagster's instance is.
CONTRACT_ENV = {v.name for v in variables(Settings) if v.declaration.stack} | {"DAGSTER_HOME"}
CONTRACT_KEYS = {
    "running",
    "s3_endpoint",
    "bucket",
    "sqs_queue_url",
    "dlq_url",
    "database_url",
    "dagster_home",
    "env",
}


# --- the session stack (read-only checks) --------------------------------------------------


def test_state_file_holds_the_contract(stack: StackInfo) -> None:
    state = json.loads((Path(stack.home) / STACK_STATE_FILE).read_text())
    assert set(state) >= CONTRACT_KEYS
    assert set(state["env"]) >= CONTRACT_ENV
    assert state["running"] is True
    assert local_stack_env(Path(stack.home)) == stack.env


def test_load_settings_reaches_the_stack_with_nothing_exported(
    stack: StackInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Other tests' in-process runs export the stack's variables (apply_local_stack_env).
    for name in stack.env:
        if name not in ("DAGSTER_HOME",):
            monkeypatch.delenv(name, raising=False)
    settings = load_settings()
    assert settings.bucket == stack.bucket
    assert settings.sqs_queue_url == stack.sqs_queue_url
    with connect(settings.database) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("episodes",)


def test_services_listen_on_loopback_only(stack: StackInfo) -> None:
    ports = {stack.moto_port, stack.postgres_port}
    listening = [
        c
        for c in psutil.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.laddr.port in ports
    ]
    assert {c.laddr.port for c in listening} == ports
    assert {c.laddr.ip for c in listening} == {"127.0.0.1"}


def test_queue_and_dlq_match_the_contract(stack: StackInfo, sqs_client: Any) -> None:
    queue = sqs_client.get_queue_attributes(QueueUrl=stack.sqs_queue_url, AttributeNames=["All"])
    dlq = sqs_client.get_queue_attributes(QueueUrl=stack.dlq_url, AttributeNames=["All"])
    queue, dlq = queue["Attributes"], dlq["Attributes"]
    assert queue["VisibilityTimeout"] == "900"
    assert queue["MessageRetentionPeriod"] == "345600"
    assert json.loads(queue["RedrivePolicy"]) == {
        "deadLetterTargetArn": dlq["QueueArn"],
        "maxReceiveCount": 3,
    }
    assert dlq["MessageRetentionPeriod"] == "1209600"


def test_bucket_notification_filters_zst_under_orgs(stack: StackInfo, s3_client: Any) -> None:
    config = s3_client.get_bucket_notification_configuration(Bucket=stack.bucket)
    (queue_config,) = config["QueueConfigurations"]
    assert queue_config["Events"] == ["s3:ObjectCreated:*"]
    rules = {r["Name"].lower(): r["Value"] for r in queue_config["Filter"]["Key"]["FilterRules"]}
    assert rules == {"prefix": "orgs/", "suffix": ".zst"}
    assert queue_config["QueueArn"].endswith(":episode-pipeline-local-raw-uploads")


def test_start_again_returns_the_running_stack(stack: StackInfo) -> None:
    again = start_stack(Path(stack.home))
    assert again.running
    assert (again.moto_pid, again.postgres_pid) == (stack.moto_pid, stack.postgres_pid)
    assert again.env == stack.env


def test_the_stack_s_moto_receives_in_time_linear_in_the_queue_depth(stack: StackInfo) -> None:
    """The stack runs moto through `local.moto_main` (its SQS receive made linear)."""
    assert stack.moto_pid is not None
    assert "episode_pipeline.local.moto_main" in psutil.Process(stack.moto_pid).cmdline()


def test_dagster_instance_runs_on_the_embedded_postgres(stack: StackInfo) -> None:
    """A real run writes events through dagster-postgres (the psycopg2 NOTIFY path)."""
    import dagster as dg

    config = instance_config("pw", 1)
    assert all(
        "psycopg2" in config[block]["config"]["postgres_url"] for block in POOLED_STORAGE_CLASSES
    )

    @dg.asset
    def stack_probe() -> int:
        return 1

    assert stack.dagster_home is not None
    with dg.DagsterInstance.from_config(stack.dagster_home) as instance:
        before = instance.get_runs_count()
        result = dg.materialize([stack_probe], instance=instance)
        assert result.success
        assert instance.get_runs_count() == before + 1
        assert type(instance.run_coordinator).__name__ == "EpisodeRunCoordinator"
        assert instance.run_coordinator.dequeue_interval_seconds == 1  # not the default 5


def test_the_local_instance_runs_production_s_pooled_storages(stack: StackInfo) -> None:
    """The local dagster.yaml names production's storages (instance/storage.py); they keep
    their connections, a forked child starts with none of its parent's, and the webserver's
    pool replaces theirs without leaving it open."""
    import dagster as dg
    import yaml

    assert stack.dagster_home is not None
    local = yaml.safe_load((Path(stack.dagster_home) / "dagster.yaml").read_text())
    production = yaml.safe_load((REPO / "dagster.yaml").read_text())
    for block in POOLED_STORAGE_CLASSES:
        assert (local[block]["module"], local[block]["class"]) == (
            production[block]["module"],
            production[block]["class"],
        )

    @dg.asset
    def pooled_probe() -> int:
        return 1

    with dg.DagsterInstance.from_config(stack.dagster_home) as instance:
        assert dg.materialize([pooled_probe], instance=instance).success
        storages = (instance.run_storage, instance.event_log_storage, instance.schedule_storage)
        engines = [s._engine for s in storages]  # type: ignore[attr-defined]
        assert {type(e.pool).__name__ for e in engines} == {"QueuePool"}
        assert engines[1].pool.checkedin() >= 1
        child = os.fork()
        if child == 0:  # the child: no inherited connection; its own work opens new ones
            code = 0 if all(e.pool.checkedin() == 0 for e in engines) else 3
            code = code or (0 if instance.get_runs_count() >= 1 else 4)
            os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert instance.get_runs_count() >= 1  # the parent's pooled connections still work
        instance.optimize_for_webserver(15_000, 3600, 20)  # as the webserver and `process` do
        assert [e.pool.checkedin() for e in engines] == [0, 0, 0]  # ours closed, not leaked
        assert instance.get_runs_count() >= 1


# --- a private stack: start in another process, restart, stop ------------------------------


@pytest.fixture(scope="module")
def own_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("own-stack")
    yield home
    stop_stack(home, save_objects=False)  # in case a test failed half way


CLI_TIMEOUT_SECONDS = 180  # a stack start on a loaded machine, with room to spare


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, HOME_ENV: str(home)}
    return subprocess.run(
        [sys.executable, "-m", "episode_pipeline.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=CLI_TIMEOUT_SECONDS,
    )


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_stack_outlives_the_process_that_started_it(own_home: Path) -> None:
    started = json.loads(_cli(own_home, "stack", "up", "--json").stdout)
    assert started["running"] is True
    status = stack_status(own_home)  # the CLI process has exited by now
    assert status.running
    assert (status.moto_pid, status.postgres_pid) == (started["moto_pid"], started["postgres_pid"])
    assert json.loads(_cli(own_home, "stack", "status", "--json").stdout)["running"] is True


def test_concurrent_starts_share_one_stack(own_home: Path) -> None:
    first = start_stack(own_home)
    results: list[StackInfo] = []
    threads = [
        threading.Thread(target=lambda: results.append(start_stack(own_home))) for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {(r.moto_pid, r.postgres_pid, r.moto_port) for r in results} == {
        (first.moto_pid, first.postgres_pid, first.moto_port)
    }
    motos = [
        p
        for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"] and str(first.moto_port) in p.info["cmdline"]
    ]
    assert [p.pid for p in motos] == [first.moto_pid]


def _receive_all(sqs: Any, queue_url: str) -> list[dict[str, Any]]:
    """Drain the private queue (nobody else reads it); long-poll once, then until empty."""
    bodies: list[dict[str, Any]] = []
    wait = 2
    while True:
        response = sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=wait
        )
        messages = response.get("Messages", [])
        if not messages:
            return bodies
        for message in messages:
            bodies.append(json.loads(message["Body"]))
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
        wait = 0


def _created_keys(bodies: list[dict[str, Any]]) -> list[str]:
    """Object keys of ObjectCreated records (moto URL-encodes them, as AWS does)."""
    records = [record for body in bodies for record in body.get("Records", [])]
    return [unquote_plus(record["s3"]["object"]["key"]) for record in records]


def test_zst_upload_is_notified_and_other_keys_are_not(own_home: Path) -> None:
    info = start_stack(own_home)
    assert info.s3_endpoint and info.sqs_queue_url
    s3 = aws_setup.client("s3", info.s3_endpoint)
    sqs = aws_setup.client("sqs", info.s3_endpoint)
    _receive_all(sqs, info.sqs_queue_url)  # the s3:TestEvent from setting up the notification
    s3.put_object(Bucket=info.bucket, Key="orgs/o1/episodes/e1/robot.tar.zst", Body=b"z")
    s3.put_object(Bucket=info.bucket, Key="orgs/o1/episodes/e1/notes.txt", Body=b"t")
    s3.put_object(Bucket=info.bucket, Key="elsewhere/robot.tar.zst", Body=b"z")
    assert _created_keys(_receive_all(sqs, info.sqs_queue_url)) == [
        "orgs/o1/episodes/e1/robot.tar.zst"
    ]


def test_objects_and_rows_survive_a_restart(own_home: Path) -> None:
    info = start_stack(own_home)
    settings = Settings.from_env(info.env)
    s3 = aws_setup.client("s3", info.s3_endpoint or "")
    key = "orgs/o2/episodes/e2/processed/hls/cam/playlist.m3u8"
    s3.put_object(Bucket=info.bucket, Key=key, Body=b"#EXTM3U\n", ContentType="audio/mpegurl")
    with connect(settings.database, autocommit=True) as conn:
        conn.execute("INSERT INTO episodes (id, org_id) VALUES ('e2', 'o2') ON CONFLICT DO NOTHING")

    stop_stack(own_home)
    assert not stack_status(own_home).running
    restarted = start_stack(own_home)

    assert restarted.running
    s3 = aws_setup.client("s3", restarted.s3_endpoint or "")
    got = s3.get_object(Bucket=restarted.bucket, Key=key)
    assert (got["Body"].read(), got["ContentType"]) == (b"#EXTM3U\n", "audio/mpegurl")
    assert s3.head_object(Bucket=restarted.bucket, Key="orgs/o1/episodes/e1/robot.tar.zst")
    settings = Settings.from_env(restarted.env)
    with connect(settings.database) as conn:
        assert conn.execute("SELECT org_id FROM episodes WHERE id = 'e2'").fetchone() == ("o2",)
    # Restoring objects must not look like new uploads: only the setup's s3:TestEvent arrives.
    sqs = aws_setup.client("sqs", restarted.s3_endpoint or "")
    bodies = _receive_all(sqs, restarted.sqs_queue_url or "")
    assert _created_keys(bodies) == []
    assert [body.get("Event") for body in bodies] == ["s3:TestEvent"]


def test_ensure_stack_starts_a_stopped_stack_and_says_so(
    own_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stop_stack(own_home, save_objects=False)
    info = ensure_stack(own_home)
    assert info.running
    assert f"starting the local stack in {own_home}" in capsys.readouterr().err
    ensure_stack(own_home)
    assert "starting" not in capsys.readouterr().err


def test_stop_leaves_no_process_and_no_port(own_home: Path) -> None:
    info = start_stack(own_home)
    pids = [info.moto_pid, info.postgres_pid]
    postmaster = psutil.Process(info.postgres_pid)
    pids += [child.pid for child in postmaster.children(recursive=True)]
    ports = {info.moto_port, info.postgres_port}

    stop_stack(own_home)

    assert [pid for pid in pids if _alive(pid)] == []
    bound = [
        c
        for c in psutil.net_connections(kind="inet")
        if c.laddr and c.laddr.port in ports and c.status == psutil.CONN_LISTEN
    ]
    assert bound == []
    assert not stack_status(own_home).running
    assert not (own_home / "moto.pid").exists()
    stop_stack(own_home)  # stopping a stopped stack is a no-op


def test_stop_also_stops_what_was_started_against_the_stack(own_home: Path) -> None:
    """A process started with the stack's environment (a run worker, a daemon or code server
    `dev` left behind) is stopped by `stack down`; one that merely exported DAGSTER_HOME (a
    user's shell) is not."""
    info = start_stack(own_home)
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    worker = subprocess.Popen(sleeper, env={**os.environ, **info.env})
    shell = subprocess.Popen(sleeper, env={**os.environ, "DAGSTER_HOME": info.env["DAGSTER_HOME"]})
    try:
        stop_stack(own_home, save_objects=False)
        worker.wait(5)  # gone: wait raises TimeoutExpired otherwise
        assert shell.poll() is None
    finally:
        for process in (worker, shell):
            process.kill()
            process.wait()


def _stack_up(home: Path, **timing: str) -> None:
    """`stack up` asking for `timing` only (none of the session's SQS_* values leak in)."""
    env = {k: v for k, v in os.environ.items() if k not in aws_setup.QueueTiming().env()}
    subprocess.run(
        [sys.executable, "-m", "episode_pipeline.cli", "stack", "up"],
        env={**env, HOME_ENV: str(home), **timing},
        check=True,
        capture_output=True,
        timeout=CLI_TIMEOUT_SECONDS,
    )


def test_queue_timing_is_a_stack_setting_applied_to_a_running_stack(own_home: Path) -> None:
    """The recipe of docs/operations.md: short visibility and few receives at `stack up` (the
    dead-letter queue within minutes), kept by later starts, put back the same way."""

    def timing(home: Path) -> tuple[str, str, dict[str, str]]:
        state = stack_status(home)
        sqs = aws_setup.client("sqs", state.s3_endpoint or "")
        attributes = sqs.get_queue_attributes(
            QueueUrl=state.sqs_queue_url, AttributeNames=["VisibilityTimeout", "RedrivePolicy"]
        )["Attributes"]
        policy = json.loads(attributes["RedrivePolicy"])
        return attributes["VisibilityTimeout"], str(policy["maxReceiveCount"]), state.env

    _stack_up(own_home)
    _stack_up(own_home, SQS_VISIBILITY_TIMEOUT_SECONDS="20", SQS_MAX_RECEIVE_COUNT="2")
    visibility, receives, env = timing(own_home)
    assert (visibility, receives) == ("20", "2")
    assert env["SQS_HEARTBEAT_SECONDS"] == "5"  # the heartbeat stays inside the timeout
    status = _cli(own_home, "stack", "status").stdout
    assert "visibility 20 s, to the DLQ after 2 receives" in status
    _stack_up(own_home)  # nothing asked: the stack keeps what it was given
    assert timing(own_home)[:2] == ("20", "2")
    _stack_up(own_home, **aws_setup.QueueTiming().env())
    assert timing(own_home)[:2] == ("900", "3")


# --- a dead server comes back where its clients look for it --------------------------------


def _kill_postmaster(info: StackInfo) -> None:
    """SIGKILL the postmaster, as a crash would; its backends exit on noticing (waited for)."""
    assert info.postgres_pid is not None
    postmaster = psutil.Process(info.postgres_pid)
    family = [postmaster, *postmaster.children(recursive=True)]
    postmaster.kill()
    _, alive = psutil.wait_procs(family, timeout=30)
    assert alive == []


def _time_waits(port: int | None) -> list[Any]:
    return [
        c
        for c in psutil.net_connections(kind="tcp")
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_TIME_WAIT
    ]


def test_a_dead_postgres_comes_back_on_its_recorded_port(own_home: Path) -> None:
    """Its clients (dev's daemon, code servers) keep the port they were given: `stack up`
    starts PostgreSQL there again, although the dead server's connections sit in TIME_WAIT."""
    info = start_stack(own_home)
    dagster_yaml = Path(info.dagster_home or "") / "dagster.yaml"
    written = dagster_yaml.read_text()
    database = Settings.from_env(info.env).database
    client = connect(database)  # a client of the server that dies
    client.execute("SELECT 1")
    _kill_postmaster(info)
    client.close()  # the server's side closed first: it is the one left in TIME_WAIT
    assert _time_waits(info.postgres_port), "the case under test: a port in TIME_WAIT"

    restarted = start_stack(own_home)

    assert restarted.postgres_port == info.postgres_port
    assert restarted.postgres_pid != info.postgres_pid
    assert restarted.moto_pid == info.moto_pid  # moto was alive: left alone
    assert dagster_yaml.read_text() == written
    with connect(database) as conn:  # the old settings reach the new server
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_dead_moto_comes_back_on_its_recorded_port(own_home: Path) -> None:
    info = start_stack(own_home)
    assert info.moto_pid is not None
    psutil.Process(info.moto_pid).kill()
    psutil.Process(info.moto_pid).wait(30)

    restarted = start_stack(own_home)

    assert (restarted.moto_port, restarted.s3_endpoint) == (info.moto_port, info.s3_endpoint)
    assert restarted.moto_pid != info.moto_pid
    s3 = aws_setup.client("s3", info.s3_endpoint or "")  # where its clients look
    assert s3.head_bucket(Bucket=info.bucket)["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_another_process_on_the_recorded_port_is_a_named_error(own_home: Path) -> None:
    info = start_stack(own_home)
    _kill_postmaster(info)
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        squatter.bind(("127.0.0.1", info.postgres_port or 0))
        squatter.listen()
        with pytest.raises(PortTakenError) as raised:
            start_stack(own_home)
        message = str(raised.value)
        assert f"PostgreSQL's port {info.postgres_port}" in message
        assert f"pid {os.getpid()}" in message  # who holds it
    finally:
        squatter.close()
    assert start_stack(own_home).postgres_port == info.postgres_port  # and once it is gone


def test_stacks_starting_at_once_create_postgres_system_user_one_at_a_time(tmp_path: Path) -> None:
    """Found on a fresh machine: three workers' stacks ran `useradd pgserver` at once and two
    PostgreSQL servers died with "Permission denied". Three processes ask for the user together,
    `useradd` played by a slow recorder (no user is created): their calls never overlap."""
    calls = tmp_path / "calls"
    program = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from episode_pipeline.local import pg_server\n"
        "def slow_useradd(name):\n"
        "    with Path(sys.argv[1]).open('a') as out:\n"
        "        out.write(f'in {time.monotonic()}\\n'); out.flush(); time.sleep(0.5)\n"
        "        out.write(f'out {time.monotonic()}\\n')\n"
        "pg_server.ensure_user_exists = slow_useradd\n"
        "pg_server.ensure_system_user('pgserver')\n"
    )
    workers = [subprocess.Popen([sys.executable, "-c", program, str(calls)]) for _ in range(3)]
    assert [worker.wait(timeout=60) for worker in workers] == [0, 0, 0]
    events = sorted(
        (float(at), kind) for kind, at in (line.split() for line in calls.read_text().splitlines())
    )
    assert [kind for _, kind in events] == ["in", "out"] * 3, events
