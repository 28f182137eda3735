"""A run that fails (or dies and is failed by run monitoring) leaves its episode `failed` (seed)."""

from datetime import UTC, datetime

from dagster import (
    DagsterInstance,
    DagsterRun,
    DefaultSensorStatus,
    RunFailureSensorContext,
    SkipReason,
    run_failure_sensor,
)

from episode_pipeline.db.episodes import mark_failed
from episode_pipeline.defs.resources.postgres import PostgresResource
from episode_pipeline.keys import EpisodeRef, InvalidEpisodeKey, parse_partition_key

PARTITION_TAG = "dagster/partition"


def episode_of_run(run: DagsterRun) -> EpisodeRef | None:
    """The episode a run worked on, from its partition tag; None for other runs."""
    partition_key = run.tags.get(PARTITION_TAG)
    if not partition_key:
        return None
    try:
        return parse_partition_key(partition_key)
    except InvalidEpisodeKey:
        return None


def run_started_at(instance: DagsterInstance, run: DagsterRun) -> datetime:
    """When the run started (or was created, if it never started): the cut-off for `failed`."""
    record = instance.get_run_record_by_id(run.run_id)
    timestamp = None
    if record is not None:
        timestamp = record.start_time or record.create_timestamp.timestamp()
    return datetime.fromtimestamp(timestamp, UTC) if timestamp else datetime.now(UTC)


def fail_episode_of_run(
    instance: DagsterInstance, run: DagsterRun, postgres: PostgresResource
) -> EpisodeRef | None:
    """Mark the run's episode failed unless the run already marked it processed."""
    ref = episode_of_run(run)
    if ref is None:
        return None
    with postgres.transaction() as conn:
        changed = mark_failed(conn, ref, run_started_at(instance, run))
    return ref if changed else None


@run_failure_sensor(
    name="episode_failed_on_run_failure",
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=15,
    description="Marks an episode `failed` when its run fails, including runs whose process died "
    "and were failed by run monitoring.",
)
def episode_failed_on_run_failure(context: RunFailureSensorContext, postgres: PostgresResource):
    ref = fail_episode_of_run(context.instance, context.dagster_run, postgres)
    if ref is None:
        return SkipReason(f"run {context.dagster_run.run_id} changed no episode")
    context.log.info(f"episode {ref} marked failed after run {context.dagster_run.run_id} failed")
    return None
