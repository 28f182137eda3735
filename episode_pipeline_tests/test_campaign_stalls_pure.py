"""The canary's verdict and the stall rule (pure): a campaign never passes its canary having
compared nothing, and never stops without saying why (issue 32, finding 5 and deliverable 3)."""

from __future__ import annotations

from episode_pipeline.campaign import canary, ledger, progress
from episode_pipeline.campaign.canary import CanaryEpisode, CanarySettings, judge

BEFORE = {"frame_rows": 30, "seconds_by_camera": {"front": 1.0}, "renditions": ["front"]}
TARGET = "v2"
SETTINGS = CanarySettings()


def ok(i: int, before: dict | None = BEFORE) -> CanaryEpisode:
    return CanaryEpisode(f"o/e{i}", ledger.SUCCEEDED, before, BEFORE, TARGET)


def test_the_canary_passes_having_compared_half_its_planned_size() -> None:
    verdict = judge(4, [ok(0), ok(1), ok(2, before=None)], TARGET, SETTINGS)
    assert (verdict.outcome, verdict.compared, verdict.required) == (canary.PASSED, 2, 2)
    assert canary.required_comparisons(1) == 1 and canary.required_comparisons(50) == 25


def test_a_canary_whose_claims_were_all_released_runs_again_not_passes() -> None:
    """Released claims leave the wave (wave = NULL): nothing left is nothing compared."""
    verdict = judge(5, [], TARGET, SETTINGS)
    assert (verdict.outcome, verdict.rerun_size) == (canary.RERUN, 5)
    # Two of five left after the rest were released: the shortfall runs again.
    verdict = judge(5, [ok(0), ok(1)], TARGET, SETTINGS)
    assert (verdict.outcome, verdict.rerun_size) == (canary.RERUN, 3)


def test_a_canary_without_figures_from_before_stops_for_the_operator() -> None:
    """The first campaign after migration 004: every episode succeeded, none had a record."""
    episodes = [ok(i, before=None) for i in range(4)]
    verdict = judge(4, episodes, TARGET, SETTINGS)
    assert (verdict.outcome, verdict.compared, verdict.succeeded) == (canary.NO_BASELINE, 0, 4)
    assert "--accept-no-baseline" in verdict.message()
    assert judge(4, episodes, TARGET, SETTINGS, accept_no_baseline=True).outcome == canary.PASSED


def test_findings_and_failures_stop_it_and_a_claimed_episode_waits() -> None:
    drifted = CanaryEpisode(
        "o/d", ledger.SUCCEEDED, BEFORE, {**BEFORE, "seconds_by_camera": {"front": 2.0}}, TARGET
    )
    verdict = judge(2, [ok(0), drifted], TARGET, SETTINGS)
    assert verdict.outcome == canary.FINDINGS and list(verdict.findings) == ["o/d"]
    failed = [CanaryEpisode(f"o/f{i}", ledger.REJECTED) for i in range(3)]
    assert "(wave)" in judge(4, [ok(0), *failed], TARGET, SETTINGS).findings
    other = CanaryEpisode("o/v", ledger.SUCCEEDED, BEFORE, BEFORE, "v1")
    assert judge(1, [other], TARGET, SETTINGS).outcome == canary.FINDINGS
    claimed = CanaryEpisode("o/r", ledger.REQUESTED)
    assert judge(2, [ok(0), claimed], TARGET, SETTINGS).outcome == canary.WAITING


def facts(**changes: object) -> progress.Facts:
    values: dict = {
        "state": ledger.RUNNING,
        "counts": {ledger.PENDING: 10, ledger.REQUESTED: 2},
        "settled": 0,
        "live_budget_full": False,
        "canary": canary.PASSED,
        "seconds_since_progress": 60.0,
        "released_since_progress": 0,
        "stall_after_seconds": 3600.0,
    }
    values.update(changes)
    return progress.Facts(**values)


def cause(**changes: object) -> str | None:
    found = progress.stall(facts(**changes))
    return found.cause if found else None


def test_a_running_campaign_that_settles_episodes_is_not_stalled() -> None:
    assert cause() is None
    assert cause(settled=3, seconds_since_progress=0, live_budget_full=True) is None


def test_a_full_live_budget_with_nothing_in_flight_is_a_stall_at_once() -> None:
    """Rejected episodes' partitions never pruned fill the budget: no wave will ever come."""
    assert cause(live_budget_full=True, counts={ledger.PENDING: 5}) == progress.BUDGET_FULL
    # Runs in flight will free the budget when they succeed: not yet.
    assert cause(live_budget_full=True) is None


def test_no_episode_settled_for_two_stale_claim_windows_is_a_stall() -> None:
    assert progress.stall_seconds(1800) == 3600
    assert cause(seconds_since_progress=3599) is None
    assert cause(seconds_since_progress=3601) == progress.NO_PROGRESS
    assert cause(seconds_since_progress=3601, released_since_progress=4) == progress.CLAIMS_RELEASED


def test_stopped_and_done_campaigns_name_their_cause_paused_ones_none() -> None:
    stopped = {"state": ledger.STOPPED, "seconds_since_progress": 0}
    assert cause(**stopped, canary=canary.NO_BASELINE) == progress.CANARY_NO_BASELINE
    assert cause(**stopped, canary=canary.FINDINGS) == progress.CANARY_FINDINGS
    assert cause(**stopped, canary="resumed") == progress.STOPPED
    done = {"state": ledger.DONE, "seconds_since_progress": 0}
    assert cause(**done, counts={ledger.REJECTED: 7}) == progress.ALL_REJECTED
    assert cause(**done, counts={ledger.REJECTED: 7, ledger.SUCCEEDED: 1}) is None
    assert cause(state=ledger.PAUSED, seconds_since_progress=10**6) is None
    assert cause(state=ledger.CANCELED, seconds_since_progress=10**6) is None
