"""What one delivery of an upload message does, decided from the upload's latest run (pure)."""

from __future__ import annotations

import pytest
from dagster import DagsterRun, DagsterRunStatus

from episode_pipeline.instance.run_tags import IN_FLIGHT_STATUSES, retry_run_key
from episode_pipeline.orchestration.upload_runs import Outcome, decide
from episode_pipeline_tests.support.dagster_internals import WILL_RETRY_TAG

UPLOAD = "acme/ep-1@etag1"


def run(
    status: DagsterRunStatus, run_id: str = "abcdef0123456789", tags: dict[str, str] | None = None
) -> DagsterRun:
    # DagsterRun refuses QUEUED without its code origin; the decision reads the status and tags.
    made = DagsterRun(job_name="process_episode", run_id=run_id, tags=tags or {})
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


def test_a_redelivery_after_a_crash_dagster_retries_joins_it_and_starts_nothing():
    """`run_retries` (dagster.yaml) re-runs a crashed run: the failed run is tagged
    `dagster/will_retry=true` at once, its retry run a few seconds later. A retry of our own in
    between processed the upload twice (two successful runs: test_crash_daemon.py's machine
    crash, once the local instance ran production's run_retries)."""
    crashed = run(DagsterRunStatus.FAILURE, tags={WILL_RETRY_TAG: "true"})
    decision = decide(UPLOAD, crashed)
    assert decision.outcome is Outcome.AWAIT_RETRY and decision.run_key is None
    assert decision.run_id == crashed.run_id
    # Dagster decided not to retry it (an asset's failure, retries used up, the retry failed to
    # start): the delivery brings our one retry, as before.
    given_up = run(DagsterRunStatus.FAILURE, tags={WILL_RETRY_TAG: "false"})
    assert decide(UPLOAD, given_up).outcome is Outcome.RETRY
