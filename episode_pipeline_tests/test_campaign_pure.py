"""The campaign's pure rules: wave sizing, the ledger's transitions, the governor, the canary."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import pytest
from dagster import DagsterRun, DagsterRunStatus

from episode_pipeline.campaign import ledger
from episode_pipeline.campaign.canary import CanarySettings, compare
from episode_pipeline.campaign.config import CampaignConfig
from episode_pipeline.campaign.governor import (
    GovernorSettings,
    GovernorState,
    Observation,
    observe,
)
from episode_pipeline.campaign.waves import (
    WaveSettings,
    batches,
    estimate,
    measured_rate,
    next_wave_size,
    runs_to_keep_in_flight,
)
from episode_pipeline.config.settings import CampaignSettings
from episode_pipeline.episodes.code_versions import code_version_digest
from episode_pipeline.runtime.failure_causes import NO_CAPACITY, OTHER, THROTTLED
from episode_pipeline_tests.support.dagster_internals import RunRecord

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


# -- waves --------------------------------------------------------------------------------------


def size(**overrides: object) -> int:
    values: dict = {
        "settings": WaveSettings(wave_size=100, episodes_per_run=1, max_live_partitions=100),
        "limit": 8,
        "runs_budget": 8,
        "runs_in_flight": 0,
        "campaign_live_partitions": 0,
        "claimable": 1000,
        "canary_size": None,
    }
    return next_wave_size(**{**values, **overrides})


def test_a_wave_fills_the_runs_budget_in_runs_of_k_episodes() -> None:
    assert size() == 8
    assert size(settings=WaveSettings(wave_size=100, episodes_per_run=5)) == 40
    assert size(runs_in_flight=3) == 5
    assert size(runs_budget=30, runs_in_flight=10) == 20  # queued beyond the limit


def test_no_wave_until_half_the_limit_has_room_nor_beyond_the_live_budget() -> None:
    assert size(runs_in_flight=5) == 0  # room for 3, half the limit is 4: wait for more
    assert size(runs_in_flight=8) == 0
    assert size(runs_budget=40, runs_in_flight=36) == 4
    assert size(campaign_live_partitions=97) == 3  # one wave's budget
    assert size(campaign_live_partitions=100) == 0
    assert size(claimable=2) == 2


def test_the_budget_keeps_the_limit_busy_through_a_claims_lead_time() -> None:
    # Slow runs: one more limit's worth queued. Fast runs: what finishes in the lead time.
    assert runs_to_keep_in_flight(8, runs_per_second=0.05, lead_seconds=90) == 16
    assert runs_to_keep_in_flight(8, runs_per_second=0.8, lead_seconds=90) == 8 + 72
    assert runs_to_keep_in_flight(1, runs_per_second=0.0, lead_seconds=90) == 2


def test_the_measured_rate_rises_at_once_and_falls_slowly() -> None:
    assert measured_rate(0.0, None, 50, NOW) == 0.0  # the first tick: nothing to divide by
    assert measured_rate(0.0, NOW, 24, NOW + timedelta(seconds=30)) == 0.8  # at once
    rate = 0.8
    for tick in range(1, 11):  # 10 ticks of 10 s at 0.8/s: it stays
        before, after = (NOW + timedelta(seconds=10 * t) for t in (tick - 1, tick))
        rate = measured_rate(rate, before, 8, after)
    assert abs(rate - 0.8) < 1e-9
    slower = measured_rate(rate, NOW, 0, NOW + timedelta(seconds=120))  # one time constant idle
    assert abs(slower - rate / math.e) < 1e-9
    assert measured_rate(0.3, NOW, 5, NOW) == 0.3  # no time passed


def test_the_first_wave_is_the_canary() -> None:
    assert size(canary_size=3) == 3
    assert CanarySettings(episodes=50, fraction=0.01).wave_size(100_000) == 50
    assert CanarySettings(episodes=50, fraction=0.01).wave_size(2_000) == 20
    assert CanarySettings(episodes=50, fraction=0.01).wave_size(20) == 1


def test_batches_split_a_wave_into_runs_of_k() -> None:
    assert batches(12, 5) == [5, 5, 2]
    assert batches(3, 1) == [1, 1, 1]


def test_the_estimate_pays_one_cold_start_per_run() -> None:
    one = estimate(
        episodes=1000,
        settings=WaveSettings(wave_size=100, episodes_per_run=1),
        concurrency=10,
        measured_run_seconds=90.0,
        measured_from=40,
        canary_size=10,
    )
    ten = estimate(
        episodes=1000,
        settings=WaveSettings(wave_size=100, episodes_per_run=10),
        concurrency=10,
        measured_run_seconds=90.0,
        measured_from=40,
    )
    assert (one.runs, one.waves, one.task_hours) == (1000, 11, 25.0)  # 90 s each
    assert (ten.runs, ten.task_hours) == (100, 10.0)  # 60 s + 10 x 30 s per run
    assert one.hours_to_finish == 2.5 and one.s3_requests == 40_000


# -- the ledger ---------------------------------------------------------------------------------


POLICY = ledger.RetryPolicy(max_attempts=3, base_seconds=60, max_seconds=600, jitter_seconds=10)


def test_a_failure_waits_exponentially_with_jitter_then_is_rejected() -> None:
    rng = random.Random(7)
    failed = ledger.Outcome(False, "boom", OTHER)
    first = ledger.after_outcome(0, failed, NOW, POLICY, rng)
    assert first.state == ledger.FAILED and first.attempts == 1
    assert timedelta(seconds=60) <= first.retry_after - NOW <= timedelta(seconds=70)
    second = ledger.after_outcome(1, failed, NOW, POLICY, rng)
    assert timedelta(seconds=120) <= second.retry_after - NOW <= timedelta(seconds=130)
    third = ledger.after_outcome(2, failed, NOW, POLICY, rng)
    assert (third.state, third.attempts, third.last_error) == (ledger.REJECTED, 3, "boom")
    assert ledger.backoff_seconds(10, POLICY, rng) <= 610  # capped


def test_success_clears_the_error_and_a_non_retryable_failure_is_rejected_at_once() -> None:
    rng = random.Random(1)
    done = ledger.after_outcome(1, ledger.Outcome(True), NOW, POLICY, rng)
    assert (done.state, done.attempts, done.last_error, done.retry_after) == (
        ledger.SUCCEEDED,
        2,
        None,
        None,
    )
    bad = ledger.after_outcome(
        0, ledger.Outcome(False, "bad archive", retryable=False), NOW, POLICY, rng
    )
    assert bad.state == ledger.REJECTED


def test_backpressure_uses_up_no_attempt_so_a_throttling_storm_rejects_nothing() -> None:
    """Issue 32, finding 10: a throttled or unplaced run says nothing about its episode. Ten in
    a row leave it `failed` (retried after its next attempt's backoff) with its attempts as they
    were; an ordinary failure then still counts."""
    rng = random.Random(3)
    attempts = 1
    for error_class in [THROTTLED, NO_CAPACITY] * 5:
        outcome = ledger.Outcome(False, "ThrottlingException: Rate exceeded", error_class)
        transition = ledger.after_outcome(attempts, outcome, NOW, POLICY, rng)
        assert (transition.state, transition.attempts) == (ledger.FAILED, 1)
        assert transition.error_class == error_class
        assert timedelta(seconds=120) <= transition.retry_after - NOW <= timedelta(seconds=130)
        attempts = transition.attempts
    other = ledger.after_outcome(attempts, ledger.Outcome(False, "boom", OTHER), NOW, POLICY, rng)
    assert (other.state, other.attempts) == (ledger.FAILED, 2)
    last = ledger.after_outcome(2, ledger.Outcome(False, "boom", OTHER), NOW, POLICY, rng)
    assert last.state == ledger.REJECTED


def test_the_end_of_a_campaign() -> None:
    # Which rows a claim takes is its SQL's (db.CLAIMABLE_WHERE): test_campaign_ledger.py.
    assert not ledger.is_finished({ledger.SUCCEEDED: 3, ledger.FAILED: 1})
    assert ledger.is_finished({ledger.SUCCEEDED: 3, ledger.REJECTED: 1})


def test_a_release_whose_backfill_ended_is_an_attempt_with_backoff_then_rejected() -> None:
    """Finding 7: a wave whose backfill keeps ending without runs does not loop forever."""
    rng = random.Random(2)
    cause = "wave 3's backfill c1 ended CANCELED"
    # Never handed to the run queue (paused before its backfill was recorded): no attempt.
    plain = ledger.after_release(1, None, NOW, POLICY, rng)
    assert (plain.state, plain.attempts, plain.retry_after, plain.last_error) == (
        ledger.PENDING,
        1,
        None,
        None,
    )
    first = ledger.after_release(0, cause, NOW, POLICY, rng)
    assert (first.state, first.attempts, first.error_class) == (ledger.PENDING, 1, ledger.NO_RUN)
    assert timedelta(seconds=60) <= first.retry_after - NOW <= timedelta(seconds=70)
    assert first.last_error == f"no run came: {cause}"
    # The claim skips it until then: test_campaign_ledger's release test, on the claim's SQL.
    last = ledger.after_release(2, cause, NOW, POLICY, rng)
    assert (last.state, last.attempts, last.retry_after) == (ledger.REJECTED, 3, None)
    assert cause in last.last_error and "3 attempts" in last.last_error


def test_only_a_settled_stopped_or_canceled_campaign_is_skipped() -> None:
    from episode_pipeline.campaign.ledger import is_settled_out

    assert is_settled_out(ledger.CANCELED, has_requested=False, has_to_prune=False)
    assert is_settled_out(ledger.STOPPED, has_requested=False, has_to_prune=False)
    assert not is_settled_out(ledger.CANCELED, has_requested=True, has_to_prune=False)
    assert not is_settled_out(ledger.STOPPED, has_requested=False, has_to_prune=True)
    assert not is_settled_out(ledger.RUNNING, has_requested=False, has_to_prune=False)
    assert not is_settled_out(ledger.PAUSED, has_requested=False, has_to_prune=False)
    assert not is_settled_out(ledger.CANCELED, False, False, has_unfinished_runs=True)


def test_a_settled_out_canceled_campaign_leaves_the_launch_limits_once_quiet() -> None:
    assert ledger.holds_launches_at_zero(ledger.CANCELED, 599.0, quiet_seconds=600.0)
    assert not ledger.holds_launches_at_zero(ledger.CANCELED, 600.0, quiet_seconds=600.0)
    assert ledger.holds_launches_at_zero(ledger.STOPPED, 1e9, quiet_seconds=600.0)


def test_unreadable_launch_limits_close_the_campaign_lane() -> None:
    """Finding 10: the run queue's limits fail closed (a key-only entry replaces the lane's)."""
    from episode_pipeline.instance.campaign_queue import limit_entries
    from episode_pipeline.instance.run_tags import CAMPAIGN_TAG
    from episode_pipeline_tests.support.dagster_internals import TagConcurrencyLimitsCounter

    assert limit_entries({"a": 2, "b": -1}) == [
        {"key": CAMPAIGN_TAG, "value": "a", "limit": 2},
        {"key": CAMPAIGN_TAG, "value": "b", "limit": 0},
    ]
    lane = [{"key": CAMPAIGN_TAG, "limit": 8}]
    counter = TagConcurrencyLimitsCounter([*lane, *limit_entries(None)], [])
    assert counter.is_blocked(_run("r", DagsterRunStatus.NOT_STARTED, {CAMPAIGN_TAG: "a"}))
    assert not counter.is_blocked(_run("u", DagsterRunStatus.NOT_STARTED, {"org": "o"}))


# -- the run that decides an episode (run lineage under run_retries) ----------------------------


def _run(run_id: str, status: DagsterRunStatus, tags: dict[str, str] | None = None) -> DagsterRun:
    return DagsterRun(job_name="process_episode", run_id=run_id, status=status, tags=tags or {})


def _record(run: DagsterRun, ended: datetime | None = NOW) -> RunRecord:
    return RunRecord(
        storage_id=1,
        dagster_run=run,
        create_timestamp=NOW,
        update_timestamp=ended or NOW,
        end_time=ended.timestamp() if ended else None,
    )


WILL_RETRY = {"dagster/will_retry": "true"}


def test_a_retried_failure_is_superseded_by_its_retry() -> None:
    """Finding 1: the tag stays `true` on the crashed run after its retry succeeded."""
    from episode_pipeline.orchestration.campaigns import _settled_run

    crashed = _run("a", DagsterRunStatus.FAILURE, WILL_RETRY)
    retry = _run("b", DagsterRunStatus.SUCCESS, {"dagster/parent_run_id": "a"})
    assert _settled_run([_record(retry), _record(crashed)], NOW) is retry
    # The retry still running: in flight; the retry failing for good: it decides.
    running = _run("b", DagsterRunStatus.STARTED, {"dagster/parent_run_id": "a"})
    assert _settled_run([_record(running, None), _record(crashed)], NOW) is None
    failed = _run("b", DagsterRunStatus.FAILURE, {"dagster/parent_run_id": "a"})
    assert _settled_run([_record(failed), _record(crashed)], NOW) is failed
    # The parent tagged with its retry's id (run_retries' own tag) is superseded too.
    tagged = _run("a", DagsterRunStatus.FAILURE, {**WILL_RETRY, "dagster/auto_retry_run_id": "x"})
    assert _settled_run([_record(tagged)], NOW) is tagged  # its retry gone: it decides


def test_a_failure_to_be_retried_waits_only_for_run_retries_decision() -> None:
    from episode_pipeline.orchestration.campaigns import RETRY_DECISION_SECONDS, _settled_run

    crashed = _run("a", DagsterRunStatus.FAILURE, WILL_RETRY)
    assert _settled_run([_record(crashed)], NOW + timedelta(seconds=5)) is None
    later = NOW + timedelta(seconds=RETRY_DECISION_SECONDS + 1)
    assert _settled_run([_record(crashed)], later) is crashed
    # A success of the episode decides over a later failure of another run.
    ok = _run("c", DagsterRunStatus.SUCCESS)
    assert _settled_run([_record(crashed), _record(ok)], later) is ok
    # ... at once (found by the soak): a K > 1 batch's abandoned child is tagged to be retried
    # and never is, while the batch's retry ran the episode again.
    assert _settled_run([_record(crashed), _record(ok)], NOW + timedelta(seconds=5)) is ok


def test_a_failure_to_be_retried_decides_once_its_wave_s_backfill_has_ended() -> None:
    """run_retries retries no run of an ended backfill but leaves its `will_retry` tag (found by
    the daemon test of ECS launch failures): the failure decides soon after the backfill ended,
    not `RETRY_DECISION_SECONDS` after the run."""
    from episode_pipeline.orchestration.campaigns import RETRY_AFTER_BACKFILL_SECONDS, _settled_run

    crashed = _run("a", DagsterRunStatus.FAILURE, WILL_RETRY)
    soon = NOW + timedelta(seconds=RETRY_AFTER_BACKFILL_SECONDS + 1)
    assert _settled_run([_record(crashed)], soon, backfill_ended=NOW.timestamp()) is crashed
    # The backfill just ended (run_retries' consumer may be launching the retry) or still runs.
    just = NOW + timedelta(seconds=1)
    assert _settled_run([_record(crashed)], just, backfill_ended=NOW.timestamp()) is None
    assert _settled_run([_record(crashed)], soon, backfill_ended=None) is None
    # A retry made before the backfill ended still supersedes the failure.
    retry = _run("b", DagsterRunStatus.STARTED, {"dagster/parent_run_id": "a"})
    assert _settled_run([_record(retry, None), _record(crashed)], soon, NOW.timestamp()) is None


def test_operator_actions_follow_the_states() -> None:
    assert ledger.campaign_action(ledger.RUNNING, "pause") == ledger.PAUSED
    assert ledger.campaign_action(ledger.STOPPED, "resume") == ledger.RUNNING
    assert ledger.campaign_action(ledger.PAUSED, "cancel") == ledger.CANCELED
    with pytest.raises(ledger.InvalidTransition, match="cannot resume a campaign that is done"):
        ledger.campaign_action(ledger.DONE, "resume")


# -- the governor -------------------------------------------------------------------------------

GOVERNOR = GovernorSettings(
    start_limit=8, min_limit=1, max_limit=10, increase_after=3, pause_seconds=30, window=4
)


def test_backpressure_halves_and_pauses_for_its_retry_after() -> None:
    state, decisions = observe(
        GovernorState.start(GOVERNOR), [Observation(False, THROTTLED, 12.0)], GOVERNOR, NOW
    )
    assert state.limit == 4 and state.paused_until == NOW + timedelta(seconds=12)
    assert state.is_paused(NOW) and not state.is_paused(NOW + timedelta(seconds=12))
    assert decisions[0].limit_before == 8 and "throttled" in decisions[0].message
    # Once the pause is over, each new signal halves again, down to the minimum.
    for tick in range(1, 5):
        later = NOW + timedelta(minutes=tick)
        state, _ = observe(state, [Observation(False, NO_CAPACITY)], GOVERNOR, later)
    assert state.limit == 1  # never below the minimum
    assert state.paused_until == later + timedelta(seconds=30)  # no Retry-After: the default


def test_a_burst_of_throttled_runs_halves_once_per_tick_and_once_per_pause() -> None:
    """Issue 32, finding 10: the runs of one burst fail together (or were in flight when it
    began): one congestion event, one halving (AIMD), not one per run. A longer Retry-After
    among them extends the pause; the limit stays."""
    burst = [Observation(False, THROTTLED, 5.0)] * 6 + [Observation(False, NO_CAPACITY, 20.0)]
    state, decisions = observe(GovernorState(limit=8), burst, GOVERNOR, NOW)
    assert state.limit == 4
    assert state.paused_until == NOW + timedelta(seconds=20)
    assert [d.limit_after for d in decisions] == [4, 4]
    assert "pause extended to 20 s" in decisions[1].message
    # The next tick, still inside the pause: the runs in flight during the burst fail too.
    inside = NOW + timedelta(seconds=10)
    state, decisions = observe(state, [Observation(False, THROTTLED)] * 3, GOVERNOR, inside)
    assert state.limit == 4 and state.paused_until == inside + timedelta(seconds=30)
    assert [d.limit_after for d in decisions] == [4]  # extended once, not halved
    # After the pause, a new burst is a new event.
    after = NOW + timedelta(minutes=5)
    state, decisions = observe(state, burst, GOVERNOR, after)
    assert state.limit == 2 and decisions[0].limit_after == 2


def test_a_retry_after_is_capped_by_the_setting() -> None:
    """Issue 32, finding 10: a Retry-After of a day (a bad header, a proxy) pauses for
    `max_pause_seconds` at most."""
    settings = GovernorSettings(start_limit=8, pause_seconds=30, max_pause_seconds=600)
    day = Observation(False, THROTTLED, 86_400.0)
    state, decisions = observe(GovernorState.start(settings), [day], settings, NOW)
    assert state.paused_until == NOW + timedelta(seconds=600)
    assert "paused 600 s" in decisions[0].message
    with pytest.raises(ValueError, match="max_pause_seconds"):
        GovernorSettings(pause_seconds=120, max_pause_seconds=60)
    config = CampaignConfig.from_settings(CampaignSettings(max_pause_seconds=300.0))
    assert config.governor.max_pause_seconds == 300.0
    # A campaign started before the setting existed keeps the default cap.
    stored = config.to_json()
    del stored["governor"]["max_pause_seconds"]
    assert CampaignConfig.from_json(stored).governor.max_pause_seconds == 900.0


def test_a_streak_of_successes_adds_one_up_to_the_maximum() -> None:
    state = GovernorState(limit=9)
    state, decisions = observe(state, [Observation(True)] * 3, GOVERNOR, NOW)
    assert state.limit == 10 and len(decisions) == 1
    state, decisions = observe(state, [Observation(True)] * 6, GOVERNOR, NOW)
    assert state.limit == 10 and decisions == []
    # An ordinary failure breaks the streak without halving.
    state, _ = observe(
        GovernorState(limit=5), [Observation(True)] * 2 + [Observation(False, OTHER)], GOVERNOR, NOW
    )
    assert (state.limit, state.ok_streak) == (5, 0)


def test_a_failure_rate_over_the_window_halves() -> None:
    seen = [Observation(True), Observation(False, OTHER), Observation(False, OTHER)]
    state, decisions = observe(GovernorState(limit=8), seen, GOVERNOR, NOW)
    assert state.limit == 8 and not decisions  # the window is not full yet
    state, decisions = observe(state, [Observation(False, OTHER)], GOVERNOR, NOW)
    assert state.limit == 4 and "failure rate 3/4" in decisions[0].message


def test_the_state_round_trips_through_json() -> None:
    state = GovernorState(limit=3, ok_streak=2, paused_until=NOW, recent=(True, False))
    assert GovernorState.from_json(state.to_json()) == state


# -- the canary ---------------------------------------------------------------------------------

BEFORE = {
    "frame_rows": 30,
    "seconds_by_camera": {"front": 1.0, "wrist": 1.0},
    "renditions": ["front", "front/240", "wrist"],
    "sync_findings": 0,
}


def test_the_canary_passes_within_tolerance_and_names_what_drifted() -> None:
    settings = CanarySettings(seconds_tolerance=0.5)
    assert (
        compare(BEFORE, {**BEFORE, "seconds_by_camera": {"front": 1.4, "wrist": 1.0}}, settings)
        == []
    )
    drifted = {**BEFORE, "seconds_by_camera": {"front": 1.6, "wrist": 1.0}}
    assert compare(BEFORE, drifted, settings) == [
        "camera front: duration 1.000 s → 1.600 s (drift +0.600 s > 0.5 s)"
    ]
    changed = {**BEFORE, "frame_rows": 29, "renditions": ["front", "wrist"], "sync_findings": 2}
    assert compare(BEFORE, changed, settings) == [
        "frame rows 30 → 29",
        "renditions: gone ['front/240'], new -",
        "sync findings 0 → 2",
    ]


def test_the_canary_ignores_what_the_change_means_to_change_and_the_unrecorded() -> None:
    settings = CanarySettings(expect=("renditions",))
    assert (
        compare(BEFORE, {**BEFORE, "renditions": ["front", "front/240", "front/480"]}, settings)
        == []
    )
    assert compare(None, BEFORE, settings) == []
    assert compare(BEFORE, {**BEFORE, "sync_findings": None}, settings) == []
    with pytest.raises(ValueError, match="unknown figure"):
        CanarySettings(expect=("colour",))


def test_the_config_round_trips_and_the_digest_ignores_order() -> None:
    config = CampaignConfig.from_settings(CampaignSettings(), expect=("renditions",), wave_size=20)
    assert CampaignConfig.from_json(config.to_json()) == config
    assert config.waves.wave_size == 20 and config.waves.max_live_partitions >= 20
    assert code_version_digest({"a": "1", "b": "2"}) == code_version_digest({"b": "2", "a": "1"})
    assert code_version_digest({"a": "1"}) != code_version_digest({"a": "2"})


def test_the_campaign_command_reads_its_selection_and_pacing() -> None:
    from episode_pipeline.cli import build_parser
    from episode_pipeline.commands.campaign import campaign_id_for, selection_of

    args = build_parser().parse_args(
        [
            "campaign",
            "plan",
            "--stale",
            "--org",
            "acme",
            "--wave-size",
            "200",
            "--expect",
            "renditions",
        ]
    )
    selection = selection_of(args, "abc123")
    assert (selection.org, selection.stale_for, args.wave_size, args.expect) == (
        "acme",
        "abc123",
        200,
        ["renditions"],
    )
    status = build_parser().parse_args(["campaign", "status", "ladder-1a2b3c", "--json"])
    assert (status.action, status.campaign, status.json) == ("status", "ladder-1a2b3c", True)
    named = build_parser().parse_args(["campaign", "plan", "--episode", "acme/ep-1", "--org", "x"])
    with pytest.raises(ValueError, match="not both"):
        selection_of(named, "abc123")
    assert campaign_id_for("Ladder 1080p!").startswith("ladder-1080p-")
