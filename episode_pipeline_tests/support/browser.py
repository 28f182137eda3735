"""Debian's chromium driven by Playwright's Python package (never `playwright install`, which
downloads a browser): the UI test and the viewer's test."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
# A folder (e.g. docs/images) where the browser tests keep their screenshots; by default
# .episode_pipeline/test-artifacts/ of the checkout (git ignores it): kept after the session.
SCREENSHOTS_ENV = "EPISODE_PIPELINE_UI_SCREENSHOTS"
ARTIFACTS = Path(__file__).resolve().parents[2] / ".episode_pipeline" / "test-artifacts"


def chromium_or_skip() -> str:
    """Debian's chromium; under CI=true its absence fails the test instead of skipping it."""
    path = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).exists() else None)
    missing = None if path else "no chromium (scripts/bootstrap.sh installs it with apt)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing = "Playwright's Python package is not installed (the dev extras have it)"
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true needs the browser tests: {missing}")
        pytest.skip(missing)
    return str(path)


def screenshots() -> Path:
    """The folder the browser tests keep their screenshots in."""
    shots = Path(os.environ.get(SCREENSHOTS_ENV) or ARTIFACTS)
    shots.mkdir(parents=True, exist_ok=True)
    return shots
