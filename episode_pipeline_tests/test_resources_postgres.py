"""PostgresResource against the embedded PostgreSQL: connect, commit, roll back."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from episode_pipeline.config.settings import Settings
from episode_pipeline.defs.resources.database import PostgresResource

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def postgres(settings: Settings) -> PostgresResource:
    return PostgresResource.from_settings(settings.database)


def _count(db_conn: psycopg.Connection, episode_id: str) -> int:
    row = db_conn.execute("SELECT count(*) FROM episodes WHERE id = %s", (episode_id,)).fetchone()
    return row[0]


def test_connect_reaches_the_database(postgres: PostgresResource) -> None:
    with postgres.connect() as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert conn.closed


def test_transaction_commits_on_success(
    postgres: PostgresResource, db_conn: psycopg.Connection
) -> None:
    episode_id = f"ep-{uuid.uuid4().hex[:12]}"
    with postgres.transaction() as conn:
        conn.execute("INSERT INTO episodes (id, org_id) VALUES (%s, 'org-res')", (episode_id,))
    assert _count(db_conn, episode_id) == 1


def test_transaction_rolls_back_on_error(
    postgres: PostgresResource, db_conn: psycopg.Connection
) -> None:
    episode_id = f"ep-{uuid.uuid4().hex[:12]}"
    with pytest.raises(RuntimeError, match="boom"), postgres.transaction() as conn:
        conn.execute("INSERT INTO episodes (id, org_id) VALUES (%s, 'org-res')", (episode_id,))
        raise RuntimeError("boom")
    assert _count(db_conn, episode_id) == 0
