"""Slow tests run last, and only while the session is within its time budget.

CI stops the whole suite at 15 minutes. Tests marked `@pytest.mark.slow(seconds=N)` (the crash
tests with a real daemon) are moved to the end of the run; each is skipped, saying why, when the
time used so far plus its estimate would pass `EPISODE_PIPELINE_TEST_BUDGET_SECONDS` (default
12 minutes). `-m "not slow"` leaves them out; `-m slow` runs only them.
"""

from __future__ import annotations

import os
import time

import pytest

BUDGET_ENV = "EPISODE_PIPELINE_TEST_BUDGET_SECONDS"
DEFAULT_BUDGET_SECONDS = 12 * 60
DEFAULT_ESTIMATE_SECONDS = 60

_started = time.monotonic()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slow(seconds=N): a long test, run last and only within the session's time budget "
        f"({BUDGET_ENV}, default {DEFAULT_BUDGET_SECONDS} s)",
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    global _started
    _started = time.monotonic()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("slow") is not None)  # stable


def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("slow")
    if marker is None:
        return
    budget = float(os.environ.get(BUDGET_ENV) or DEFAULT_BUDGET_SECONDS)
    estimate = float(marker.kwargs.get("seconds", DEFAULT_ESTIMATE_SECONDS))
    used = time.monotonic() - _started
    if used + estimate > budget:
        pytest.skip(
            f"suite time budget: {used:.0f} s used, this test needs about {estimate:.0f} s of "
            f"{budget:.0f} s ({BUDGET_ENV})"
        )
