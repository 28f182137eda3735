"""`raw_archive`'s observations: an upload's ETag recorded as the archive's data version, so an
episode shows stale the moment a run is requested for new bytes (the uploads and lost-uploads
sensors) and an extraction points its provenance at the bytes it read (`defs/assets/archive.py`)."""

from __future__ import annotations

from typing import Any

from dagster import AssetObservation, DagsterInstance

from episode_pipeline.dagster_compat import DATA_VERSION_TAG
from episode_pipeline.defs.asset_keys import RAW_ARCHIVE_KEY


def archive_observation(
    partition_key: str, etag: str, metadata: dict[str, Any] | None = None
) -> AssetObservation:
    """`raw_archive` of one episode observed with the upload's ETag as its data version."""
    return AssetObservation(
        asset_key=RAW_ARCHIVE_KEY,
        partition=partition_key,
        tags={DATA_VERSION_TAG: etag},
        metadata=metadata or {},
    )


def report_archive_version(
    instance: DagsterInstance, partition_key: str, etag: str, metadata: dict[str, Any] | None = None
) -> None:
    """Record an upload's version when a run is requested for it, before the run starts.

    The episode then shows stale at once (its outputs were made from other bytes) instead of
    after the run has waited in the queue; the run itself does not depend on it.
    """
    instance.report_runless_asset_event(archive_observation(partition_key, etag, metadata))
