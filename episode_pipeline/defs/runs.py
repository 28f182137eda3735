"""Run bookkeeping in one place: tags, run keys, what counts as "in flight", partition adds.

The job, every sensor and the runner build and read runs through these helpers, so a tag or a
run-key format is written once and every caller agrees on which runs are still alive.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from dagster import (
    AddDynamicPartitionsRequest,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    RunRecord,
    RunsFilter,
)
from dagster._core.storage.tags import PARTITION_NAME_TAG

from episode_pipeline.config.settings import ECS, SUBPROCESS, TranscodeMode
from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME, episode_partitions
from episode_pipeline.episodes.keys import EpisodeRef, InvalidEpisodeKey, parse_partition_key
from episode_pipeline.transcode.placement import Placement

ORG_TAG = "org"  # the run queue's per-org concurrency limit reads it (dagster.yaml)
EPISODE_TAG = "episode"  # for filtering runs in the UI; the partition tag holds ORG/EP
PARTITION_TAG = PARTITION_NAME_TAG  # "dagster/partition"
# Which upload a run is for: `ORG/EP@<object version>`. Every run the sensors start carries it,
# and every other run gets it when it reads the archive (`claim_upload`), so "has this object
# version been handled?" is one tag lookup, however the run was started.
UPLOAD_TAG = "episode_pipeline/upload"
HOST_TAG = "episode_pipeline/host"
PID_TAG = "episode_pipeline/pid"
RECONCILED_TAG = "episode_pipeline/reconciled"
# Where the run's transcode runs (`subprocess`: in the run's own task; `ecs`: a task of its own),
# and the run task's size, read by EcsRunLauncher (a valid Fargate cpu/memory pair).
TRANSCODER_TAG = "episode_pipeline/transcoder"
ECS_CPU_TAG = "ecs/cpu"
ECS_MEMORY_TAG = "ecs/memory"
# A batch run's episode runs (defs/batches.py): the batch they belong to, by key (the campaign
# driver reconciles its ledger from them) and by the batch run's id (a child left STARTED by a
# batch task that died is failed once that run has ended: `failures.is_orphaned`).
BATCH_TAG = "episode_pipeline/batch"
BATCH_RUN_TAG = "episode_pipeline/batch_run"
# A run failed because the process executing it died, not by its own end (`failures.
# report_abandoned`, written before the failure): a later attempt of its batch runs its episode
# again, while an episode whose child ended on its own is left to the campaign's ledger.
ABANDONED_TAG = "episode_pipeline/abandoned"
# Tags of a batch run that its episode runs inherit (the campaign's own tags).
CAMPAIGN_TAG_PREFIX = "episode_pipeline/campaign"
# A campaign run's asset selection, comma-separated (campaign/assets.py): the backfill's runs
# of the episode job carry it beside their selection, a batch run's op runs its episodes with
# it (its children inherit it, as every campaign tag). Absent: the whole graph.
CAMPAIGN_ASSETS_TAG = "episode_pipeline/campaign_assets"
# An episode held in the run queue (defs/run_coordinator.py): every queued run of an episode
# carries `<prefix><ORG/EP>`, and a batch run one for each of its episodes, so that while a batch
# is in flight the queue launches either it or a run of one of its episodes, never both (its
# episodes run inside it, outside the queue: `dagster/partition` cannot hold them).
EPISODE_LOCK_TAG_PREFIX = "episode_pipeline/episode_lock/"

# A run that may still do work. Dagster's IN_PROGRESS_RUN_STATUSES leaves out QUEUED and
# NOT_STARTED, so a run waiting behind the per-org limit would look absent and get a twin.
IN_FLIGHT_STATUSES = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


# -- tags ---------------------------------------------------------------------------------------


def episode_tags(partition_key: str) -> dict[str, str]:
    """Tags on every run of an episode, however it was launched (sensor, backfill, Launchpad)."""
    ref = parse_partition_key(partition_key)
    return {ORG_TAG: ref.org_id, EPISODE_TAG: ref.episode_id}


def episode_lock_tags(partition_keys: Iterable[str]) -> dict[str, str]:
    """The run queue's hold on each of these episodes (EPISODE_LOCK_TAG_PREFIX)."""
    return {EPISODE_LOCK_TAG_PREFIX + key: "1" for key in partition_keys}


def placement_tags(placement: Placement) -> dict[str, str]:
    """The run tags that carry a `Placement`: the transcoder, and the task size if any."""
    tags = {TRANSCODER_TAG: placement.mode}
    if placement.run_size is not None:
        tags |= {
            ECS_CPU_TAG: str(placement.run_size.cpu),
            ECS_MEMORY_TAG: str(placement.run_size.memory),
        }
    return tags


def transcoder_of(tags: Mapping[str, str], default: TranscodeMode) -> TranscodeMode:
    """The run's transcoder by its tag, else `default`; a tag naming neither is an error."""
    value = tags.get(TRANSCODER_TAG)
    if value is None:
        return default
    if value not in (SUBPROCESS, ECS):
        raise ValueError(
            f"run tag {TRANSCODER_TAG}={value!r}: must be {SUBPROCESS!r} (in the run's task) or "
            f"{ECS!r} (a transcode task of its own)"
        )
    return value  # type: ignore[return-value]


def batch_child_tags(
    batch_key: str, batch_run_id: str, batch_run_tags: Mapping[str, str]
) -> dict[str, str]:
    """Tags of an episode run made by a batch run (besides its episode's): the batch, the batch
    run, the campaign's tags, and the transcode in the batch's own task (it is sized for it)."""
    inherited = {
        key: value for key, value in batch_run_tags.items() if key.startswith(CAMPAIGN_TAG_PREFIX)
    }
    return {
        **inherited,
        BATCH_TAG: batch_key,
        BATCH_RUN_TAG: batch_run_id,
        TRANSCODER_TAG: SUBPROCESS,
    }


def assets_tags(assets: Sequence[str] | None) -> dict[str, str]:
    return {CAMPAIGN_ASSETS_TAG: ",".join(assets)} if assets else {}


def assets_of_tags(tags: Mapping[str, str]) -> list[str] | None:
    """The asset selection a run's tags name (None: the whole graph)."""
    value = tags.get(CAMPAIGN_ASSETS_TAG)
    return [name for name in value.split(",") if name] if value else None


def in_process_tags() -> dict[str, str]:
    """Tags for a run executed inside this process, so a later check can tell if it died."""
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}


def episode_of_run(run: DagsterRun) -> EpisodeRef | None:
    """The episode a run worked on, from its partition tag; None for other runs."""
    partition_key = run.tags.get(PARTITION_TAG)
    if not partition_key:
        return None
    try:
        return parse_partition_key(partition_key)
    except InvalidEpisodeKey:
        return None


# -- run keys -----------------------------------------------------------------------------------


def upload_id(partition_key: str, object_version: str) -> str:
    """`ORG/EP@<object version>`: one upload of an episode, whatever announced it and how often."""
    return f"{partition_key}@{object_version}"


def upload_run_key(upload: str) -> str:
    """The run key of an upload's first run: the upload itself, never the receive count.

    A redelivered message of the same object version must find the run already made for it
    (and join it, or see it succeeded), not start another: exactly one successful run per
    object version (docs/contract.md#upload-queue).
    """
    return upload


def retry_run_key(upload: str, failed_run_id: str) -> str:
    """The run key of one more attempt after the upload's latest run `failed_run_id` failed.

    Derived from that run, so every tick that sees the same failure asks for the same retry and
    Dagster's run-key deduplication starts it once.
    """
    return f"{upload}#after-{failed_run_id[:8]}"


def reconciled_run_key(upload: str) -> str:
    """The run key of an upload found by reconciliation rather than by its S3 event."""
    return f"{upload}#reconciled"


def claim_upload(instance: DagsterInstance, run: DagsterRun, upload: str) -> str | None:
    """Make `run` count as the run of `upload`, the object version it read; returns the upload
    the run was started for when that is another one (a re-upload since), else None.

    A run started without an upload (`process`, `dg launch`, the Launchpad, a backfill) gets the
    upload tag when it reads the archive, so the upload's queue message finds it by the same
    keyed lookup as a sensor's run: a succeeded one is deleted, not run again; one in flight is
    joined. A sensor's run keeps the upload it was started for (its run key and messages).
    """
    started_for = run.tags.get(UPLOAD_TAG)
    if started_for is None:
        instance.add_run_tags(run.run_id, {UPLOAD_TAG: upload})
        return None
    return started_for if started_for != upload else None


def latest_runs_of_uploads(
    instance: DagsterInstance, uploads: Iterable[str]
) -> dict[str, DagsterRun]:
    """Upload → its newest run, for each upload that has one: one query for a whole tick.

    A sensor tick handles hundreds of uploads; one query each would make the tick, not the
    queue, the bound on how fast a fleet's uploads become runs.
    """
    wanted = list(dict.fromkeys(uploads))
    latest: dict[str, DagsterRun] = {}
    if wanted:
        for run in instance.get_runs(RunsFilter(tags={UPLOAD_TAG: wanted})):  # newest first
            latest.setdefault(run.tags[UPLOAD_TAG], run)
    return latest


# -- runs in flight -----------------------------------------------------------------------------


@dataclass(frozen=True)
class UploadHistory:
    """What the runs of one upload came to, for an operator (`episode-pipeline dlq list`)."""

    runs: int
    failures: int  # failed or canceled
    first_failure: datetime | None
    last_failure: datetime | None
    last_failed_run_id: str | None


def upload_history(instance: DagsterInstance, upload: str) -> UploadHistory:
    records = instance.get_run_records(RunsFilter(tags={UPLOAD_TAG: upload}))
    failed = [
        record
        for record in records
        if record.dagster_run.status in (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
    ]

    def when(record: RunRecord) -> datetime:
        stamp = record.end_time or record.create_timestamp.timestamp()
        return datetime.fromtimestamp(stamp, UTC)

    ended = sorted(failed, key=when)
    return UploadHistory(
        runs=len(records),
        failures=len(failed),
        first_failure=when(ended[0]) if ended else None,
        last_failure=when(ended[-1]) if ended else None,
        last_failed_run_id=ended[-1].dagster_run.run_id if ended else None,
    )


def has_run_in_flight(instance: DagsterInstance, ref: EpisodeRef) -> bool:
    """Is a run of this episode queued, starting or running?"""
    runs = instance.get_runs(
        RunsFilter(tags={PARTITION_TAG: ref.partition_key}, statuses=IN_FLIGHT_STATUSES),
        limit=1,
    )
    return bool(runs)


def latest_run_of_episode(instance: DagsterInstance, ref: EpisodeRef) -> DagsterRun | None:
    """The newest run of the episode's partition, however it was launched."""
    runs = instance.get_runs(RunsFilter(tags={PARTITION_TAG: ref.partition_key}), limit=1)
    return runs[0] if runs else None


def latest_run_record_of_episode(instance: DagsterInstance, ref: EpisodeRef) -> RunRecord | None:
    """The newest run of the episode with its start and end times (`status` explains it)."""
    records = instance.get_run_records(RunsFilter(tags={PARTITION_TAG: ref.partition_key}), limit=1)
    return records[0] if records else None


def runs_in_flight(instance: DagsterInstance, job_name: str) -> list[DagsterRun]:
    return list(instance.get_runs(RunsFilter(job_name=job_name, statuses=IN_FLIGHT_STATUSES)))


# -- partitions ---------------------------------------------------------------------------------


def known_partitions(instance: DagsterInstance, partition_keys: Iterable[str]) -> set[str]:
    """Which of these episode partitions Dagster already knows: one query for all."""
    keys = list(dict.fromkeys(partition_keys))
    return (
        instance.get_existing_dynamic_partitions(EPISODES_PARTITION_NAME, keys) if keys else set()
    )


def new_partitions_request(
    partition_keys: Iterable[str], known: Collection[str]
) -> list[AddDynamicPartitionsRequest]:
    """The request that adds the episode partitions not `known` yet ([] if none).

    Deduplicated: a key repeated inside one request fails the whole tick.
    """
    new_keys = [key for key in dict.fromkeys(partition_keys) if key not in known]
    return [episode_partitions.build_add_request(new_keys)] if new_keys else []


def ensure_partition(instance: DagsterInstance, ref: EpisodeRef) -> None:
    """Add the episode's partition now (outside a sensor: the runner, the CLI)."""
    if not instance.has_dynamic_partition(EPISODES_PARTITION_NAME, ref.partition_key):
        instance.add_dynamic_partitions(EPISODES_PARTITION_NAME, [ref.partition_key])
