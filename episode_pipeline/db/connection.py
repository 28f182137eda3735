"""Open PostgreSQL connections from `DatabaseSettings`, the same way locally and on Aurora.

Password auth by default; with `DB_IAM_AUTH=true` the password is ignored and an RDS IAM token is
used instead (what dev requires: its database user has `rds_iam`). Tokens live 15 minutes, so one
is cached per host/port/user/region and replaced after 10 minutes.

Every session is bounded (`DatabaseSettings`, docs/faults.md): a connect timeout, and
`statement_timeout`, `lock_timeout` and `idle_in_transaction_session_timeout` sent as startup
options, so a stuck statement, a lock held by a stuck run or a worker that stopped inside a
transaction ends in a named error (and a rollback) instead of blocking for days. The statement
deadline is long enough for the frames COPY of a long episode.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from psycopg.conninfo import make_conninfo

from episode_pipeline.config.settings import DatabaseSettings

APPLICATION_NAME = "episode_pipeline"
TOKEN_LIFETIME_SECONDS = 15 * 60
TOKEN_REFRESH_AFTER_SECONDS = 10 * 60  # well before expiry: a connect may retry after a slow start

TokenGenerator = Callable[[DatabaseSettings], str]


def boto3_token(db: DatabaseSettings) -> str:
    """An RDS IAM auth token (a presigned URL; signed locally, no network call)."""
    import boto3

    client = boto3.client("rds", region_name=db.region)
    return client.generate_db_auth_token(
        DBHostname=db.host, Port=db.port, DBUsername=db.user, Region=db.region
    )


@dataclass
class _CachedToken:
    token: str
    issued_at: float


class IamTokenCache:
    """Hands out IAM tokens, reusing one until it is `refresh_after` seconds old.

    `generate` and `clock` are injectable so the refresh logic is testable without AWS.
    """

    def __init__(
        self,
        generate: TokenGenerator = boto3_token,
        clock: Callable[[], float] = time.monotonic,
        refresh_after: float = TOKEN_REFRESH_AFTER_SECONDS,
    ) -> None:
        if not 0 < refresh_after < TOKEN_LIFETIME_SECONDS:
            raise ValueError(f"refresh_after must be in (0, {TOKEN_LIFETIME_SECONDS}) seconds")
        self._generate = generate
        self._clock = clock
        self._refresh_after = refresh_after
        self._tokens: dict[tuple[str, int, str, str], _CachedToken] = {}
        self._lock = threading.Lock()

    def token(self, db: DatabaseSettings) -> str:
        key = (db.host, db.port, db.user, db.region)
        now = self._clock()
        with self._lock:
            cached = self._tokens.get(key)
            if cached is None or now - cached.issued_at >= self._refresh_after:
                cached = _CachedToken(self._generate(db), now)
                self._tokens[key] = cached
            return cached.token


_default_tokens = IamTokenCache()


KEEPALIVE_INTERVAL_SECONDS = 10
KEEPALIVE_PROBES = 3


def session_options(db: DatabaseSettings) -> str:
    """libpq `options`: the server-side deadlines of every session.

    The server's TCP keepalives let it notice a client that vanished without closing (an ECS
    task gone mid-COPY): its backend ends and rolls back, releasing the episode's advisory lock
    for the retry, instead of holding it until the statement deadline.
    """
    return " ".join(
        [
            f"-c statement_timeout={db.statement_timeout_seconds}s",
            f"-c lock_timeout={db.lock_timeout_seconds}s",
            f"-c idle_in_transaction_session_timeout={db.idle_in_transaction_timeout_seconds}s",
            f"-c tcp_keepalives_idle={db.keepalive_idle_seconds}",
            f"-c tcp_keepalives_interval={KEEPALIVE_INTERVAL_SECONDS}",
            f"-c tcp_keepalives_count={KEEPALIVE_PROBES}",
        ]
    )


def conninfo(db: DatabaseSettings, *, tokens: IamTokenCache | None = None) -> str:
    """A libpq connection string for `db` (with an IAM token as password when iam_auth)."""
    if db.iam_auth:
        password: str | None = (tokens or _default_tokens).token(db)
    else:
        password = db.password
    params: dict[str, object] = {
        "host": db.host,
        "port": db.port,
        "dbname": db.name,
        "user": db.user,
        "connect_timeout": db.connect_timeout_seconds,
        "application_name": APPLICATION_NAME,
        "options": session_options(db),
        # The client's own keepalives: a server that vanished ends the wait with an error.
        "keepalives": 1,
        "keepalives_idle": db.keepalive_idle_seconds,
        "keepalives_interval": KEEPALIVE_INTERVAL_SECONDS,
        "keepalives_count": KEEPALIVE_PROBES,
    }
    if password:
        params["password"] = password
    # RDS refuses IAM tokens over plain connections, so iam_auth implies SSL.
    if db.ssl or db.iam_auth:
        params["sslmode"] = "require"
    return make_conninfo("", **params)


def connect(
    db: DatabaseSettings, *, autocommit: bool = False, tokens: IamTokenCache | None = None
) -> psycopg.Connection:
    """A new psycopg connection to `db`; the caller closes it (use it as a context manager)."""
    return psycopg.connect(conninfo(db, tokens=tokens), autocommit=autocommit)
