"""Recording a job backfill over partitions, as the UI's Launchpad would: the backfill daemon
launches its runs (each under the run queue's limits) and the UI's Backfills page shows it.
`episode-pipeline reprocess` records one; a campaign one per wave, under an id of its own so a
tick repeated after a crash finds the wave's backfill instead of making a second."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence

from dagster import AssetKey, DagsterInstance

from episode_pipeline.dagster_compat import (
    SINGLETON_REPOSITORY_NAME,
    BulkActionStatus,
    InProcessCodeLocationOrigin,
    LoadableTargetOrigin,
    PartitionBackfill,
    RemotePartitionSetOrigin,
    RemoteRepositoryOrigin,
    partition_set_snap_name_for_job_name,
)
from episode_pipeline.instance.run_tags import EPISODE_JOB_NAME

# The code location as both workspace files name it (workspace.yaml, local/workspace.yaml): the
# backfill daemon finds the job's partition set through it.
CODE_LOCATION_NAME = "episode_pipeline"


def record_backfill(
    instance: DagsterInstance,
    partition_keys: Sequence[str],
    *,
    title: str,
    description: str,
    tags: Mapping[str, str],
    backfill_id: str | None = None,
    job_name: str = EPISODE_JOB_NAME,
    asset_selection: Sequence[str] | None = None,
) -> str:
    """One requested backfill of `job_name` over these (existing) partitions; its id. With
    `asset_selection`, each run materializes only those assets of the job (the daemon subsets
    the job, as the Launchpad does for a selection)."""
    origin = RemotePartitionSetOrigin(
        repository_origin=RemoteRepositoryOrigin(
            code_location_origin=InProcessCodeLocationOrigin(
                LoadableTargetOrigin(module_name="episode_pipeline.definitions"),
                location_name=CODE_LOCATION_NAME,
            ),
            repository_name=SINGLETON_REPOSITORY_NAME,
        ),
        partition_set_name=partition_set_snap_name_for_job_name(job_name),
    )
    backfill_id = backfill_id or uuid.uuid4().hex[:8]
    instance.add_backfill(
        PartitionBackfill(
            backfill_id=backfill_id,
            partition_set_origin=origin,
            status=BulkActionStatus.REQUESTED,
            partition_names=list(partition_keys),
            from_failure=False,
            reexecution_steps=None,
            tags=dict(tags),
            backfill_timestamp=time.time(),
            title=title,
            description=description,
            asset_selection=[AssetKey(name) for name in asset_selection]
            if asset_selection
            else None,
        )
    )
    return backfill_id
