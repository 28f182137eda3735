"""Batch runs: K episodes of a campaign in one task, each still its own run of the episode job.
The batch job (`defs/batches.py`) is one op that calls `run_batch`.

An ECS task is a cold start (~60 s) paid for seconds of work on a short episode. A campaign
therefore runs `process_episode_batch`, partitioned by batch (`episode_batches`, keys
`<campaign>.w<wave>.b<n>`, episodes listed in the `episode_batches` table, `db/batches.py`):
its one op runs each of the batch's episodes as a **child run** of `process_episode`, executed
in this process against the instance (as `episode-pipeline process` does). So every episode
keeps its own run, outputs, checks, status and failure, and the UI one result per partition.

- A child run carries its episode's tags, `episode_pipeline/batch=<key>` (the campaign driver
  reconciles its ledger from them), `episode_pipeline/batch_run=<run id>`, the batch run's
  campaign tags, the host and pid of this process, and `episode_pipeline/transcoder=subprocess`:
  the batch's task is sized for its largest archive (`run_coordinator`), so FFmpeg runs in it.
- A failed child marks its episode `failed` (the failure policy, `orchestration.failures`) and
  the op goes on; the op fails only when it cannot run at all (no such batch). Its output
  metadata lists every episode's outcome, run and cause.
- Run again (a retry of the batch, or run monitoring resuming it after its task died), an
  episode an earlier attempt ended is skipped: its child run succeeded or failed on its own,
  or its campaign's ledger no longer waits on it from this batch (it settled that run, whose
  record its prune may have deleted since, or claimed the episode again). The ledger retries a
  failure itself, in a later wave with its attempts and backoff; run again here too, a
  throttled episode ran twice and a rejected one's pruned partition came back (the K = 5
  soak). Only the episodes not reached and the one whose child a dead attempt abandoned
  (failed, tagged `ABANDONED_TAG`; one it left STARTED is failed so first) run again.
- If the task dies mid-batch and the batch run ends, the child left STARTED is failed by the
  `orphaned_runs` sensor (run monitoring fails the batch run).

Uploads never come here: their runs are `process_episode` itself, one episode a run. The child
runs start outside the run queue; the queue counts a batch once and holds its episodes against
an upload of one of them (`instance/run_coordinator.batch_queue_config`).
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import psycopg
from dagster import (
    AssetKey,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    Failure,
    JobDefinition,
    OpExecutionContext,
    RunsFilter,
)

from episode_pipeline.db.batches import batch_episodes
from episode_pipeline.db.campaigns import moved_on_from_batch
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.episodes.batches import InvalidBatchKey, parse_batch_key
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_tags import (
    ABANDONED_TAG,
    BATCH_TAG,
    PARTITION_TAG,
    assets_of_tags,
    batch_child_tags,
    episode_tags,
    in_process_tags,
)
from episode_pipeline.orchestration.failures import fail_episode_of_run, report_abandoned
from episode_pipeline.orchestration.run_errors import run_cause
from episode_pipeline.orchestration.runs import add_partitions

ABANDONED_BY_RETRY = "run(s) left by a dead attempt"  # the retry's log line names them
SUCCEEDED = "succeeded"
FAILED = "failed"
ALREADY_SUCCEEDED = "already succeeded"  # in an earlier run of the same batch
ALREADY_FAILED = "already failed"  # on its own, in an earlier run of the same batch
SETTLED = "settled by its campaign"  # its ledger no longer waits on it from this batch

OUTCOMES = (SUCCEEDED, FAILED, ALREADY_SUCCEEDED, ALREADY_FAILED, SETTLED)

# Whether the episode lacks a stored output that a run of these assets loads (the S3 IO
# manager's: the definitions know which, `defs/batches.py`); such a run would fail.
LacksStoredInput = Callable[[Sequence[str], EpisodeRef], bool]


@dataclass(frozen=True)
class EpisodeOutcome:
    position: int
    episode: str  # its partition key
    outcome: str
    run_id: str | None
    cause: str | None = None

    def as_row(self) -> dict[str, str | int | None]:
        return {
            "position": self.position,
            "episode": self.episode,
            "outcome": self.outcome,
            "run_id": self.run_id,
            "cause": self.cause,
        }


def ended_children(children: Iterable[DagsterRun]) -> dict[str, tuple[str, str]]:
    """Partition → (outcome, run id) of each episode an earlier attempt of the batch ended: by
    a child that succeeded, else by one that failed on its own (not abandoned by its dead
    attempt)."""
    ended: dict[str, tuple[str, str]] = {}
    for run in children:
        partition = run.tags.get(PARTITION_TAG)
        if partition is None or run.tags.get(ABANDONED_TAG) == "true":
            continue
        if run.status == DagsterRunStatus.SUCCESS:
            ended[partition] = (ALREADY_SUCCEEDED, run.run_id)
        elif run.status == DagsterRunStatus.FAILURE and partition not in ended:
            ended[partition] = (ALREADY_FAILED, run.run_id)
    return ended


def ended_in_batch(
    instance: DagsterInstance, conn: psycopg.Connection, batch_key: str
) -> dict[str, tuple[str, str | None]]:
    """`ended_children` of the batch's runs, and the episodes its campaign settled."""
    runs = instance.get_runs(
        RunsFilter(
            tags={BATCH_TAG: batch_key},
            statuses=[DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE],
        )
    )
    settled = {ref.partition_key: (SETTLED, None) for ref in moved_on_from_batch(conn, batch_key)}
    return {**settled, **ended_children(runs)}


def fail_abandoned_children(
    context: OpExecutionContext, batch_key: str, postgres: PostgresResource
) -> list[str]:
    """Fail the batch's children still STARTED: the op runs one at a time, so before its first
    one starts, any such run is a dead attempt's (run monitoring resumed the batch run in a new
    task, under the same run id). Their episodes become `failed` and are run again below."""
    abandoned = context.instance.get_runs(
        RunsFilter(tags={BATCH_TAG: batch_key}, statuses=[DagsterRunStatus.STARTED])
    )
    for run in abandoned:
        report_abandoned(context.instance, run, "an earlier attempt of its batch run died")
        fail_episode_of_run(context.instance, run, postgres)
    return [run.run_id for run in abandoned]


def run_episode(
    context: OpExecutionContext,
    episode_job: JobDefinition,
    position: int,
    ref: EpisodeRef,
    tags: Mapping[str, str],
    postgres: PostgresResource,
    assets: Sequence[str] | None = None,
) -> EpisodeOutcome:
    """One child run of the episode job in this process (of `assets` only, when given); its
    failure is its episode's alone. Even an error of Dagster's around the run (no run made,
    nothing marked) is this episode's outcome, not the batch's."""
    try:
        result = episode_job.execute_in_process(
            partition_key=ref.partition_key,
            instance=context.instance,
            raise_on_error=False,
            tags={**tags, **in_process_tags(), **episode_tags(ref.partition_key)},
            asset_selection=[AssetKey(name) for name in assets] if assets else None,
        )
    except Exception as error:
        context.log.exception(f"{ref}: its run could not be executed")
        return EpisodeOutcome(
            position, ref.partition_key, FAILED, None, f"run: {type(error).__name__}: {error}"
        )
    run = result.dagster_run
    if result.success:
        return EpisodeOutcome(position, ref.partition_key, SUCCEEDED, run.run_id)
    fail_episode_of_run(context.instance, run, postgres)
    return EpisodeOutcome(
        position, ref.partition_key, FAILED, run.run_id, run_cause(result.all_events)
    )


def episode_assets(
    assets: Sequence[str] | None, lacks_stored_input: LacksStoredInput, ref: EpisodeRef
) -> list[str] | None:
    """What the episode's run materializes: the campaign's selection (the run's tag), or the
    whole graph (None) when the selection loads a stored output the episode lacks."""
    if not assets:
        return None
    return None if lacks_stored_input(assets, ref) else list(assets)


def run_batch(
    context: OpExecutionContext,
    episode_job: JobDefinition,
    postgres: PostgresResource,
    lacks_stored_input: LacksStoredInput,
) -> list[EpisodeOutcome]:
    """Each episode of the context's batch partition in turn, as its own run, of the
    campaign's asset selection when its run names one."""
    batch_key = context.partition_key
    try:
        parse_batch_key(batch_key)
    except InvalidBatchKey as error:
        raise Failure(str(error)) from None
    instance = context.instance
    abandoned = fail_abandoned_children(context, batch_key, postgres)
    if abandoned:
        context.log.warning(f"failed {len(abandoned)} {ABANDONED_BY_RETRY}: {abandoned}")
    try:
        with postgres.connect() as conn:
            refs = batch_episodes(conn, batch_key)
            ended = ended_in_batch(instance, conn, batch_key)
    except psycopg.errors.UndefinedTable as error:
        raise Failure(
            f"batch {batch_key}: the database has no episode_batches table ({error}); it is "
            "migration 005_episode_batches.sql"
        ) from None
    if not refs:
        raise Failure(f"batch {batch_key}: the episode_batches table lists no episode for it")
    add_partitions(instance, [ref.partition_key for ref in refs if ref.partition_key not in ended])
    tags = batch_child_tags(batch_key, context.run.run_id, context.run.tags)
    selection = assets_of_tags(context.run.tags)
    outcomes: list[EpisodeOutcome] = []
    for position, ref in enumerate(refs):
        if ref.partition_key in ended:
            outcome = EpisodeOutcome(position, ref.partition_key, *ended[ref.partition_key])
        else:
            context.log.info(f"batch {batch_key}: episode {position + 1}/{len(refs)} {ref}")
            assets = episode_assets(selection, lacks_stored_input, ref)
            if selection and assets is None:
                context.log.warning(
                    f"{ref}: a stored output that {', '.join(selection)} load is missing: "
                    "its run is of the whole graph"
                )
            outcome = run_episode(context, episode_job, position, ref, tags, postgres, assets)
        outcomes.append(outcome)
        log = context.log.warning if outcome.outcome == FAILED else context.log.info
        log(
            f"{ref}: {outcome.outcome} (run {outcome.run_id})"
            + (f": {outcome.cause}" if outcome.cause else "")
        )
    return outcomes
