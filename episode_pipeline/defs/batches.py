"""The batch job: a campaign's batch of K episodes in one task (one cold start), each its own
run of the episode job. What the op does is the batch service's (`orchestration/batches.py`);
here are the job, its op, and what only the definitions know: which stored outputs a run of
some assets loads, and the outcomes as the UI shows them.
"""

from collections.abc import Callable, Iterable, Sequence

from dagster import (
    JobDefinition,
    Nothing,
    OpExecutionContext,
    Out,
    Output,
    job,
    op,
)

from episode_pipeline.campaign.assets import stored_inputs
from episode_pipeline.defs.code_versions import asset_children, stored_in_s3
from episode_pipeline.defs.io_managers.s3_outputs import missing_stored_outputs
from episode_pipeline.defs.metadata import table
from episode_pipeline.defs.partitions import batch_partitions
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_tags import BATCH_JOB_NAME
from episode_pipeline.orchestration.batches import (
    OUTCOMES,
    EpisodeOutcome,
    LacksStoredInput,
    run_batch,
)
from episode_pipeline.storage.bucket import Bucket

OUTCOME_COLUMNS = (
    ("position", "int", "the episode's place in the batch"),
    ("episode", "text", "ORG/EP: its partition of the episode assets"),
    ("outcome", "text", ", ".join(OUTCOMES)),
    ("run_id", "text", "the episode's own run of process_episode"),
    ("cause", "text", "why it failed: the failed step and its error"),
)


def outcome_metadata(outcomes: Iterable[EpisodeOutcome]) -> dict[str, object]:
    """The batch run's output metadata: counts, and every episode's outcome as a table."""
    listed = list(outcomes)
    counts = {name: sum(outcome.outcome == name for outcome in listed) for name in OUTCOMES}
    return {
        "episodes": len(listed),
        **{name.replace(" ", "_"): count for name, count in counts.items()},
        "outcomes": table(OUTCOME_COLUMNS, [outcome.as_row() for outcome in listed]),
    }


def lacks_stored_input(episode_job: JobDefinition, bucket: Bucket) -> LacksStoredInput:
    """Whether an episode lacks a stored output that a run of some of the episode job's assets
    loads from the bucket (one HEAD each)."""
    graph = episode_job.asset_layer.asset_graph

    def lacks(assets: Sequence[str], ref: EpisodeRef) -> bool:
        stored = stored_in_s3(graph, stored_inputs(assets, asset_children(graph)))
        return bool(missing_stored_outputs(bucket, stored, [ref]))

    return lacks


def batch_job(episode_job: Callable[[], JobDefinition]) -> JobDefinition:
    """The batch job; `episode_job` gives the code location's own `process_episode` (resolved
    with its resources) when the op runs: the batch job is one of the same definitions."""

    @op(
        out=Out(Nothing),
        description="Runs each episode of the batch as its own run of process_episode, in this "
        "task; one episode's failure is its own. Lists every episode's outcome and run.",
    )
    def process_batch_episodes(
        context: OpExecutionContext, postgres: PostgresResource, s3: S3BucketResource
    ):
        job_def = episode_job()
        lacks = lacks_stored_input(job_def, s3.get_client())
        outcomes = run_batch(context, job_def, postgres, lacks)
        yield Output(None, metadata=outcome_metadata(outcomes))

    @job(
        name=BATCH_JOB_NAME,
        partitions_def=batch_partitions,
        description="A campaign's batch: K episodes in one task (one cold start), each its own "
        "run of process_episode.",
    )
    def process_episode_batch() -> None:
        process_batch_episodes()

    return process_episode_batch
