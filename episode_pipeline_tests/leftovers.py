"""Nothing the suite starts outlives it: an end-of-session check for processes and temp folders.

When the session starts (in the controller, before xdist starts its workers) it marks its
environment, `EPISODE_PIPELINE_TEST_SESSION=<id>`, which every process it starts inherits
(workers, the stacks' PostgreSQL and moto, daemons, FFmpeg, shell stand-ins), and points
`TMPDIR` at a folder of its own, `<pytest basetemp>/tmp`, so every `tempfile` folder of every
process lands there rather than in the machine's /tmp.

When the session ends (the workers gone, every stack stopped), a process still alive after a
grace period that carries the mark, or whose working directory is inside the basetemp, is a
leftover; so is anything left in the session's TMPDIR. The check lists each one (pid, command,
working directory; path), removes it (SIGKILL; rmtree) so nothing outlives the suite anyway, and
fails the session. Then, and only then, a session that passed loses its basetemp (pytest's
`tmp_path_retention_policy = "failed"`, which would otherwise remove it before the check).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

SESSION_ENV = "EPISODE_PIPELINE_TEST_SESSION"
GRACE_ENV = "EPISODE_PIPELINE_TEST_LEFTOVER_GRACE_SECONDS"  # how long survivors may take to go
DEFAULT_GRACE_SECONDS = 15.0

# Files a library keeps in the temp folder on purpose, to reuse them: removed, not reported.
LIBRARY_CACHES = (
    ".lark_cache_*",  # python-hcl2's parser (lark with cache=True)
    "uv-setuptools-*.lock",  # uv's build lock (the production-install test)
)

_session: dict[str, str] = {}
_found: list[str] = []
_ran: dict[str, list[float]] = {}  # test id -> [first start, last stop], to name who started what


def session_env() -> dict[str, str]:
    """What a process started with an environment of its own (not `os.environ`) must carry
    so that the check can see it: the session's mark and TMPDIR."""
    return {name: os.environ[name] for name in (SESSION_ENV, "TMPDIR") if name in os.environ}


def interruptible() -> None:
    """Give SIGINT and SIGTERM their default handling back when the session inherited them
    ignored (a background job of a non-interactive shell ignores SIGINT).

    Dagster maps SIGTERM to SIGINT's handler, so such a process ends up ignoring both; a run
    executed in a thread other than the main one then starts its `tail -F` compute-log children
    with both ignored (exec keeps an ignored signal), and Dagster's SIGTERM cannot stop them.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.hookimpl(trylast=True)  # after pytest made its tmp_path_factory
def pytest_configure(config: pytest.Config) -> None:
    interruptible()
    if hasattr(config, "workerinput"):
        return  # a worker: the controller set the environment it inherited
    basetemp = config._tmp_path_factory.getbasetemp()  # before TMPDIR moves, so it stays put
    own_tmp = basetemp / "tmp"
    own_tmp.mkdir(exist_ok=True)
    _session.update(id=uuid.uuid4().hex, basetemp=str(basetemp), tmp=str(own_tmp))
    os.environ[SESSION_ENV] = _session["id"]
    os.environ["TMPDIR"] = str(own_tmp)
    tempfile.tempdir = str(own_tmp)


def _ours(process: psutil.Process, spared: set[int]) -> str | None:
    """How `process` belongs to this session (None if it does not, or is gone)."""
    with contextlib.suppress(psutil.Error):
        if process.pid in spared:
            return None
        if process.environ().get(SESSION_ENV) == _session["id"]:
            return "started by the suite"
        if Path(process.cwd()).is_relative_to(_session["basetemp"]):
            return "runs in the suite's temp folder"
    return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    span = _ran.setdefault(report.nodeid, [report.start, report.stop])
    span[0], span[1] = min(span[0], report.start), max(span[1], report.stop)


def _started_at(pid: int) -> float:
    """When `pid` started, on the clock of the test reports. psutil's figure adds the boot time,
    which the kernel gives in whole seconds; the process's age since boot is exact to a tick."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def _running_at(moment: float) -> str:
    tests = [n for n, (start, stop) in _ran.items() if start - 0.1 <= moment <= stop + 0.1]
    return ", ".join(tests) or "no test (set-up or tear-down of the session)"


def _describe(process: psutil.Process, why: str) -> str:
    with contextlib.suppress(psutil.Error, OSError):
        command = " ".join(process.cmdline())[:300]
        during = _running_at(_started_at(process.pid))
        return f"pid {process.pid} ({why}; cwd {process.cwd()}; started during {during}): {command}"
    return f"pid {process.pid} ({why})"


def surviving_processes() -> list[str]:
    """Processes of this session still alive after the grace period, each killed once named."""
    me = psutil.Process()
    spared = {me.pid, *(p.pid for p in me.parents())}
    grace = float(os.environ.get(GRACE_ENV) or DEFAULT_GRACE_SECONDS)
    deadline = time.monotonic() + grace
    while True:
        found = [(p, why) for p in psutil.process_iter() if (why := _ours(p, spared))]
        if not found or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    named = [_describe(process, why) for process, why in found]
    for process, _ in found:
        with contextlib.suppress(psutil.Error):
            process.kill()
    return named


def _describe_path(path: Path) -> str:
    """The path, a few of its entries, and the tests running when it last changed."""
    with contextlib.suppress(OSError):
        entries = sorted(entry.name for entry in path.iterdir())[:4] if path.is_dir() else []
        inside = f" holding {', '.join(entries)}" if entries else ""
        return f"{path}{inside} (last changed during {_running_at(path.lstat().st_mtime)})"
    return str(path)


def leftover_temp_paths() -> list[str]:
    """What is left in the session's TMPDIR, each removed once named."""
    own_tmp = Path(_session["tmp"])
    left = sorted(own_tmp.iterdir()) if own_tmp.exists() else []
    named = [
        _describe_path(path)
        for path in left
        if not any(path.match(cache) for cache in LIBRARY_CACHES)
    ]
    for path in left:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return named


def _removes_basetemp_when_passed(config: pytest.Config) -> bool:
    """Will pytest remove the session's basetemp at its end (`tmp_path_retention_policy =
    "failed"`, a basetemp of its own choosing) if no test failed? It would do so inside the
    wrapper below, before the check: a session whose only fault is a leak would lose the
    evidence and pass. So the removal waits for the check (pytest < 9.2's own attributes)."""
    factory = config._tmp_path_factory
    return factory._retention_policy == "failed" and factory._given_basetemp is None


# Inside the terminal reporter's wrapper, around every other implementation: the check runs
# after xdist has shut its workers down, and its findings still reach the closing summary.
@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int):
    controller = not hasattr(session.config, "workerinput") and bool(_session)
    deferred = controller and _removes_basetemp_when_passed(session.config)
    if deferred:
        session.config._tmp_path_factory._retention_policy = "all"  # until the check is done
    result = yield
    if not controller:
        return result
    _found.extend(f"process {line}" for line in surviving_processes())
    _found.extend(f"temporary path {line}" for line in leftover_temp_paths())
    if _found and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if deferred:
        session.config._tmp_path_factory._retention_policy = "failed"
        if session.exitstatus == pytest.ExitCode.OK:  # what pytest would have removed
            shutil.rmtree(_session["basetemp"], ignore_errors=True)
    return result


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not _found:
        return
    terminalreporter.section("left behind by the suite (removed now; the session fails)")
    for line in _found:
        terminalreporter.write_line(line)
