"""What the campaign driver's tests hand it: an older code version's figures, and the runs a
daemon would have left (no FFmpeg: test_campaign_soak.py runs real episodes)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from dagster import DagsterEvent, DagsterEventType, DagsterInstance, DagsterRunStatus

from episode_pipeline.cli import build_parser
from episode_pipeline.commands import campaign as commands
from episode_pipeline.config.settings import Settings
from episode_pipeline.db.outputs import record_output
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_tags import (
    CAMPAIGN_TAG,
    CAMPAIGN_WAVE_TAG,
    EPISODE_JOB_NAME,
    PARTITION_TAG,
)
from episode_pipeline_tests.support.dagster_internals import (
    RUN_FAILURE_REASON_TAG,
    RunFailureReason,
    SerializableErrorInfo,
    StepFailureData,
    create_run_for_test,
)

# An episode's figures as an older code version recorded them (`episode_outputs`).
OLD = {"frame_rows": 30, "seconds_by_camera": {"front": 1.0}, "renditions": ["front"]}


def stale_episodes(
    db_conn: psycopg.Connection,
    count: int,
    prefix: str = "old",
    wall_seconds: float = 1.0,
    recorded: bool = True,
) -> list[EpisodeRef]:
    """`count` processed episodes of a new org (`prefix-xxxxxx`) an older code version recorded
    (or, `recorded=False`, never recorded: the first campaign after migration 004)."""
    org = f"{prefix}-{uuid.uuid4().hex[:6]}"
    refs = [EpisodeRef(org, f"{org}-ep-{i}") for i in range(count)]
    for ref in refs:
        db_conn.execute(
            "INSERT INTO episodes (id, org_id, status) VALUES (%s, %s, 'processed')",
            (ref.episode_id, org),
        )
        if recorded:
            record_output(
                db_conn, ref, {"episode": "0"}, OLD, run_id=None, wall_seconds=wall_seconds,
                archive_bytes=1,
            )  # fmt: skip
    return refs


def finished_run(
    instance: DagsterInstance,
    ref: EpisodeRef,
    ok: bool,
    campaign: tuple[str, int] | None = None,
    error: str = "extracted_files: ArchiveError: corrupt zstd frame",
    step_error: tuple[str, str] | None = None,
) -> str:
    """The run a daemon would have made for the episode, ended: the campaign's wave's
    (`campaign`: its id and wave) or an upload's. A failure is a step's (a corrupt archive, an
    S3 throttle): production's `run_retries` does not re-run it. `step_error` (step, exception
    class) records the step's failure event as a real run does, `error` its message."""
    tags = {PARTITION_TAG: ref.partition_key}
    if campaign:
        tags |= {CAMPAIGN_TAG: campaign[0], CAMPAIGN_WAVE_TAG: str(campaign[1])}
    if not ok:
        tags[RUN_FAILURE_REASON_TAG] = RunFailureReason.STEP_FAILURE.value
    status = DagsterRunStatus.SUCCESS if ok else DagsterRunStatus.STARTED
    run = create_run_for_test(instance, job_name=EPISODE_JOB_NAME, status=status, tags=tags)
    if step_error:
        step, error_type = step_error
        failure = StepFailureData(
            error=SerializableErrorInfo(error, [], error_type), user_failure_data=None
        )
        event = DagsterEvent(
            DagsterEventType.STEP_FAILURE.value,
            run.job_name,
            step_key=step,
            event_specific_data=failure,
        )
        instance.report_dagster_event(event, run_id=run.run_id)
    if not ok:
        instance.report_run_failed(run, error)
    return run.run_id


def start_campaign(
    conn: Any,
    instance: DagsterInstance,
    settings: Settings,
    argv: list[str],
    jitter_seconds: float | None = None,
) -> tuple[str, dict[str, Any]]:
    """`campaign start <argv>` on `settings` (the campaign keeps their pacing), in `conn`'s
    transaction; `jitter_seconds` replaces the ledger's retry jitter (a rule: up to 30 s), so
    a released or failed claim comes back within seconds. The campaign's id and its plan."""
    args = build_parser().parse_args(["campaign", "start", *argv])
    planned = commands.plan(conn, settings, args)
    if jitter_seconds is not None:
        planned["config"]["retry"]["jitter_seconds"] = jitter_seconds
    query, params, selection = planned.pop("_query")
    campaign_id, _ = commands.start(conn, instance, planned, query, params, selection, args)
    return campaign_id, planned
