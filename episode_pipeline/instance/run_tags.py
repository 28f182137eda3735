"""Run tags, run keys and job names in one place: what a run carries and what reads it.

Every run of the episode graph is built and read through these names: the sensors and the
campaign driver write them, the run queue (`instance/run_coordinator.py`) and `dagster.yaml`'s
limits read them, and the services find runs by them (`orchestration/runs.py`). Pure: no instance.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping, Sequence

from dagster import DagsterRun, DagsterRunStatus
from dagster._core.storage.tags import PARTITION_NAME_TAG

from episode_pipeline.config.settings import ECS, SUBPROCESS, TranscodeMode
from episode_pipeline.episodes.keys import EpisodeRef, InvalidEpisodeKey, parse_partition_key
from episode_pipeline.transcode.placement import Placement

# The jobs the run queue tells apart (defs/jobs.py, defs/batches.py define them).
EPISODE_JOB_NAME = "process_episode"
BATCH_JOB_NAME = "process_episode_batch"

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
# A batch run's episode runs (orchestration/batches.py): the batch they belong to, by key (the
# campaign driver reconciles its ledger from them) and by the batch run's id (a child left
# STARTED by a batch task that died is failed once that run has ended: `failures.is_orphaned`).
BATCH_TAG = "episode_pipeline/batch"
BATCH_RUN_TAG = "episode_pipeline/batch_run"
# A run failed because the process executing it died, not by its own end (`failures.
# report_abandoned`, written before the failure): a later attempt of its batch runs its episode
# again, while an episode whose child ended on its own is left to the campaign's ledger.
ABANDONED_TAG = "episode_pipeline/abandoned"
# A campaign's runs: its id (the run queue's campaign lane reads it: instance/campaign_queue.py)
# and its wave. A batch run's episode runs inherit every tag starting with CAMPAIGN_TAG.
CAMPAIGN_TAG = "episode_pipeline/campaign"
CAMPAIGN_WAVE_TAG = "episode_pipeline/campaign_wave"
# How a run was started, besides Dagster's own tags: by the uploads sensor, by `reprocess`.
SQS_TAG = "episode_pipeline/sqs"
REPROCESS_TAG = "episode_pipeline/reprocess"
# A campaign run's asset selection, comma-separated (campaign/assets.py): the backfill's runs
# of the episode job carry it beside their selection, a batch run's op runs its episodes with
# it (its children inherit it, as every campaign tag). Absent: the whole graph.
CAMPAIGN_ASSETS_TAG = "episode_pipeline/campaign_assets"
# An episode held in the run queue (instance/run_coordinator.py): every queued run of an episode
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
        key: value for key, value in batch_run_tags.items() if key.startswith(CAMPAIGN_TAG)
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
