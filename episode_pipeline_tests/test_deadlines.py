"""Every external wait has a deadline that ends it with a named error (docs/faults.md).

S3 against a server that accepts connections and never answers; PostgreSQL's statement, lock,
idle-in-transaction and connect deadlines on the embedded server; the whole run's deadline in
both Dagster instances. FFmpeg and the transcode step have their own (test_hls.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import botocore.exceptions
import psycopg
import pytest
import yaml

from episode_pipeline.config.settings import AwsSettings, DatabaseSettings, S3Deadlines, Settings
from episode_pipeline.db.connection import connect
from episode_pipeline.local.dagster_home import RUN_MAX_RUNTIME_SECONDS, instance_config
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline_tests.support.dagster_internals import dagster_instance_config

REPO = Path(__file__).parents[1]


class SilentServer:
    """Accepts TCP connections on 127.0.0.1 and never sends a byte; counts the connections."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self.accepted.append(conn)

    def close(self) -> None:
        for conn in self.accepted:
            conn.close()
        self.sock.close()


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


def test_the_s3_client_carries_the_configured_deadlines():
    deadlines = S3Deadlines(connect_timeout_seconds=3, read_timeout_seconds=7, max_attempts=4)
    config = Bucket("b", AwsSettings(), deadlines).client.meta.config
    assert (config.connect_timeout, config.read_timeout) == (3, 7)
    assert config.retries == {"mode": "standard", "total_max_attempts": 4}


def test_an_s3_server_that_never_answers_ends_in_a_read_timeout_after_bounded_retries(
    silent_server: SilentServer,
):
    aws = AwsSettings(
        endpoint_url=f"http://127.0.0.1:{silent_server.port}",
        access_key_id="testing",
        secret_access_key="testing",
    )
    deadlines = S3Deadlines(connect_timeout_seconds=1, read_timeout_seconds=0.5, max_attempts=2)
    with pytest.raises(botocore.exceptions.ReadTimeoutError):
        Bucket("b", aws, deadlines).head("orgs/a/episodes/e/x.tar.zst")
    assert len(silent_server.accepted) == 2  # the first try and one retry, then it gave up


def test_deadline_settings_come_from_the_environment_and_bad_values_are_named():
    env = {
        "DB_HOST": "h",
        "DATA_BUCKET": "b",
        "DB_STATEMENT_TIMEOUT_SECONDS": "30",
        "S3_READ_TIMEOUT_SECONDS": "2.5",
        "SQS_VISIBILITY_TIMEOUT_SECONDS": "60",
        "SQS_HEARTBEAT_SECONDS": "15",
        "ARCHIVE_MAX_MEMBERS": "10",
    }
    settings = Settings.from_env(env)
    assert settings.database.statement_timeout_seconds == 30
    assert settings.database.lock_timeout_seconds == 60  # the default
    assert settings.s3_deadlines.read_timeout_seconds == 2.5
    assert (settings.queue.visibility_timeout_seconds, settings.queue.heartbeat_seconds) == (60, 15)
    assert settings.archive_limits.max_members == 10
    with pytest.raises(RuntimeError, match="DB_LOCK_TIMEOUT_SECONDS='soon' is not a number"):
        Settings.from_env({**env, "DB_LOCK_TIMEOUT_SECONDS": "soon"})
    with pytest.raises(RuntimeError, match="SQS_HEARTBEAT_SECONDS=60 must be below"):
        Settings.from_env({**env, "SQS_HEARTBEAT_SECONDS": "60"})


def test_the_run_deadline_is_the_same_in_production_and_locally(tmp_path: Path):
    production = yaml.safe_load((REPO / "dagster.yaml").read_text())
    assert production["run_monitoring"]["max_runtime_seconds"] == RUN_MAX_RUNTIME_SECONDS
    local = instance_config("pw", 5432)
    assert local["run_monitoring"]["max_runtime_seconds"] == RUN_MAX_RUNTIME_SECONDS
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(local))
    dagster_instance_config(str(tmp_path))  # Dagster's own schema accepts it


# -- PostgreSQL, on the embedded server ------------------------------------------------------------


@pytest.mark.integration
def test_a_statement_past_its_deadline_is_cancelled(settings: Settings):
    quick = dataclasses.replace(settings.database, statement_timeout_seconds=1)
    with connect(quick) as conn, pytest.raises(psycopg.errors.QueryCanceled, match="statement"):
        conn.execute("SELECT pg_sleep(5)")


@pytest.mark.integration
def test_a_lock_held_by_a_stuck_session_ends_the_waiter_with_a_named_error(settings: Settings):
    quick = dataclasses.replace(settings.database, lock_timeout_seconds=1)
    with connect(settings.database) as holder, connect(quick) as waiter:
        holder.execute("SELECT pg_advisory_xact_lock(4242)")
        with pytest.raises(psycopg.errors.LockNotAvailable, match="lock timeout"):
            waiter.execute("SELECT pg_advisory_xact_lock(4242)")


@pytest.mark.integration
def test_a_session_left_idle_inside_a_transaction_is_ended_by_the_server(settings: Settings):
    quick = dataclasses.replace(settings.database, idle_in_transaction_timeout_seconds=1)
    with connect(quick) as conn:
        conn.execute("SELECT 1")  # opens the transaction, then the client stalls past the limit
        time.sleep(2.5)
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            conn.execute("SELECT 1")


def test_connecting_to_a_server_that_never_answers_times_out(silent_server: SilentServer):
    nowhere = DatabaseSettings(host="127.0.0.1", port=silent_server.port, connect_timeout_seconds=1)
    with pytest.raises(psycopg.OperationalError, match="timeout"):
        connect(nowhere)
