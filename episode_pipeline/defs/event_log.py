"""Reads of Dagster's event log: what an asset last recorded, which worker a run started, how an
episode's checks last ended. Assets, checks, the failure policy and the report ask here."""

from __future__ import annotations

from typing import Any

from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    EventLogRecord,
)
from dagster._core.event_api import PartitionKeyFilter
from dagster._core.storage.asset_check_execution_record import (
    AssetCheckExecutionRecord,
    AssetCheckExecutionRecordStatus,
)


def latest_materialization_metadata(
    instance: DagsterInstance, asset_key: AssetKey, partition_key: str
) -> dict[str, Any]:
    """The metadata of the asset's newest materialization of this partition ({} if none)."""
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=asset_key, asset_partitions=[partition_key]), limit=1
    ).records
    if not records or records[0].asset_materialization is None:
        return {}
    return {k: v.value for k, v in records[0].asset_materialization.metadata.items()}


def latest_observation(
    instance: DagsterInstance, asset_key: AssetKey, partition_key: str
) -> EventLogRecord | None:
    """The asset's newest observation of this partition, or None."""
    records = instance.fetch_observations(
        AssetRecordsFilter(asset_key=asset_key, asset_partitions=[partition_key]), limit=1
    ).records
    return records[0] if records else None


# The engine event the code server's run worker reports first (dagster/_grpc/impl.py).
WORKER_STARTED_PREFIX = "Started process for run (pid: "


def launched_worker_pid(instance: DagsterInstance, run: DagsterRun) -> int | None:
    """The pid of the newest worker process started for a launched run, or None."""
    pid = None
    for entry in instance.all_logs(run.run_id, of_type=DagsterEventType.ENGINE_EVENT):
        if entry.message.startswith(WORKER_STARTED_PREFIX) and entry.dagster_event is not None:
            value = entry.dagster_event.engine_event_data.metadata.get("pid")
            text = str(getattr(value, "value", ""))
            pid = int(text) if text.isdigit() else pid
    return pid


def latest_check_executions(
    instance: DagsterInstance, check_keys: list[AssetCheckKey], partition_key: str
) -> list[tuple[AssetCheckKey, AssetCheckExecutionRecord]]:
    """Each check's newest execution for this partition, by name: one keyed read."""
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        check_keys, partition_filter=PartitionKeyFilter(key=partition_key)
    )
    return sorted(latest.items(), key=lambda item: item[0].name)


def latest_check_results(
    instance: DagsterInstance, check_keys: list[AssetCheckKey], partition_key: str
) -> dict[str, bool]:
    """Each check's newest finished result for this partition, by name (passed or not)."""
    results = {}
    for key, record in latest_check_executions(instance, check_keys, partition_key):
        if record.status == AssetCheckExecutionRecordStatus.SUCCEEDED:
            results[key.name] = True
        elif record.status == AssetCheckExecutionRecordStatus.FAILED:
            results[key.name] = False
    return results
