"""Connection settings: password, SSL and RDS IAM tokens (with a hand-written fake generator)."""

from __future__ import annotations

from dataclasses import replace

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from episode_pipeline.config.settings import DatabaseSettings, Settings
from episode_pipeline.db.connection import IamTokenCache, connect, conninfo

AURORA = DatabaseSettings(
    host="db.cluster-abc.us-west-2.rds.amazonaws.com",
    port=5432,
    name="toborverse",
    user="pipeline",
    password="from-secret",
    ssl=True,
    iam_auth=False,
    region="us-west-2",
)


class FakeTokens:
    """Counts calls and returns a distinct token each time, as a real signer would."""

    def __init__(self) -> None:
        self.calls: list[DatabaseSettings] = []

    def __call__(self, db: DatabaseSettings) -> str:
        self.calls.append(db)
        return f"token-{len(self.calls)}-{db.user}"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_password_and_ssl() -> None:
    params = conninfo_to_dict(conninfo(AURORA))
    assert params["password"] == "from-secret"
    assert params["sslmode"] == "require"
    assert params["host"] == AURORA.host
    assert params["dbname"] == "toborverse"
    assert params["connect_timeout"] == "10"
    # Server-side deadlines, long enough for a frames COPY (docs/faults.md).
    assert params["options"] == (
        "-c statement_timeout=900s -c lock_timeout=60s -c idle_in_transaction_session_timeout=600s"
        " -c tcp_keepalives_idle=30 -c tcp_keepalives_interval=10 -c tcp_keepalives_count=3"
    )
    assert (params["keepalives"], params["keepalives_idle"]) == ("1", "30")


def test_no_ssl_no_password_locally() -> None:
    params = conninfo_to_dict(conninfo(replace(AURORA, ssl=False, password=None)))
    assert "sslmode" not in params
    assert "password" not in params


def test_iam_auth_uses_a_token_instead_of_the_password() -> None:
    generate = FakeTokens()
    tokens = IamTokenCache(generate, clock=FakeClock())
    params = conninfo_to_dict(conninfo(replace(AURORA, iam_auth=True, ssl=False), tokens=tokens))
    assert params["password"] == "token-1-pipeline"
    assert params["sslmode"] == "require"  # RDS only accepts IAM tokens over SSL
    assert generate.calls[0].host == AURORA.host


def test_iam_token_is_reused_then_refreshed_before_expiry() -> None:
    generate, clock = FakeTokens(), FakeClock()
    tokens = IamTokenCache(generate, clock=clock, refresh_after=600)
    db = replace(AURORA, iam_auth=True)
    assert tokens.token(db) == "token-1-pipeline"
    clock.now += 599
    assert tokens.token(db) == "token-1-pipeline"
    clock.now += 1
    assert tokens.token(db) == "token-2-pipeline"
    assert tokens.token(replace(db, user="reader")) == "token-3-reader"  # per user
    assert len(generate.calls) == 3


def test_refresh_must_come_before_the_15_minute_expiry() -> None:
    with pytest.raises(ValueError, match="refresh_after"):
        IamTokenCache(FakeTokens(), refresh_after=15 * 60)


@pytest.mark.integration
def test_connects_to_the_stack_with_its_password(settings: Settings) -> None:
    with connect(settings.database) as conn:
        assert not conn.autocommit
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
    with connect(settings.database, autocommit=True) as conn:
        assert conn.autocommit


@pytest.mark.integration
def test_wrong_password_is_refused(settings: Settings) -> None:
    with pytest.raises(psycopg.OperationalError, match="password"):
        connect(replace(settings.database, password="wrong"))
