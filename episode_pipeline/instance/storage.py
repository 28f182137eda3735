"""Dagster's PostgreSQL storages, keeping a few connections open (production's dagster.yaml).

dagster-postgres opens a new connection for every statement outside the webserver (SQLAlchemy's
`NullPool`). Creating one run writes ~40 of them (the run, its tags, its snapshots, a planned
event per asset and per check, each check's planned row), so the daemon spent most of a burst
connecting: a PostgreSQL connection costs ~30 ms here against ~0.7 ms a statement, and on Aurora
each one is a TLS handshake and an IAM token too. These subclasses are the same storages with a
`QueuePool` (`pool_size` kept open per storage and process, `max_overflow` more at a peak,
checked before use and replaced after `pool_recycle_seconds`); docs/scale.md has the figures. The
webserver still swaps in its own pool (`optimize_for_webserver`, ours closed first); `dispose`
closes the pool, so an instance made for one sensor tick leaves no connection behind.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from dagster import Field, IntSource
from dagster._serdes import ConfigurableClassData
from dagster_postgres import PostgresRunStorage, PostgresScheduleStorage
from dagster_postgres.utils import (
    create_pg_engine,
    get_token_provider_from_config,
    pg_config,
    pg_url_from_config,
)

from episode_pipeline.instance.event_log_storage import EpisodeEventLogStorage

# Per storage and process: the daemon's busiest moment is 4 submit workers, 4 sensor threads and
# 4 dequeue workers at once; a run worker or a code server uses one or two.
POOL_SIZE = 4
MAX_OVERFLOW = 12
# Connections are re-made after this long (an Aurora failover, an IAM token's 15 minutes only
# matter at connect time); each is also pinged before use.
POOL_RECYCLE_SECONDS = 600


# Every pooled engine of this process. A child forked from it must not use the parent's
# connections (two processes on one socket): SQLAlchemy's recipe is `dispose(close=False)` in the
# child. Nothing of ours forks with a pool today (run workers are spawned, the executor runs in
# process), so this keeps a later `fork` start method from becoming a corrupted connection.
_ENGINES: weakref.WeakSet[Any] = weakref.WeakSet()


def _forget_inherited_connections() -> None:
    for engine in list(_ENGINES):
        engine.dispose(close=False)


os.register_at_fork(after_in_child=_forget_inherited_connections)


def pool_config() -> dict[str, Field]:
    return {
        "pool_size": Field(IntSource, is_required=False, default_value=POOL_SIZE),
        "max_overflow": Field(IntSource, is_required=False, default_value=MAX_OVERFLOW),
        "pool_recycle_seconds": Field(
            IntSource, is_required=False, default_value=POOL_RECYCLE_SECONDS
        ),
    }


class _Pooled:
    """What the three storages add: a pooled engine, closed on `dispose`."""

    postgres_url: str
    _token_provider: Any
    _engine: Any

    @classmethod
    def config_type(cls) -> Any:
        return {**pg_config(), **pool_config()}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value: Any) -> Any:
        storage = cls(  # type: ignore[call-arg]
            inst_data=inst_data,
            postgres_url=pg_url_from_config(config_value),
            should_autocreate_tables=config_value.get("should_autocreate_tables", True),
            token_provider=get_token_provider_from_config(config_value),
        )
        storage.use_pool(config_value)
        return storage

    def use_pool(self, config: Any) -> None:
        self._engine.dispose()  # the NullPool engine the storage was made with
        self._engine = create_pg_engine(
            self.postgres_url,
            self._token_provider,
            isolation_level="AUTOCOMMIT",
            pool_size=config.get("pool_size", POOL_SIZE),
            max_overflow=config.get("max_overflow", MAX_OVERFLOW),
            pool_recycle=config.get("pool_recycle_seconds", POOL_RECYCLE_SECONDS),
            pool_pre_ping=True,
        )
        _ENGINES.add(self._engine)

    def optimize_for_webserver(self, *args: Any, **kwargs: Any) -> None:
        """Dagster's webserver pool replaces ours; ours is closed first, not left to the GC."""
        self._engine.dispose()
        super().optimize_for_webserver(*args, **kwargs)  # type: ignore[misc]
        _ENGINES.add(self._engine)

    def dispose(self) -> None:
        super().dispose()  # type: ignore[misc]
        self._engine.dispose()


class PooledPostgresRunStorage(_Pooled, PostgresRunStorage):
    """dagster-postgres's run storage, pooled."""


class PooledEpisodeEventLogStorage(_Pooled, EpisodeEventLogStorage):
    """Our event-log storage (instance/event_log_storage.py), pooled."""


class PooledPostgresScheduleStorage(_Pooled, PostgresScheduleStorage):
    """dagster-postgres's schedule storage, pooled."""
