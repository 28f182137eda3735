"""`skip_teardown`: the status a program records, its output and its atexit handlers survive."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run_program(body: str) -> subprocess.CompletedProcess[str]:
    program = "import atexit, sys\nfrom episode_pipeline.runtime.fast_exit import skip_teardown\n"
    program += textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_recorded_status_and_buffered_output_come_out() -> None:
    done = run_program(
        """
        exiting = skip_teardown()
        atexit.register(lambda: print("handler registered later ran"))
        sys.stdout.write("no newline, still buffered")
        sys.exit(exiting(3))
        """
    )
    assert done.returncode == 3
    assert done.stdout == "no newline, still bufferedhandler registered later ran\n"


def test_an_uncaught_exception_exits_1_with_its_traceback() -> None:
    done = run_program(
        """
        exiting = skip_teardown()
        raise RuntimeError("boom")
        """
    )
    assert done.returncode == 1
    assert "RuntimeError: boom" in done.stderr
