"""How the suite runs: its markers, the order tests start in, and the rule that every test runs.

Markers (docs/testing.md):
- `integration`: needs the embedded stack (PostgreSQL, moto server) or starts servers of its own.
  Every test that uses the `stack` fixture, directly or through another fixture, gets it here,
  so it cannot be forgotten; a module that starts servers without `stack` marks itself.
- `unit`: every other test (no server; it may run a local tool such as FFmpeg). Given here.
- `slow(seconds=N)`: a long test (the crash tests with a real daemon), about N seconds.

Order, for `pytest -n N --dist loadgroup` (`make test`): a module runs in one worker (an
`xdist_group` per module, so its module-scoped fixtures, a `dagster dev` say, start once), except
that each `slow` test is a unit of its own and may run in any worker. Units start longest first
(the slow tests, then the modules of `MODULE_SECONDS`), so no long test forms the tail.

Every test runs: under `CI=true` a skipped test fails the session, naming it (a tool that CI
lacks fails its test instead of skipping: see test_ui.py, test_deploy_infra.py); the closing
summary counts the slow tests collected and run.
"""

from __future__ import annotations

import pytest

from episode_pipeline_tests.support import in_ci

DEFAULT_SLOW_SECONDS = 60

# Modules that take the longest on 2 cores (measured with `make test`, docs/testing.md): they
# start first. A stale figure costs only wall time, never a test.
MODULE_SECONDS = {
    "test_episode_graph.py": 160,
    "test_ui.py": 150,
    "test_injected_faults.py": 80,
    "test_dev_lifecycle.py": 70,
    "test_hls.py": 60,
    "test_hostile_archives.py": 30,
    "test_run_status_daemon.py": 30,
    "test_sync_check.py": 30,
    "test_benchmarks_smoke.py": 30,
    "test_sensor_sqs.py": 25,
    "test_stack.py": 60,
}

_skipped: list[str] = []
_slow = {"collected": 0, "run": 0}


def pytest_configure(config: pytest.Config) -> None:
    for line in (
        "integration: needs the embedded stack (PostgreSQL, moto server) or starts servers of "
        "its own; given to every test that uses the `stack` fixture",
        "unit: no server (may run a local tool such as FFmpeg); given to every other test",
        f"slow(seconds=N): a long test (default {DEFAULT_SLOW_SECONDS} s); starts first and "
        "runs in whichever worker is free",
    ):
        config.addinivalue_line("markers", line)
    # xdist would otherwise order its units by their number of tests, not by what they cost.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def slow_seconds(item: pytest.Item) -> float | None:
    marker = item.get_closest_marker("slow")
    if marker is None:
        return None
    return float(marker.kwargs.get("seconds", DEFAULT_SLOW_SECONDS))


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        uses_stack = "stack" in getattr(item, "fixturenames", ())
        if uses_stack and item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.integration)
        if item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.unit)
        if slow_seconds(item) is None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.path.name))

    def cost(item: pytest.Item) -> float:
        return slow_seconds(item) or MODULE_SECONDS.get(item.path.name, 0)

    items.sort(key=cost, reverse=True)  # stable: a module's tests keep their order


def pytest_collection_finish(session: pytest.Session) -> None:
    _slow["collected"] = sum(slow_seconds(item) is not None for item in session.items)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist: each worker collected the whole session; take its count of slow tests."""
    collected = getattr(node, "workeroutput", {}).get("slow_collected", 0)
    _slow["collected"] = max(_slow["collected"], collected)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skipped.append(f"{report.nodeid}: {reason}")
    if report.when == "call" and not report.skipped and "slow" in report.keywords:
        _slow["run"] += 1


def _not_run() -> list[str]:
    problems = list(_skipped)
    if _slow["run"] != _slow["collected"]:
        problems.append(f"{_slow['collected'] - _slow['run']} slow test(s) collected but not run")
    return problems


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        session.config.workeroutput["slow_collected"] = _slow["collected"]  # type: ignore[attr-defined]
    elif in_ci() and _not_run() and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or config.option.collectonly:
        return
    if _slow["collected"] or _slow["run"]:
        terminalreporter.write_line(
            f"slow tests: {_slow['collected']} collected, {_slow['run']} run"
        )
    problems = _not_run()
    if problems:
        verdict = "the session fails (CI=true: every test runs)" if in_ci() else "allowed here"
        terminalreporter.section(f"tests that did not run: {verdict}")
        for line in problems:
            terminalreporter.write_line(line)
