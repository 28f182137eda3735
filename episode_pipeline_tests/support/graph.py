"""What a processed episode left: its report, its assets' metadata, its checks' evaluations."""

from __future__ import annotations

from dagster import AssetCheckKey, AssetKey, AssetRecordsFilter, DagsterInstance

from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.report import episode_reports
from episode_pipeline_tests.support.dagster_internals import PartitionKeyFilter


def report_for(ref: EpisodeRef) -> dict:
    (report,) = episode_reports(ref)
    return report


def latest_metadata(ref: EpisodeRef, asset: str) -> dict:
    """The metadata of the asset's newest materialization for the episode."""
    records = (
        DagsterInstance.get()
        .fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[ref.partition_key]),
            limit=1,
        )
        .records
    )
    materialization = records[0].asset_materialization
    return {key: value.value for key, value in materialization.metadata.items()}


def check_evaluation(ref: EpisodeRef, asset: str, name: str):
    """The latest evaluation of one check for the episode (passed, description, metadata)."""
    key = AssetCheckKey(AssetKey(asset), name)
    latest = DagsterInstance.get().event_log_storage.get_latest_asset_check_execution_by_key(
        [key], partition_filter=PartitionKeyFilter(key=ref.partition_key)
    )
    return latest[key].event.dagster_event.event_specific_data
