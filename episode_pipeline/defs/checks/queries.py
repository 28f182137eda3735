"""The checks' reads of PostgreSQL: one query from `db/episodes.py` about the check's episode."""

from collections.abc import Callable
from typing import TypeVar

import psycopg

from episode_pipeline.defs.checks.family import EpisodeCheckContext
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.episodes.keys import EpisodeRef, parse_partition_key

T = TypeVar("T")


def query_episode(
    context: EpisodeCheckContext,
    postgres: PostgresResource,
    query: Callable[[psycopg.Connection, EpisodeRef], T],
) -> T:
    """One read from `db/episodes.py` about the check's episode, on its own connection."""
    with postgres.connect() as conn:
        return query(conn, parse_partition_key(context.partition_key))
