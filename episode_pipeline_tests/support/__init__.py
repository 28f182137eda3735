"""Helpers the tests share: plain functions and constants to import, by topic in this package's
modules. Fixtures live in conftest.py, and the shared ones in the modules it lists as plugins
(`queues`, `daemon`)."""

from __future__ import annotations

import os
import uuid

from episode_pipeline.episodes.keys import EpisodeRef

TEST_ORG = "test-org"


def new_ref(org_id: str = TEST_ORG) -> EpisodeRef:
    """A fresh episode id (`ep-<10 hex>`), so tests sharing a stack never share rows or keys."""
    return EpisodeRef(org_id, f"ep-{uuid.uuid4().hex[:10]}")


def in_ci() -> bool:
    """Under CI (`CI=true`) a missing tool fails its test rather than skipping it."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}
