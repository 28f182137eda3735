"""Process one episode in this process: what `episode-pipeline process ORG/EP` does.

The same as `dagster asset materialize --select '*' --partition ORG/EP` against the local
instance, plus the partition is added when missing and a failure marks the episode at once
(without waiting for the daemon's run-failure sensor).
"""

from __future__ import annotations

from dagster import DagsterInstance

from episode_pipeline.keys import EpisodeRef
from episode_pipeline.settings import apply_local_stack_env


def add_episode_partition(instance: DagsterInstance, ref: EpisodeRef) -> None:
    from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME

    if not instance.has_dynamic_partition(EPISODES_PARTITION_NAME, ref.partition_key):
        instance.add_dynamic_partitions(EPISODES_PARTITION_NAME, [ref.partition_key])


def process_episode(ref: EpisodeRef, instance: DagsterInstance | None = None) -> bool:
    """Materialize the episode's partition of the whole graph with its checks; True on success."""
    apply_local_stack_env()
    from episode_pipeline.definitions import EPISODE_JOB_NAME, defs, postgres_resource
    from episode_pipeline.defs.sensors.reconcile import fail_orphaned_runs, in_process_run_tags
    from episode_pipeline.defs.sensors.run_failure import fail_episode_of_run

    instance = instance or DagsterInstance.get()
    fail_orphaned_runs(instance)
    add_episode_partition(instance, ref)
    job = defs.resolve_job_def(EPISODE_JOB_NAME)
    result = job.execute_in_process(
        partition_key=ref.partition_key,
        instance=instance,
        raise_on_error=False,
        tags={**in_process_run_tags(), "org": ref.org_id},
    )
    if not result.success:
        fail_episode_of_run(instance, result.dagster_run, postgres_resource())
    return result.success
