"""The suite's own rules, each on a small pytest session of its own (a subprocess, so that its
environment and temporary folder stay its own): nothing left behind, every test runs, the long
tests start first."""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

import psutil
import pytest

from episode_pipeline_tests.leftovers import GRACE_ENV

REPO = Path(__file__).parents[1]
PLUGINS = 'pytest_plugins = ("episode_pipeline_tests.suite", "episode_pipeline_tests.leftovers")\n'


@pytest.fixture
def session(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytest session with the suite's plugins, outside this session's environment."""
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv(GRACE_ENV, "1")  # a leak here is on purpose: no need to wait it out
    pytester.makeconftest(PLUGINS)
    return pytester


def run(session: pytest.Pytester, *args: str) -> pytest.RunResult:
    return session.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=120)


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_a_process_and_a_temporary_folder_left_behind_fail_the_session_by_name(
    session: pytest.Pytester, workers: list[str]
) -> None:
    session.makepyfile(
        """
        import subprocess, tempfile
        from pathlib import Path

        def test_leaks():
            subprocess.Popen(["sleep", "300"], start_new_session=True)
            Path(tempfile.mkdtemp(prefix="transcode-")).joinpath("part.ts").write_bytes(b"x")
        """
    )
    result = run(session, *workers)

    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*left behind by the suite*",
            "process pid * (started by the suite; cwd *; started during *test_leaks): sleep 300",
            "temporary path */tmp/transcode-* holding part.ts (last changed during *test_leaks)",
        ]
    )
    (line,) = [line for line in result.stdout.lines if line.endswith(": sleep 300")]
    pid = int(line.split()[2])
    assert not _alive(pid), "the check kills what it names"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_session_that_cleans_up_passes(session: pytest.Pytester) -> None:
    session.makepyfile(
        """
        import subprocess, tempfile

        def test_cleans_up():
            with tempfile.TemporaryDirectory(prefix="transcode-"):
                subprocess.run(["true"], check=True)

        def test_in_another_worker():
            pass
        """
    )
    result = run(session, "-n", "2")  # the workers themselves are not left behind
    assert result.ret == pytest.ExitCode.OK
    assert "left behind" not in result.stdout.str()


def test_a_skipped_test_fails_the_session_under_ci(
    session: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    session.makepyfile(
        """
        import pytest

        @pytest.mark.slow(seconds=1)
        def test_skips():
            pytest.skip("no such tool here")
        """
    )
    assert run(session).ret == pytest.ExitCode.OK  # a laptop may lack a tool

    monkeypatch.setenv("CI", "true")
    result = run(session)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "slow tests: 1 collected, 0 run",
            "*tests that did not run: the session fails*",
            "*test_skips: Skipped: no such tool here",
            "1 slow test(s) collected but not run",
        ]
    )


def test_slow_tests_start_first_and_stack_users_are_integration(session: pytest.Pytester) -> None:
    session.makepyfile(
        """
        import pytest

        @pytest.fixture
        def stack():
            return None

        def test_quick():
            pass

        def test_on_the_stack(stack):
            pass

        @pytest.mark.slow(seconds=5)
        def test_long():
            pass

        @pytest.mark.slow(seconds=50)
        def test_longest():
            pass
        """
    )
    order = run(session, "--collect-only", "-q").stdout.lines
    names = [line.rsplit("::", 1)[1] for line in order if "::" in line]
    assert names == ["test_longest", "test_long", "test_quick", "test_on_the_stack"]
    assert "1 passed" in run(session, "-m", "integration").stdout.str()
    assert "3 passed" in run(session, "-m", "unit").stdout.str()


def test_a_session_started_with_sigint_ignored_can_still_terminate_what_threads_start(
    session: pytest.Pytester,
) -> None:
    """As Dagster does, the test maps SIGTERM to SIGINT's handler, then starts a child from a
    thread (as a run in a thread starts `tail -F`) and stops it with SIGTERM."""
    session.makepyfile(
        """
        import signal, subprocess, threading

        def test_terminate_reaches_the_child():
            signal.signal(signal.SIGTERM, signal.getsignal(signal.SIGINT))
            children = []
            start = lambda: children.append(subprocess.Popen(["sleep", "60"]))
            thread = threading.Thread(target=start)
            thread.start()
            thread.join()
            (child,) = children
            child.terminate()
            assert child.wait(timeout=10) == -signal.SIGTERM
        """
    )
    ignoring_sigint = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "os.execv(sys.executable, [sys.executable, '-m', 'pytest', *sys.argv[1:]])"
    )
    result = session.run(
        sys.executable, "-c", ignoring_sigint, "-p", "no:cacheprovider", timeout=120
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()


def test_under_xdist_a_module_stays_in_one_worker_and_slow_tests_spread(
    session: pytest.Pytester,
) -> None:
    """What `make test` relies on (`-n N --dist loadgroup`): a module's tests share one worker,
    in their order; each slow test is a unit of its own."""
    for name in ("first", "second"):
        session.makepyfile(
            **{
                f"test_{name}": """
                import pytest

                def test_1(): pass
                def test_2(): pass
                def test_3(): pass

                @pytest.mark.slow(seconds=1)
                @pytest.mark.parametrize("case", range(4))
                def test_long(case): pass
                """
            }
        )
    result = run(session, "-n", "2", "--dist", "loadgroup", "-v")
    assert result.ret == pytest.ExitCode.OK
    ran: dict[str, list[tuple[str, str]]] = {}
    for line in result.stdout.lines:
        if " PASSED " in line:
            worker, test = line.split()[0], line.split()[-1]
            ran.setdefault(test.split("::")[0], []).append((worker, test.split("::")[1]))
    for module in ("test_first.py", "test_second.py"):
        grouped = [
            (worker, test) for worker, test in ran[module] if not test.startswith("test_long")
        ]
        assert len({worker for worker, _ in grouped}) == 1, grouped
        assert [test for _, test in grouped] == [f"test_{i}@{module}" for i in (1, 2, 3)]
    slow_workers = {w for runs in ran.values() for w, test in runs if test.startswith("test_long")}
    assert len(slow_workers) == 2


def _retention_options() -> dict[str, str]:
    """The project's `tmp_path_retention_*` options (pyproject.toml), for a session of its own."""
    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]
    return {k: v for k, v in options["ini_options"].items() if k.startswith("tmp_path_retention")}


def run_in_temproot(
    session: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str
) -> tuple[pytest.RunResult, list[Path]]:
    """A session whose basetemp pytest chooses itself, as in `make test` (not `--basetemp`, which
    pytester's runpytest passes and which pytest never removes), under a temp root of its own;
    returns the result and the basetemps left there."""
    root = session.path / "temproot"
    root.mkdir(exist_ok=True)
    monkeypatch.setenv("PYTEST_DEBUG_TEMPROOT", str(root))
    result = session.run(
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, timeout=120
    )
    return result, sorted(root.glob("pytest-of-*/pytest-[0-9]*"))


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_only_failed_tests_keep_their_temp_folders_and_a_leak_still_fails_the_session(
    session: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: list[str]
) -> None:
    options = _retention_options()
    assert options["tmp_path_retention_policy"] == "failed"
    session.makeini("[pytest]\n" + "".join(f"{k} = {v}\n" for k, v in options.items()))
    session.makepyfile(
        test_passes="def test_passes(tmp_path): (tmp_path / 'big.bin').write_bytes(b'x' * 9999)",
        test_fails="def test_fails(tmp_path): (tmp_path / 'why.txt').write_text('x'); assert 0",
    )
    result, (failed_session,) = run_in_temproot(session, monkeypatch, *workers)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    kept = {path.parent.name for path in failed_session.rglob("*.*") if path.is_file()}
    assert "test_fails0" in kept and "test_passes0" not in kept, kept

    Path(session.path / "test_fails.py").unlink()
    result, left = run_in_temproot(session, monkeypatch, *workers)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert left == [failed_session], "a session that passed leaves no folder"

    # Every test passes but one leaks a temp folder: pytest would remove the basetemp holding
    # the evidence; the check still sees it, names it and fails the session.
    session.makepyfile(
        test_leaks="import tempfile\ndef test_leaks(): tempfile.mkdtemp(prefix='transcode-')"
    )
    result, left = run_in_temproot(session, monkeypatch, *workers)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*left behind by the suite*", "temporary path */tmp/transcode-*"])
    assert len(left) == 2  # a failed session keeps its folder
