"""Reads of Dagster's event log: what an asset last recorded, which worker a run started, how an
episode's checks last ended. Assets, checks, the failure policy and the report ask here."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    EventLogRecord,
    RunsFilter,
)

from episode_pipeline.dagster_compat import (
    PARTITION_NAME_TAG,
    AssetCheckExecutionRecord,
    AssetCheckExecutionRecordStatus,
)
from episode_pipeline.defs.asset_keys import HLS_RENDITIONS_KEY
from episode_pipeline.orchestration.dagster_tables import check_executions


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


def table_rows(metadata: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The rows of a table entry of recorded metadata, as dicts ([] when there is none)."""
    return [dict(r.data) for r in getattr(metadata.get(name), "records", None) or []]


def recorded_sources(
    instance: DagsterInstance, partition_key: str
) -> dict[str, list[dict[str, Any]]]:
    """The `sources` table of the latest `hls_renditions` materialization (the transcode's probe
    of each mp4), by camera ({} when none)."""
    metadata = latest_materialization_metadata(instance, HLS_RENDITIONS_KEY, partition_key)
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in table_rows(metadata, "sources"):
        rows[row["camera"]].append(row)
    return rows


def latest_observation(
    instance: DagsterInstance, asset_key: AssetKey, partition_key: str
) -> EventLogRecord | None:
    """The asset's newest observation of this partition, or None."""
    records = instance.fetch_observations(
        AssetRecordsFilter(asset_key=asset_key, asset_partitions=[partition_key]), limit=1
    ).records
    return records[0] if records else None


# The newest runs of an episode its checks' latest results are looked for in (retention keeps
# a few runs per episode; a check run alone from the UI is one of them).
RUNS_OF_A_PARTITION = 50


def latest_check_executions(
    instance: DagsterInstance, check_keys: list[AssetCheckKey], partition_key: str
) -> list[tuple[AssetCheckKey, AssetCheckExecutionRecord]]:
    """Each check's newest execution for this partition, by name.

    Read through the partition's runs (the `run_tags` index), then `asset_check_executions` by
    run id, which its unique index holds after the asset key and check name. Dagster's own
    lookup by partition reads every execution of each check: `partition` is the last column of
    both of that table's indexes.
    """
    run_ids = [
        record.dagster_run.run_id
        for record in instance.get_run_records(
            RunsFilter(tags={PARTITION_NAME_TAG: partition_key}), limit=RUNS_OF_A_PARTITION
        )
    ]
    if not run_ids or not check_keys:
        return []
    wanted = {(key.asset_key.to_string(), key.name): key for key in check_keys}
    latest: dict[AssetCheckKey, AssetCheckExecutionRecord] = {}
    for row in check_executions(instance, check_keys, run_ids, partition_key):  # newest first
        key = wanted.get((row["asset_key"], row["check_name"]))
        if key is not None and key not in latest:
            latest[key] = AssetCheckExecutionRecord.from_db_row(row, key)
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


def latest_check_evaluation(
    instance: DagsterInstance, check_key: AssetCheckKey, partition_key: str
) -> dict[str, Any] | None:
    """The check's newest evaluation of this partition as plain values: `passed`, `severity`
    (its value) and `metadata` (None: never run). Read through the partition's runs, as
    `latest_check_executions` reads, not by Dagster's partition filter."""
    latest = dict(latest_check_executions(instance, [check_key], partition_key)).get(check_key)
    event = latest.event if latest else None
    evaluation = event.dagster_event.event_specific_data if event and event.dagster_event else None
    if not isinstance(evaluation, AssetCheckEvaluation):
        return None
    return {
        "passed": evaluation.passed,
        "severity": evaluation.severity.value,
        "metadata": {name: value.value for name, value in evaluation.metadata.items()},
    }
