"""`raw_archive`'s observations: an upload's ETag recorded as the archive's data version, so an
episode shows stale the moment a run is requested for new bytes (the uploads and lost-uploads
sensors) and an extraction points its provenance at the bytes it read (`archive_provenance`, for
`defs/assets/archive.py`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dagster import AssetObservation, DagsterInstance

# Provenance tags: Dagster's own names (1.13.27 pinned) for "made from this event of that input".
from episode_pipeline.dagster_compat import (
    DATA_VERSION_TAG,
    get_input_data_version_tag,
    get_input_event_pointer_tag,
)
from episode_pipeline.defs.asset_keys import RAW_ARCHIVE_KEY
from episode_pipeline.orchestration.event_log import latest_observation


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


def archive_provenance(
    instance: DagsterInstance,
    partition_key: str,
    etag: str,
    metadata: dict[str, Any],
    log_event: Callable[[AssetObservation], None],
) -> dict[str, str]:
    """Output tags tying this extraction to the observation of exactly the bytes it reads
    (logging one, with `metadata`, when the newest is of other bytes)."""
    record = latest_observation(instance, RAW_ARCHIVE_KEY, partition_key)
    observed = record.asset_observation if record else None
    if observed is None or observed.data_version != etag:
        log_event(archive_observation(partition_key, etag, metadata))
        record = latest_observation(instance, RAW_ARCHIVE_KEY, partition_key)
        assert record is not None, "the observation just logged is stored synchronously"
    return {
        get_input_event_pointer_tag(RAW_ARCHIVE_KEY): str(record.storage_id),
        get_input_data_version_tag(RAW_ARCHIVE_KEY): etag,
    }
