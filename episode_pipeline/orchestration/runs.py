"""Run bookkeeping over Dagster's instance: which run an upload has, what is in flight, partition
adds. The tags and run keys these read are `instance/run_tags.py`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
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

from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME, episode_partitions
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_tags import (
    IN_FLIGHT_STATUSES,
    PARTITION_TAG,
    UPLOAD_TAG,
    upload_id,
)


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


def count_as_the_uploads_run(
    instance: DagsterInstance,
    run: DagsterRun,
    partition_key: str,
    version: str,
    log: logging.Logger,
) -> None:
    """One successful run per object version, however it was run: this run is the upload's."""
    upload = upload_id(partition_key, version)
    started_for = claim_upload(instance, run, upload)
    if started_for is not None:
        log.info(f"run started for upload {started_for} reads {upload}, uploaded since")
    else:
        log.info(
            f"this run is upload {upload}'s: its queue message is deleted once the run succeeds, "
            "not run again"
        )


def run_start_time(instance: DagsterInstance, run_id: str) -> float | None:
    """When the run started (epoch seconds), None when its record has no start."""
    record = instance.get_run_record_by_id(run_id)
    return record.start_time if record else None


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


def known_partitions(
    instance: DagsterInstance,
    partition_keys: Iterable[str],
    partitions_name: str = EPISODES_PARTITION_NAME,
) -> set[str]:
    """Which of these partitions Dagster already knows: one query for all."""
    keys = list(dict.fromkeys(partition_keys))
    return instance.get_existing_dynamic_partitions(partitions_name, keys) if keys else set()


def missing_partitions(
    instance: DagsterInstance,
    partition_keys: Iterable[str],
    partitions_name: str = EPISODES_PARTITION_NAME,
) -> list[str]:
    """The partitions Dagster does not know yet, in order, once each (one query)."""
    keys = list(dict.fromkeys(partition_keys))
    known = known_partitions(instance, keys, partitions_name)
    return [key for key in keys if key not in known]


def add_partitions(
    instance: DagsterInstance,
    partition_keys: Iterable[str],
    partitions_name: str = EPISODES_PARTITION_NAME,
) -> list[str]:
    """Add the partitions Dagster does not know yet (outside a sensor: the runner, a batch,
    the campaign driver, `reprocess`); a pruned one's comes back. Returns those added."""
    missing = missing_partitions(instance, partition_keys, partitions_name)
    if missing:
        instance.add_dynamic_partitions(partitions_name, missing)
    return missing


def new_partitions_request(
    partition_keys: Iterable[str], known: Collection[str]
) -> list[AddDynamicPartitionsRequest]:
    """The request that adds the episode partitions not `known` yet ([] if none).

    Deduplicated: a key repeated inside one request fails the whole tick.
    """
    new_keys = [key for key in dict.fromkeys(partition_keys) if key not in known]
    return [episode_partitions.build_add_request(new_keys)] if new_keys else []
