"""Process one episode in this process: what `episode-pipeline process ORG/EP` does.

The same as `dagster asset materialize --select '*' --partition ORG/EP` against the local
instance, plus the partition is added when missing and a failure marks the episode at once
(without waiting for the daemon's run-failure sensor).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dagster import DagsterInstance

from episode_pipeline.config.settings import Settings, settings_from_environment
from episode_pipeline.definitions import build_definitions
from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.episodes.extraction import ArchiveNotFound, find_archive
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_tags import EPISODE_JOB_NAME, episode_tags, in_process_tags
from episode_pipeline.orchestration.failures import fail_episode_of_run, fail_orphaned_runs
from episode_pipeline.orchestration.run_errors import run_errors
from episode_pipeline.orchestration.runs import add_partitions
from episode_pipeline.storage.bucket import Bucket

# The webserver's own pooling defaults (dagster-webserver --db-pool-*).
POOL_RECYCLE_SECONDS = 3600
POOL_MAX_OVERFLOW = 20


def local_instance(settings: Settings) -> DagsterInstance:
    """The local instance, its storage holding one connection open for this whole process.

    Dagster's PostgreSQL storage opens a new connection for every statement (NullPool): a run of a
    short episode makes ~400 of them, seconds of connection set-up on a busy machine
    (benchmarks/startup.py). This is the pooling the webserver applies to itself.
    """
    instance = DagsterInstance.get()
    instance.optimize_for_webserver(
        statement_timeout=settings.database.statement_timeout_seconds * 1000,
        pool_recycle=POOL_RECYCLE_SECONDS,
        max_overflow=POOL_MAX_OVERFLOW,
    )
    return instance


@dataclass(frozen=True)
class ProcessOutcome:
    success: bool
    run_id: str
    errors: list[str] = field(default_factory=list)  # "step: message" for each failed step

    def __bool__(self) -> bool:
        return self.success


def step_errors(instance: DagsterInstance, run_id: str) -> list[str]:
    """The failed steps of a run and their errors, one line each (`StepError.line`)."""
    return [error.line() for error in run_errors(instance, run_id)]


# Dagster's console logger at this level prints nothing a run emits (`process` without -v).
QUIET_RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


class UnknownEpisode(ValueError):
    """Neither Dagster nor the bucket knows the episode: nothing to process (no run is made)."""


def refuse_unknown_episode(bucket: Bucket, ref: EpisodeRef) -> None:
    """A partition is added only for an episode with an upload: a typo must not become a
    partition and a failed run."""
    try:
        find_archive(bucket, ref)
    except ArchiveNotFound as error:
        raise UnknownEpisode(
            f"{ref}: no such episode: Dagster has no partition {ref.partition_key!r} and {error} "
            f"(upload one first: episode-pipeline upload ARCHIVE --org {ref.org_id} "
            f"--episode {ref.episode_id})"
        ) from None


def process_episode(
    ref: EpisodeRef,
    instance: DagsterInstance | None = None,
    settings: Settings | None = None,
    *,
    quiet: bool = False,
) -> ProcessOutcome:
    """Materialize the episode's partition of the whole graph with its checks; `quiet` keeps
    Dagster's console logger silent (the events are stored all the same)."""
    settings = settings or settings_from_environment()
    defs = build_definitions(settings)
    instance = instance or local_instance(settings)
    fail_orphaned_runs(instance)
    if not instance.has_dynamic_partition(EPISODES_PARTITION_NAME, ref.partition_key):
        refuse_unknown_episode(Bucket(settings.bucket, settings.aws), ref)
    add_partitions(instance, [ref.partition_key])
    result = defs.resolve_job_def(EPISODE_JOB_NAME).execute_in_process(
        partition_key=ref.partition_key,
        instance=instance,
        raise_on_error=False,
        tags={**in_process_tags(), **episode_tags(ref.partition_key)},
        run_config=QUIET_RUN_CONFIG if quiet else None,
    )
    run_id = result.dagster_run.run_id
    if result.success:
        return ProcessOutcome(True, run_id)
    postgres = PostgresResource.from_settings(settings.database)
    fail_episode_of_run(instance, result.dagster_run, postgres)
    return ProcessOutcome(False, run_id, step_errors(instance, run_id))


def run_checks(
    ref: EpisodeRef,
    names: set[str] | None = None,
    instance: DagsterInstance | None = None,
    settings: Settings | None = None,
) -> dict[str, bool]:
    """Run the episode's checks (all, or those named) on what is stored; name → passed."""
    settings = settings or settings_from_environment()
    defs = build_definitions(settings)
    instance = instance or local_instance(settings)
    keys = set(defs.resolve_asset_graph().asset_check_keys)
    if names is not None:
        unknown = names - {key.name for key in keys}
        if unknown:
            raise ValueError(
                f"no such check(s): {', '.join(sorted(unknown))}; the checks are: "
                + ", ".join(sorted(key.name for key in keys))
            )
        keys = {key for key in keys if key.name in names}
    # A checks-only job needs the partitioned implicit asset job to carry the partitions.
    job = defs.resolve_implicit_global_asset_job_def().get_subset(
        asset_selection=set(), asset_check_selection=keys
    )
    result = job.execute_in_process(
        partition_key=ref.partition_key, instance=instance, raise_on_error=False
    )
    return {
        evaluation.check_name: evaluation.passed
        for evaluation in result.get_asset_check_evaluations()
    }
