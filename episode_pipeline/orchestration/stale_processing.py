"""No episode stays `processing` after the run that owned it is gone (the `stale_processing`
sensor): a killed worker, a lost ECS task or a canceled run leaves no run in flight; the episode
becomes `failed`, and the upload's message (back after its visibility timeout) retries it."""

from __future__ import annotations

from dagster import DagsterRunStatus, SensorEvaluationContext

from episode_pipeline.config.settings import ReconcileSettings
from episode_pipeline.db.episodes import fail_if_still_processing, stale_processing
from episode_pipeline.db.schema_check import read_schema
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.orchestration.failures import emit_episode_failed
from episode_pipeline.orchestration.runs import has_run_in_flight, latest_run_of_episode
from episode_pipeline.runtime import failure_causes


def sweep_stale_processing(
    context: SensorEvaluationContext, postgres: PostgresResource, settings: ReconcileSettings
) -> list[str]:
    """Fail every episode left `processing` by a run no longer alive; returns their keys."""
    instance = context.instance
    failed = []
    with postgres.connect(autocommit=True) as conn:
        schema = read_schema(conn)
        stale = stale_processing(conn, schema, settings.stale_processing_after_seconds)
        for row in stale.invalid:
            context.log.warning(f"skipped {row.describe()}")
        for ref, seen in stale.rows:
            if has_run_in_flight(instance, ref):
                continue
            latest = latest_run_of_episode(instance, ref)
            if latest is not None and latest.status == DagsterRunStatus.SUCCESS:
                # A partial materialization (extraction alone) succeeded: not a dead run.
                context.log.warning(f"{ref}: processing after successful run {latest.run_id}")
                continue
            if fail_if_still_processing(conn, schema, ref, seen):
                emit_episode_failed(instance, latest, ref, failure_causes.RUN_CRASHED)
                last = f"run {latest.run_id} ({latest.status.value})" if latest else "no run"
                context.log.warning(
                    f"{ref}: left processing by {last}, no run alive: marked failed"
                )
                failed.append(ref.partition_key)
    return failed
