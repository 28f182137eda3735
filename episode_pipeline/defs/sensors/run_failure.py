"""A run that fails (or dies and is failed by run monitoring) leaves its episode `failed`."""

from dagster import DefaultSensorStatus, RunFailureSensorContext, run_failure_sensor

from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.orchestration.failures import fail_episode_of_run


@run_failure_sensor(
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=15,
    description="Marks an episode `failed` when its run fails, including runs whose process died "
    "and were failed by run monitoring.",
)
def episode_failed_on_run_failure(
    context: RunFailureSensorContext, postgres: PostgresResource
) -> None:
    # Always None, never a SkipReason: see `episode_upload_done` (a mixed tick fails for good).
    ref = fail_episode_of_run(context.instance, context.dagster_run, postgres)
    if ref is None:
        context.log.debug(f"run {context.dagster_run.run_id} changed no episode")
        return
    context.log.info(f"episode {ref} marked failed after run {context.dagster_run.run_id} failed")
