"""What the campaign driver's tests hand it: an older code version's figures, and the runs a
daemon would have left (no FFmpeg: test_campaign_soak.py runs real episodes)."""

from __future__ import annotations

from dagster import DagsterInstance, DagsterRunStatus

from episode_pipeline.defs.campaigns import CAMPAIGN_TAG, CAMPAIGN_WAVE_TAG
from episode_pipeline.defs.jobs import EPISODE_JOB_NAME
from episode_pipeline.defs.runs import PARTITION_TAG
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline_tests.support.dagster_internals import (
    RUN_FAILURE_REASON_TAG,
    RunFailureReason,
    create_run_for_test,
)

# An episode's figures as an older code version recorded them (`episode_outputs`).
OLD = {"frame_rows": 30, "seconds_by_camera": {"front": 1.0}, "renditions": ["front"]}


def finished_run(
    instance: DagsterInstance,
    ref: EpisodeRef,
    ok: bool,
    campaign: tuple[str, int] | None = None,
    error: str = "extracted_files: ArchiveError: corrupt zstd frame",
) -> str:
    """The run a daemon would have made for the episode, ended: the campaign's wave's
    (`campaign`: its id and wave) or an upload's. A failure is a step's (a corrupt archive, an
    S3 throttle): production's `run_retries` does not re-run it."""
    tags = {PARTITION_TAG: ref.partition_key}
    if campaign:
        tags |= {CAMPAIGN_TAG: campaign[0], CAMPAIGN_WAVE_TAG: str(campaign[1])}
    if not ok:
        tags[RUN_FAILURE_REASON_TAG] = RunFailureReason.STEP_FAILURE.value
    status = DagsterRunStatus.SUCCESS if ok else DagsterRunStatus.STARTED
    run = create_run_for_test(instance, job_name=EPISODE_JOB_NAME, status=status, tags=tags)
    if not ok:
        instance.report_run_failed(run, error)
    return run.run_id
