"""Shared fixtures: one embedded stack per test session, in a private home under pytest's tmp dir.

The session's `os.environ` holds that stack's variables (EPISODE_PIPELINE_HOME and every
variable of its `stack.json`: DB_*, the AWS endpoint and fake credentials, DAGSTER_HOME), as
`episode-pipeline dev` exports them, so the code location (which reads only its environment),
`load_settings()` and CLI subprocesses started with `os.environ` reach it; a developer's
production variables are removed first so nothing reaches a real database.
Tests that stop or restart a stack use their own home (see test_stack.py), never this one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from dagster import DagsterInstance

from episode_pipeline.config.env import variables
from episode_pipeline.config.settings import Settings
from episode_pipeline.db.connection import connect
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.local import aws_setup
from episode_pipeline.local.stack import StackInfo, start_stack, stop_stack
from episode_pipeline.local.stack_env import HOME_ENV, load_settings
from episode_pipeline_tests.support import TEST_ORG, new_ref

# How the suite runs (markers, order, every test runs) and what it may leave behind (nothing).
pytest_plugins = (
    "episode_pipeline_tests.suite",
    "episode_pipeline_tests.leftovers",
    # Fixtures more than one module uses: a private queue (and its sample), a crash stage.
    "episode_pipeline_tests.support.queues",
    "episode_pipeline_tests.support.daemon",
    "pytester",  # test_suite_checks.py runs small sessions of its own
)

# Removed from the session: every variable the settings read, and boto3's own credentials.
_PRODUCTION_ENV = (*(v.name for v in variables(Settings)), "AWS_PROFILE", "AWS_SESSION_TOKEN")


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackInfo]:
    """The session's running stack (started once, stopped at the end without an S3 snapshot)."""
    home = tmp_path_factory.mktemp("stack-home")
    saved = dict(os.environ)
    for name in _PRODUCTION_ENV:
        os.environ.pop(name, None)
    os.environ[HOME_ENV] = str(home)
    info = start_stack(home)
    os.environ.update(info.env)
    try:
        yield info
    finally:
        stop_stack(home, save_objects=False)
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def settings(stack: StackInfo) -> Settings:
    return load_settings()


@pytest.fixture
def db_conn(settings: Settings) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the stack's `episodes` database, closed after the test."""
    with connect(settings.database, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="session")
def s3_client(stack: StackInfo) -> Any:
    assert stack.s3_endpoint is not None
    return aws_setup.client("s3", stack.s3_endpoint)


@pytest.fixture(scope="session")
def sqs_client(stack: StackInfo) -> Any:
    assert stack.s3_endpoint is not None
    return aws_setup.client("sqs", stack.s3_endpoint)


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    """An ephemeral Dagster instance (in memory): run keys, runs and partitions start empty."""
    with DagsterInstance.ephemeral() as ephemeral:
        yield ephemeral


@pytest.fixture
def episode_ref() -> Callable[..., EpisodeRef]:
    """Factory: `episode_ref()` or `episode_ref("other-org")` gives a new unique EpisodeRef."""
    return new_ref


def insert_episode(
    conn: psycopg.Connection, ref: EpisodeRef, status: str = "uploaded"
) -> EpisodeRef:
    """Insert the episode row the application would have created before the upload."""
    conn.execute(
        "INSERT INTO episodes (id, org_id, status) VALUES (%s, %s, %s)",
        (ref.episode_id, ref.org_id, status),
    )
    return ref


@pytest.fixture
def episode_row(
    db_conn: psycopg.Connection, episode_ref: Callable[..., EpisodeRef]
) -> Callable[..., EpisodeRef]:
    """Factory: `episode_row()` inserts a new 'uploaded' episode and returns its EpisodeRef."""

    def make(org_id: str = TEST_ORG, status: str = "uploaded") -> EpisodeRef:
        return insert_episode(db_conn, episode_ref(org_id), status)

    return make
