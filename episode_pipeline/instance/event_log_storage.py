"""Dagster's Postgres event-log storage, keeping the partitioned checks' statuses between queries.

The UI asks for every partitioned check's status over all its partitions (`partitionStatuses`,
through `AssetCheckState`) on each asset graph query, three times on the asset page. Dagster
1.13's OSS storage keeps no checkpoint of that state (`get_checkpointed_asset_check_state`
returns an empty one), so every query rebuilds it from all of the check's executions, in
O(N²) of the episodes: it adds one partition at a time to an immutable subset (a copy of the
whole set each time) and asks the database whether each partition exists, a query per partition.

This storage keeps each check's latest execution per partition in memory and, per query, reads
only what changed since the previous one: the check and materialization events after the last
event id it saw (an index range of `event_logs`), then Dagster's own per-partition query for just
those partitions. It drops what no longer holds: partitions that were deleted (retention) or
deleted and added again (their row id changed), and it rebuilds everything from scratch every
`FULL_REFRESH_SECONDS`, which bounds any staleness (a run deleted by hand, an event committed
out of id order beyond `RESCAN_EVENT_IDS`). The statuses it returns are Dagster's: the same
rows, the same rules (`AssetCheckPartitionInfo.is_current`, `_process_run_statuses` for checks of
runs that ended without a result). Unpartitioned and non-dynamic checks keep Dagster's own path.

It also keeps each dynamic partitioned asset's partition status cache (materialized, failed,
in progress: the asset page's and partitions view's health bar) when the key set changes. Dagster
tags the stored cache with a hash of every partition key and rebuilds it from all of the asset's
events when the hash differs, so each added or pruned partition (10,000 uploads a day, a
campaign's waves) made the next page read every materialization and planned event again: 9.6 s
for the asset page at 30,000 live partitions during a campaign. This storage tags the cache
with the definition's name and newest partition row id instead of the hash and, when it is read,
keeps only the partitions that existed then and still do, and hands Dagster the current hash:
Dagster then reads only the events after the cache's cursor. A partition added since (a new row
id, also when it was deleted and added again) has no events before its addition (a run needs its
partition; retention deletes an episode's events with it), so it starts unmaterialized, as a
rebuild would say.

It relies on Dagster's private `AssetCheckState` and helpers
(docs/platform-notes.md#partitioned-check-statuses); `test_event_log_storage.py` fails if the
statuses the UI's GraphQL returns stop matching Dagster's own. dagster.yaml and the local
instance (`local/dagster_home.py`) name it as the `event_log_storage`.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as db
from dagster import AssetKey, DagsterEventType, DynamicPartitionsDefinition, PartitionsDefinition
from dagster._core.asset_graph_view.serializable_entity_subset import SerializableEntitySubset
from dagster._core.definitions.asset_key import AssetCheckKey
from dagster._core.definitions.partitions.subset.default import DefaultPartitionsSubset
from dagster._core.definitions.partitions.utils.base import (
    generate_partition_key_based_definition_id,
)
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.asset_check_execution_record import (
    AssetCheckExecutionRecordStatus,
    AssetCheckExecutionResolvedStatus,
    AssetCheckPartitionInfo,
)
from dagster._core.storage.asset_check_state import AssetCheckState, _process_run_statuses
from dagster._core.storage.dagster_run import FINISHED_STATUSES, RunsFilter
from dagster._core.storage.event_log.base import AssetRecord
from dagster._core.storage.event_log.schema import DynamicPartitionsTable, SqlEventLogStorageTable
from dagster._core.storage.partition_status_cache import AssetStatusCacheValue
from dagster._record import copy
from dagster._serdes import ConfigurableClassData, deserialize_value
from dagster_postgres.event_log.event_log import PostgresEventLogStorage
from dagster_postgres.utils import get_token_provider_from_config, pg_url_from_config

FULL_REFRESH_SECONDS = 3600.0
# Events are read again this far below the last id seen: an event whose id was taken before a
# later one's but committed after it is still found.
RESCAN_EVENT_IDS = 2_000
# More new check events than this (a burst of runs ended, or the first query in a while): every
# check is read again whole, one query each, rather than each event's body parsed.
READ_WHOLE_ABOVE_EVENTS = 5_000

CheckWithPartitions = tuple[AssetCheckKey, PartitionsDefinition | None]
PLANNED = AssetCheckExecutionRecordStatus.PLANNED
_RESOLVED = {
    AssetCheckExecutionRecordStatus.SUCCEEDED: AssetCheckExecutionResolvedStatus.SUCCEEDED,
    AssetCheckExecutionRecordStatus.FAILED: AssetCheckExecutionResolvedStatus.FAILED,
    PLANNED: AssetCheckExecutionResolvedStatus.IN_PROGRESS,
}
_CHECK_EVENTS = (
    DagsterEventType.ASSET_CHECK_EVALUATION.value,
    DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED.value,
)
_MATERIALIZATION = DagsterEventType.ASSET_MATERIALIZATION.value


# -- the pure part: what is kept, and how a change updates it -------------------------------------


@dataclass
class Changes:
    """What the events after the last id seen touched."""

    checks: dict[AssetCheckKey, set[str]] = field(default_factory=lambda: defaultdict(set))
    assets: dict[AssetKey, set[str]] = field(default_factory=lambda: defaultdict(set))
    reload_assets: set[AssetKey] = field(default_factory=set)  # a change of unknown partitions
    reload_all: bool = False

    def of(self, key: AssetCheckKey) -> set[str] | None:
        """The check's changed partitions; None when all of them must be read again."""
        if self.reload_all or key.asset_key in self.reload_assets:
            return None
        return self.checks.get(key, set()) | self.assets.get(key.asset_key, set())


@dataclass
class CheckPartitions:
    """One check's latest execution per partition, as far as its status goes: the status
    (`SUCCEEDED`/`FAILED` when it checked the asset's latest materialization, `PLANNED`), the run
    of a planned one, and the partition's row id when it was read."""

    partitions_def: str  # the dynamic partitions definition's name
    status: dict[str, AssetCheckExecutionRecordStatus] = field(default_factory=dict)
    planned_run: dict[str, str] = field(default_factory=dict)
    partition_id: dict[str, int] = field(default_factory=dict)
    version: int = 0  # bumped by every change: a state built at the same version still holds
    _built: tuple[Any, AssetCheckState] | None = None
    # The key set `keep_existing` last checked against: the storage hands the same mapping
    # until the partitions change, and whatever was recorded since came from it.
    _checked_ids: Mapping[str, int] | None = None

    def replace(
        self,
        partitions: Iterable[str] | None,
        infos: Iterable[AssetCheckPartitionInfo],
        partition_ids: Mapping[str, int],
    ) -> None:
        """Forget `partitions` (all when None), then record the latest executions read."""
        self.version += 1
        if partitions is None:
            self.status.clear()
            self.planned_run.clear()
            self.partition_id.clear()
        else:
            for partition in partitions:
                self.status.pop(partition, None)
                self.planned_run.pop(partition, None)
                self.partition_id.pop(partition, None)
        for info in infos:
            partition = info.partition_key
            if partition is None or partition not in partition_ids:
                continue
            status = info.latest_execution_status
            if status == PLANNED:
                self.planned_run[partition] = info.latest_planned_run_id
            elif status not in _RESOLVED or not info.is_current:
                continue  # the asset was materialized again after the check ran: no status
            self.status[partition] = status
            self.partition_id[partition] = partition_ids[partition]

    def keep_existing(self, partition_ids: Mapping[str, int]) -> None:
        """Drop partitions that were deleted, or deleted and added again, since they were read.
        Checked once per key set: every query would otherwise compare each check's partitions
        (12 checks x 30,000 at the window, 8 % of an asset page during a campaign)."""
        if partition_ids is self._checked_ids:
            return
        gone = [p for p, row in self.partition_id.items() if partition_ids.get(p) != row]
        if gone:
            self.replace(gone, (), partition_ids)
        self._checked_ids = partition_ids

    def state(
        self,
        key: AssetCheckKey,
        partitions_def: PartitionsDefinition,
        run_statuses: Mapping[str, Any],
        latest_storage_id: int,
    ) -> AssetCheckState:
        """Dagster's state of the check: a subset per status, planned partitions per run, and
        those of runs that ended without a result moved to skipped or execution-failed. Built
        again only when the partitions or the planned runs' statuses changed."""
        runs = sorted({(run, str(run_statuses.get(run))) for run in self.planned_run.values()})
        if self._built is not None and self._built[0] == (self.version, runs):
            return self._built[1]
        by_status: dict[AssetCheckExecutionResolvedStatus, list[str]] = defaultdict(list)
        for partition, status in self.status.items():
            by_status[_RESOLVED[status]].append(partition)
        by_run: dict[str, list[str]] = defaultdict(list)
        for partition, run_id in self.planned_run.items():
            by_run[run_id].append(partition)

        def subset(partitions: list[str]) -> SerializableEntitySubset[AssetCheckKey]:
            value = partitions_def.subset_with_partition_keys(partitions)
            return SerializableEntitySubset(key=key, value=value)

        subsets = {
            status: subset(by_status[status]) for status in AssetCheckExecutionResolvedStatus
        }
        in_progress = {run_id: subset(partitions) for run_id, partitions in by_run.items()}
        subsets, in_progress = _process_run_statuses(
            key, partitions_def, subsets, in_progress, run_statuses
        )
        built = AssetCheckState(
            latest_storage_id=latest_storage_id, subsets=subsets, in_progress_runs=in_progress
        )
        self._built = ((self.version, runs), built)
        return built


def changes_of(rows: Iterable[tuple[str, str | None, str | None, str]]) -> Changes:
    """The partitions that events touched, from `(event type, asset key, partition, event)`
    rows: a materialization names its asset and partition in its columns, a check's event
    (planned or evaluated) in its body."""
    changes = Changes()
    for event_type, asset_key, partition, body in rows:
        if event_type == _MATERIALIZATION:
            if asset_key is None:
                continue
            key = AssetKey.from_db_string(asset_key)
            if key is None:
                continue
            if partition is None:
                changes.reload_assets.add(key)  # an unpartitioned materialization: every partition
            else:
                changes.assets[key].add(partition)
            continue
        entry = deserialize_value(body, EventLogEntry)
        data = entry.dagster_event.event_specific_data if entry.dagster_event else None
        check_key = getattr(data, "asset_check_key", None)
        if check_key is None:
            continue
        single = getattr(data, "partition", None)
        subset = getattr(data, "partitions_subset", None)
        if single is not None:
            changes.checks[check_key].add(single)
        elif subset is not None:
            changes.checks[check_key].update(subset.get_partition_keys())
        else:
            changes.reload_assets.add(check_key.asset_key)
    return changes


# Where Dagster stores a hash of the key set, the stored cache names the definition and the
# newest partition row id it was built with: `…:episodes:1234`.
STATUS_CACHE_ID_PREFIX = "episode_pipeline/dynamic-partitions:"


@dataclass(frozen=True)
class KeySet:
    """A dynamic definition's partitions now: Dagster's id for them and each one's row id."""

    definition_id: str  # Dagster's: a hash of the keys in the order they were added
    row_ids: Mapping[str, int]

    @property
    def newest_row_id(self) -> int:
        return max(self.row_ids.values(), default=0)


def status_cache_to_store(
    value: AssetStatusCacheValue, key_sets: Mapping[str, KeySet]
) -> AssetStatusCacheValue:
    """The cache as stored: tagged with the dynamic definition whose current keys it was built
    for, or as Dagster made it (a static definition, or keys that changed since)."""
    for name, keys in key_sets.items():
        if keys.definition_id == value.partitions_def_id:
            tag = f"{STATUS_CACHE_ID_PREFIX}{name}:{keys.newest_row_id}"
            return value._replace(partitions_def_id=tag)
    return value


def stored_with(value: AssetStatusCacheValue | None) -> tuple[str, int] | None:
    """The definition and newest row id a stored cache was built with, if it is tagged so."""
    stored_id = value.partitions_def_id if value is not None else None
    if stored_id is None or not stored_id.startswith(STATUS_CACHE_ID_PREFIX):
        return None
    name, _, newest = stored_id.removeprefix(STATUS_CACHE_ID_PREFIX).rpartition(":")
    return name, int(newest)


def status_cache_for_keys(
    value: AssetStatusCacheValue, built_with_newest: int, keys: KeySet
) -> AssetStatusCacheValue:
    """A stored cache as Dagster reads it, with today's id: its subsets hold only partitions that
    existed when it was built and still do. One added since (a new one, or one deleted and added
    again: a new row id) has no events before its addition, which the cache's cursor has passed;
    its later events are after the cursor, where Dagster reads on."""

    def within(serialized: str | None) -> str | None:
        if serialized is None:
            return None
        kept = {
            key
            for key in DefaultPartitionsSubset.from_serialized(_ANY_DYNAMIC, serialized).subset
            if keys.row_ids.get(key, built_with_newest + 1) <= built_with_newest
        }
        return DefaultPartitionsSubset(kept).serialize()

    return value._replace(
        partitions_def_id=keys.definition_id,
        serialized_materialized_partition_subset=within(
            value.serialized_materialized_partition_subset
        ),
        serialized_failed_partition_subset=within(value.serialized_failed_partition_subset),
        serialized_in_progress_partition_subset=within(
            value.serialized_in_progress_partition_subset
        ),
    )


_ANY_DYNAMIC = DynamicPartitionsDefinition(name="any")  # a default subset ignores its definition


# -- the storage ----------------------------------------------------------------------------------


class EpisodeEventLogStorage(PostgresEventLogStorage):
    """`PostgresEventLogStorage` (same config) that keeps dynamic partitioned checks' statuses."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._checks: dict[AssetCheckKey, CheckPartitions] = {}
        self._last_event_id = 0
        self._seen_event_ids: set[int] = set()
        self._partitions: dict[str, tuple[Any, dict[str, int]]] = {}  # name → (mark, ids)
        self._refreshed_at = 0.0
        # Re-entrant: reading the checks' partitions reads asset records, which reads the key sets.
        self._checks_lock = threading.RLock()
        self._key_sets: dict[str, tuple[Any, KeySet]] = {}  # name → (mark, its keys)
        self._read_caches = ReadStatusCaches()

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: Mapping[str, Any]
    ) -> EpisodeEventLogStorage:
        return cls(
            inst_data=inst_data,
            postgres_url=pg_url_from_config(config_value),
            should_autocreate_tables=config_value.get("should_autocreate_tables", True),
            token_provider=get_token_provider_from_config(config_value),
        )

    def get_asset_check_state(
        self, keys: Sequence[CheckWithPartitions]
    ) -> Mapping[AssetCheckKey, AssetCheckState]:
        dynamic = [
            (key, partitions_def)
            for key, partitions_def in keys
            if isinstance(partitions_def, DynamicPartitionsDefinition) and partitions_def.name
        ]
        others = [item for item in keys if item not in dynamic]
        states = dict(super().get_asset_check_state(others)) if others else {}
        if dynamic:
            with self._checks_lock:
                states.update(self._dynamic_check_states(dynamic))
        return states

    def _dynamic_check_states(
        self, keys: Sequence[tuple[AssetCheckKey, DynamicPartitionsDefinition]]
    ) -> dict[AssetCheckKey, AssetCheckState]:
        if time.monotonic() - self._refreshed_at > FULL_REFRESH_SECONDS:
            self._checks.clear()
            self._partitions.clear()
            self._refreshed_at = time.monotonic()
        if not self._checks:  # read the events before the executions: none is missed
            self._seen_event_ids.clear()
            self._last_event_id = self._max_event_id()
            self._changes_since(self._last_event_id)  # those the executions will show
            changes = Changes()
        else:
            changes = self._changes_since(self._last_event_id)
        # every check kept takes the changes, not only those asked for now: the next query
        # starts after them
        names = {d.name for _, d in keys} | {kept.partitions_def for kept in self._checks.values()}
        partition_ids = self._partition_ids({name for name in names if name})
        for key, kept in self._checks.items():
            ids = partition_ids.get(kept.partitions_def, {})
            changed = changes.of(key)
            if changed is None or changed:
                read = None if changed is None else sorted(changed)
                kept.replace(read, self.get_asset_check_partition_info([key], None, read), ids)
            kept.keep_existing(ids)
        for key, partitions_def in keys:
            if key not in self._checks:
                kept = self._checks[key] = CheckPartitions(partitions_def.name)
                ids = partition_ids.get(partitions_def.name, {})
                kept.replace(None, self.get_asset_check_partition_info([key]), ids)
        planned = {run for key, _ in keys for run in self._checks[key].planned_run.values()}
        finished = (
            self._instance.get_runs(RunsFilter(run_ids=sorted(planned), statuses=FINISHED_STATUSES))
            if planned
            else []
        )
        run_statuses = {run.run_id: run.status for run in finished}
        return {
            key: self._checks[key].state(key, partitions_def, run_statuses, self._last_event_id)
            for key, partitions_def in keys
        }

    def update_asset_cached_status_data(
        self, asset_key: AssetKey, cache_values: AssetStatusCacheValue
    ) -> None:
        stored = status_cache_to_store(cache_values, self._dynamic_key_sets())
        super().update_asset_cached_status_data(asset_key, stored)

    def get_asset_records(
        self, asset_keys: Sequence[AssetKey] | None = None
    ) -> Sequence[AssetRecord]:
        records = super().get_asset_records(asset_keys)
        if not any(stored_with(record.asset_entry.cached_status) for record in records):
            return records
        key_sets = self._dynamic_key_sets()
        return [self._read_caches.record(record, key_sets) for record in records]

    def _dynamic_key_sets(self) -> dict[str, KeySet]:
        """Every dynamic definition's key set, hashed again only when its keys changed."""
        with self._checks_lock:
            key_sets = {}
            for name, row_ids in self._partition_ids(None).items():
                mark = self._partitions[name][0]
                kept = self._key_sets.get(name)
                if kept is None or kept[0] != mark:
                    ordered = sorted(row_ids, key=row_ids.__getitem__)
                    keys = KeySet(generate_partition_key_based_definition_id(ordered), row_ids)
                    kept = self._key_sets[name] = (mark, keys)
                key_sets[name] = kept[1]
            return key_sets

    def _max_event_id(self) -> int:
        query = db.select(db.func.max(SqlEventLogStorageTable.c.id))
        with self.index_connection() as conn:
            return conn.execute(query).scalar() or 0

    def _changes_since(self, last_event_id: int) -> Changes:
        """The partitions touched by events not seen yet, from `RESCAN_EVENT_IDS` below the
        last id seen on (whose bodies are read only for check events not seen before)."""
        table = SqlEventLogStorageTable.c
        window = last_event_id - RESCAN_EVENT_IDS
        query = db.select(table.id, table.dagster_event_type, table.asset_key, table.partition)
        query = query.where(
            table.dagster_event_type.in_([*_CHECK_EVENTS, _MATERIALIZATION]), table.id > window
        )
        with self.index_connection() as conn:
            rows = [row for row in conn.execute(query) if row[0] not in self._seen_event_ids]
            bodies: dict[int, str] = {}
            check_ids = [row[0] for row in rows if row[1] != _MATERIALIZATION]
            whole = len(check_ids) > READ_WHOLE_ABOVE_EVENTS
            if check_ids and not whole:
                bodies_query = db.select(table.id, table.event).where(table.id.in_(check_ids))
                bodies = dict(conn.execute(bodies_query).all())
        self._seen_event_ids = {i for i in self._seen_event_ids if i > window}
        self._seen_event_ids.update(row[0] for row in rows)
        self._last_event_id = max([last_event_id, *(row[0] for row in rows)])
        if whole:
            return Changes(reload_all=True)
        return changes_of((row[1], row[2], row[3], bodies.get(row[0], "")) for row in rows)

    def _partition_ids(self, names: set[str] | None) -> dict[str, dict[str, int]]:
        """Each definition's partitions (all definitions' when `names` is None) and their row
        ids, read again only when its newest id or its count moved (ids only grow: any
        addition or deletion moves one of them)."""
        table = DynamicPartitionsTable.c
        summary = db.select(table.partitions_def_name, db.func.max(table.id), db.func.count())
        if names is not None:
            summary = summary.where(table.partitions_def_name.in_(sorted(names)))
        with self.index_connection() as conn:
            marks = {name: (newest, count) for name, newest, count in conn.execute(
                summary.group_by(table.partitions_def_name))}  # fmt: skip
            names = set(marks) if names is None else names
            stale = sorted(
                n for n in names if self._partitions.get(n, (None, {}))[0] != marks.get(n)
            )
            if stale:
                query = db.select(table.partitions_def_name, table.partition, table.id)
                found: dict[str, dict[str, int]] = {name: {} for name in stale}
                for name, partition, row_id in conn.execute(
                    query.where(table.partitions_def_name.in_(stale))
                ):
                    found[name][partition] = row_id
                for name in stale:
                    self._partitions[name] = (marks.get(name), found[name])
        return {name: self._partitions[name][1] for name in names}


class ReadStatusCaches:
    """Each asset's stored status cache as Dagster reads it (`status_cache_for_keys`), made again
    only when the stored cache or the key set changed: the UI reads the asset records several
    times a page, and each making parses, filters and serializes every partition key (6 % of an
    asset page at 30,000 live partitions during a campaign)."""

    def __init__(self) -> None:
        self._made: dict[AssetKey, tuple[tuple[Any, ...], AssetStatusCacheValue]] = {}
        self._lock = threading.Lock()

    def record(self, record: AssetRecord, key_sets: Mapping[str, KeySet]) -> AssetRecord:
        cached = record.asset_entry.cached_status
        built_with = stored_with(cached)
        if cached is None or built_with is None:
            return record
        name, newest = built_with
        keys = key_sets.get(name, KeySet("", {}))
        made_from = (cached, newest, keys.definition_id)
        key = record.asset_entry.asset_key
        with self._lock:
            found = self._made.get(key)
        if found is not None and found[0] == made_from:
            current = found[1]
        else:
            current = status_cache_for_keys(cached, newest, keys)
            with self._lock:
                self._made[key] = (made_from, current)
        return copy(record, asset_entry=copy(record.asset_entry, cached_status=current))
