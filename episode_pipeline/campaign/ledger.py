"""The ledger's states and transitions (seed 004's way): pure, the SQL is `db/campaigns.py`.

An episode of a campaign is `pending` (to claim), `requested` (claimed into a wave: its run is asked
for), `succeeded`, `failed` (claimable again after `retry_after`, exponential backoff with jitter)
or `rejected` (out of attempts, or failed in a way a retry cannot fix: on its archive). A claim
whose run never came is released back to `pending`; when its wave's backfill ended without the run,
that counts as an attempt (with the same backoff, in `retry_after`), so a wave that can never make
its runs ends `rejected` instead of being claimed again every tick. The transitions, each under a
crash, are listed in docs/campaign-ledger.md. The primary key (campaign, org, episode) is the
idempotency key: an episode is claimed into at most one wave at a time, and a wave's runs are found
again by the wave's tag after any crash.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from episode_pipeline.runtime.failure_causes import BACKPRESSURE

PENDING = "pending"
REQUESTED = "requested"
SUCCEEDED = "succeeded"
FAILED = "failed"
REJECTED = "rejected"
EPISODE_STATES = (PENDING, REQUESTED, SUCCEEDED, FAILED, REJECTED)
SETTLED = (SUCCEEDED, REJECTED)  # never claimed again by this campaign

# The campaign's own states.
RUNNING = "running"
PAUSED = "paused"
STOPPED = "stopped"  # by the canary or the governor: the operator resumes it deliberately
CANCELED = "canceled"
DONE = "done"

# What an operator may do from each state (`campaign pause|resume|cancel`).
_ACTIONS = {
    "pause": {RUNNING: PAUSED},
    "resume": {PAUSED: RUNNING, STOPPED: RUNNING},
    "cancel": {RUNNING: CANCELED, PAUSED: CANCELED, STOPPED: CANCELED},
}


class InvalidTransition(ValueError):
    """An operator action the campaign's state does not allow."""


def campaign_action(state: str, action: str) -> str:
    """The campaign's state after `action`; raises InvalidTransition, naming both."""
    allowed = _ACTIONS[action]
    if state not in allowed:
        raise InvalidTransition(
            f"cannot {action} a campaign that is {state} (only from {', '.join(allowed)})"
        )
    return allowed[state]


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3
    base_seconds: float = 60.0
    max_seconds: float = 3600.0
    jitter_seconds: float = 30.0


@dataclass(frozen=True)
class Outcome:
    """What happened to one requested episode's run."""

    succeeded: bool
    error: str | None = None
    error_class: str | None = None  # failure_causes.classify_error's
    retryable: bool = True


@dataclass(frozen=True)
class Transition:
    """The ledger row's new values after an outcome."""

    state: str
    attempts: int
    retry_after: datetime | None
    last_error: str | None
    error_class: str | None


def backoff_seconds(attempts: int, policy: RetryPolicy, rng: random.Random) -> float:
    """`base · 2^(attempts-1)`, capped, plus uniform jitter: a fleet's failures spread out."""
    delay = min(policy.max_seconds, policy.base_seconds * 2 ** max(0, attempts - 1))
    return delay + rng.uniform(0, policy.jitter_seconds)


def after_outcome(
    attempts: int, outcome: Outcome, now: datetime, policy: RetryPolicy, rng: random.Random
) -> Transition:
    """`requested` → succeeded | failed (with its retry time) | rejected; `attempts` counts runs.

    Backpressure (S3 or ECS throttling, no ECS capacity) says nothing about the episode: it uses
    up no attempt, so a throttling storm cannot reject good episodes for good. The episode is
    retried after the backoff its next attempt would wait (the governor pauses the campaign
    meanwhile)."""
    if outcome.succeeded:
        return Transition(SUCCEEDED, attempts + 1, None, None, None)
    error = (outcome.error or "run failed")[:500]
    if outcome.retryable and outcome.error_class in BACKPRESSURE:
        retry_at = now + timedelta(seconds=backoff_seconds(attempts + 1, policy, rng))
        return Transition(FAILED, attempts, retry_at, error, outcome.error_class)
    attempts += 1
    if not outcome.retryable or attempts >= policy.max_attempts:
        return Transition(REJECTED, attempts, None, error, outcome.error_class)
    retry_at = now + timedelta(seconds=backoff_seconds(attempts, policy, rng))
    return Transition(FAILED, attempts, retry_at, error, outcome.error_class)


NO_RUN = "no_run"  # the error class of a released claim: its wave's backfill made no run


def after_release(
    attempts: int,
    cause: str | None,
    now: datetime,
    policy: RetryPolicy,
    rng: random.Random,
) -> Transition:
    """`requested` → `pending` (its run never came). `cause` None: the wave was never handed to
    the run queue (paused or canceled before its backfill was recorded), not an attempt. With a
    cause (its backfill ended without the run) it is one: the row waits its backoff, and once
    the attempts run out it is `rejected` with the cause, never claimed again."""
    if cause is None:
        return Transition(PENDING, attempts, None, None, None)
    attempts += 1
    error = f"no run came: {cause}"[:500]
    if attempts >= policy.max_attempts:
        return Transition(REJECTED, attempts, None, f"{error} ({attempts} attempts)", NO_RUN)
    retry_at = now + timedelta(seconds=backoff_seconds(attempts, policy, rng))
    return Transition(PENDING, attempts, retry_at, error, NO_RUN)


def is_finished(counts: dict[str, int]) -> bool:
    """Every episode settled: the campaign is done (failed ones would still be retried)."""
    return sum(counts.get(state, 0) for state in (PENDING, REQUESTED, FAILED)) == 0


def is_settled_out(
    state: str, has_requested: bool, has_to_prune: bool, has_unfinished_runs: bool = False
) -> bool:
    """A stopped or canceled campaign with no claim in flight, no partition left to prune and
    no run of it unfinished (a canceled one's: a late retry of run_retries, to cancel) has
    nothing for a tick to do: skipped without counting its ledger (a stopped one is resumed by
    its operator, which makes it running again)."""
    return (
        state in (STOPPED, CANCELED)
        and not has_requested
        and not has_to_prune
        and not has_unfinished_runs
    )


def holds_launches_at_zero(state: str, seconds_since_change: float, quiet_seconds: float) -> bool:
    """Whether a settled-out campaign (`is_settled_out`) keeps its 0 in the published launch
    limits. A stopped one does (its operator may resume it). A canceled one only until it has
    been quiet (not driven, nothing of it unfinished) for `quiet_seconds`, the time run_retries
    takes to make a retry it decided before the tick told it not to: then the entry is dropped,
    so the limits do not grow by one entry per canceled campaign forever."""
    return state == STOPPED or (state == CANCELED and seconds_since_change < quiet_seconds)
