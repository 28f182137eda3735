"""A Dagster instance of a test's own, in a private database of the session's PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

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
