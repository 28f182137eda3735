"""What one delivery of an upload message does, decided from the upload's latest run (pure)."""

from __future__ import annotations

import pytest
from dagster import DagsterRun, DagsterRunStatus

from episode_pipeline.defs.runs import IN_FLIGHT_STATUSES, retry_run_key
from episode_pipeline.defs.sensors.sqs import Outcome, decide

UPLOAD = "acme/ep-1@etag1"


def run(status: DagsterRunStatus, run_id: str = "abcdef0123456789") -> DagsterRun:
    # DagsterRun refuses QUEUED without its code origin; the decision only reads the status.
    made = DagsterRun(job_name="process_episode", run_id=run_id)
    return made._replace(status=status)


def test_the_first_delivery_starts_the_run_keyed_by_the_upload_alone():
    decision = decide(UPLOAD, None)
    assert decision.outcome is Outcome.START
    assert decision.run_key == UPLOAD  # no receive count: a redelivery finds this run


def test_a_redelivery_after_success_deletes_the_message_and_starts_nothing():
    decision = decide(UPLOAD, run(DagsterRunStatus.SUCCESS))
    assert decision.outcome is Outcome.DONE and decision.run_key is None


@pytest.mark.parametrize("status", IN_FLIGHT_STATUSES)
def test_a_redelivery_while_the_run_is_queued_or_running_joins_it(status):
    decision = decide(UPLOAD, run(status))
    assert decision.outcome is Outcome.JOIN
    assert decision.run_id == "abcdef0123456789"


@pytest.mark.parametrize("status", [DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED])
def test_a_redelivery_after_a_failure_starts_exactly_one_retry(status):
    failed = run(status)
    decision = decide(UPLOAD, failed)
    assert decision.outcome is Outcome.RETRY
    assert decision.run_key == retry_run_key(UPLOAD, failed.run_id) == f"{UPLOAD}#after-abcdef01"
    # Two ticks that see the same failure ask for the same key: Dagster starts it once.
    assert decide(UPLOAD, failed).run_key == decision.run_key
    # The retry's own failure gets a retry of its own, not the same key again.
    assert decide(UPLOAD, run(status, "99999999aaaa")).run_key != decision.run_key
