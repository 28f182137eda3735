"""A Dagster instance of a test's own, in a private database of the session's PostgreSQL."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import yaml
from dagster import DagsterInstance

from episode_pipeline.local.dagster_home import instance_config
from episode_pipeline.local.stack import StackInfo


def private_instance_config(stack: StackInfo, prefix: str) -> dict[str, Any]:
    """The local instance's dagster.yaml on a new database `<prefix>_<random>`: the test's
    runs, events and partitions are all that instance sees."""
    password, port = stack.env["DB_PASSWORD"], int(stack.env["DB_PORT"])
    database = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(
        host="127.0.0.1", port=port, user="postgres", password=password, autocommit=True
    ) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    return instance_config(password, port, database=database)


@contextlib.contextmanager
def private_instance(stack: StackInfo, prefix: str, **overrides: Any) -> Iterator[DagsterInstance]:
    """An instance on a database of its own (`private_instance_config`), `overrides` replacing
    parts of its config (a run launcher); its home is removed afterwards."""
    home = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
    try:
        config = {**private_instance_config(stack, prefix), **overrides}
        (home / "dagster.yaml").write_text(yaml.safe_dump(config))
        with DagsterInstance.from_config(str(home)) as instance:
            yield instance
    finally:
        shutil.rmtree(home, ignore_errors=True)
