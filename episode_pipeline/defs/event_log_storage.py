"""Dagster's Postgres event-log storage, with the partitioned checks' statuses computed in one pass.

The UI asks for every partitioned check's status over all its partitions (`partitionStatuses`,
through `AssetCheckState`) on each asset graph query. Dagster 1.13's OSS storage keeps no
checkpoint of that state, so each query rebuilds it from the check's executions, and the rebuild
costs O(N²) in the episodes: it adds one partition at a time to an immutable subset (a copy of
the whole set each time) and asks the database whether each partition exists, one query per
partition. This storage rebuilds the same state in O(N): the same executions query, one batched
existence lookup per check, each status's subset made once. Unpartitioned and non-dynamic checks
keep Dagster's own computation.

It relies on Dagster's private `AssetCheckState` and its helper `_process_run_statuses`
(docs/platform-notes.md#partitioned-check-statuses); `test_event_log_storage.py` fails if the
statuses the UI's GraphQL returns stop matching Dagster's own. dagster.yaml and the local
instance (`local/dagster_home.py`) name it as `event_log_storage`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from dagster import DynamicPartitionsDefinition, PartitionsDefinition
from dagster._core.asset_graph_view.serializable_entity_subset import SerializableEntitySubset
from dagster._core.definitions.asset_key import AssetCheckKey
from dagster._core.definitions.partitions.context import partition_loading_context
from dagster._core.storage.asset_check_execution_record import (
    AssetCheckExecutionRecordStatus,
    AssetCheckExecutionResolvedStatus,
    AssetCheckPartitionInfo,
)
from dagster._core.storage.asset_check_state import AssetCheckState, _process_run_statuses
from dagster._core.storage.dagster_run import FINISHED_STATUSES, RunsFilter
from dagster._serdes import ConfigurableClassData
from dagster_postgres.event_log.event_log import PostgresEventLogStorage
from dagster_postgres.utils import get_token_provider_from_config, pg_url_from_config

CheckWithPartitions = tuple[AssetCheckKey, PartitionsDefinition | None]

_FINAL_STATUSES = {
    AssetCheckExecutionRecordStatus.SUCCEEDED: AssetCheckExecutionResolvedStatus.SUCCEEDED,
    AssetCheckExecutionRecordStatus.FAILED: AssetCheckExecutionResolvedStatus.FAILED,
}


class EpisodeEventLogStorage(PostgresEventLogStorage):
    """`PostgresEventLogStorage` (same config) whose check states are computed in one pass."""

    # when False, every check goes through Dagster's own computation (the benchmark's baseline)
    linear_check_states: bool = True

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
            if self.linear_check_states and isinstance(partitions_def, DynamicPartitionsDefinition)
        ]
        others = [item for item in keys if item not in dynamic]
        states = dict(super().get_asset_check_state(others)) if others else {}
        if dynamic:
            states.update(dynamic_check_states(self, dynamic))
        return states


def dynamic_check_states(
    storage: PostgresEventLogStorage,
    keys: Sequence[tuple[AssetCheckKey, DynamicPartitionsDefinition]],
) -> dict[AssetCheckKey, AssetCheckState]:
    """Each check's state from scratch, as `bulk_update_asset_check_state` computes it from an
    empty checkpoint, in time linear in the check's partitions."""
    infos = storage.get_asset_check_partition_info([key for key, _ in keys])
    infos_by_key: dict[AssetCheckKey, list[AssetCheckPartitionInfo]] = defaultdict(list)
    for info in infos:
        infos_by_key[info.check_key].append(info)
    planned = {
        info.latest_planned_run_id
        for info in infos
        if info.latest_execution_status == AssetCheckExecutionRecordStatus.PLANNED
    }
    finished = (
        storage._instance.get_runs(  # noqa: SLF001 (the storage's own instance)
            filters=RunsFilter(run_ids=sorted(planned), statuses=FINISHED_STATUSES)
        )
        if planned
        else []
    )
    run_statuses = {run.run_id: run.status for run in finished}
    return {
        key: _state_of(key, partitions_def, infos_by_key[key], run_statuses, storage)
        for key, partitions_def in keys
    }


def _existing(
    partitions_def: DynamicPartitionsDefinition, keys: Sequence[str], storage: Any
) -> set[str]:
    """Which of the keys are partitions now: one batched lookup, through the request's cache."""
    with partition_loading_context() as context:
        store = context.dynamic_partitions_store or storage._instance  # noqa: SLF001
        return set(store.get_existing_dynamic_partitions(partitions_def.name, keys))


def _state_of(
    key: AssetCheckKey,
    partitions_def: DynamicPartitionsDefinition,
    infos: Sequence[AssetCheckPartitionInfo],
    run_statuses: Mapping[str, Any],
    storage: Any,
) -> AssetCheckState:
    existing = _existing(partitions_def, [i.partition_key for i in infos if i.partition_key], storage)
    keys_by_status: dict[AssetCheckExecutionResolvedStatus, set[str]] = defaultdict(set)
    keys_by_run: dict[str, set[str]] = defaultdict(set)
    for info in infos:  # one row per partition: its latest execution
        partition = info.partition_key
        if partition not in existing:
            continue
        if info.latest_execution_status == AssetCheckExecutionRecordStatus.PLANNED:
            keys_by_status[AssetCheckExecutionResolvedStatus.IN_PROGRESS].add(partition)
            keys_by_run[info.latest_planned_run_id].add(partition)
        elif info.latest_execution_status in _FINAL_STATUSES and info.is_current:
            keys_by_status[_FINAL_STATUSES[info.latest_execution_status]].add(partition)
        # else: the asset was materialized again after the check ran: no status

    def subset(partitions: set[str]) -> SerializableEntitySubset[AssetCheckKey]:
        return SerializableEntitySubset(
            key=key, value=partitions_def.subset_with_partition_keys(sorted(partitions))
        )

    subsets = {status: subset(keys_by_status[status]) for status in AssetCheckExecutionResolvedStatus}
    in_progress = {run_id: subset(partitions) for run_id, partitions in keys_by_run.items()}
    subsets, in_progress = _process_run_statuses(
        key, partitions_def, subsets, in_progress, run_statuses
    )
    latest_storage_id = max(
        (max(i.latest_check_event_storage_id, i.latest_materialization_storage_id or 0) for i in infos),
        default=0,
    )
    return AssetCheckState(
        latest_storage_id=latest_storage_id, subsets=subsets, in_progress_runs=in_progress
    )
