"""The campaign's governor (AIMD, seed 004's): how many of its runs are launched at once.

Backpressure halves the limit (never below `min_limit`), at most once per tick and once per pause
(one congestion event, as AIMD), and pauses the campaign for the `Retry-After` given (at most
`max_pause_seconds`), or `pause_seconds`: S3 answering SlowDown/503, ECS RunTask throttling or
reporting no capacity, or the campaign's run failure rate over the last `window` outcomes passing
`max_failure_rate`. A streak of `increase_after` successes adds one (never above `max_limit`).
Every change is a `Decision`, logged by the driver and shown by `campaign status`.

How the signals arrive: a run throttled by S3 failed its step with that error; a run ECS would not
start (RunTask throttled, no capacity) carries the launcher's exception in the run queue's engine
event (`orchestration/run_errors.run_error` reads both). The driver classifies each failed run's
error (`runtime/failure_causes.classify_error`), records the class on the ledger row
(backpressure uses up no attempt: `ledger.after_outcome`), then feeds the outcomes here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from episode_pipeline.config.settings import CampaignSettings
from episode_pipeline.runtime.failure_causes import BACKPRESSURE

# The defaults are the settings' (`CAMPAIGN_CONCURRENCY_*`, ...): declared once, in config/.
_DEFAULT = CampaignSettings()


@dataclass(frozen=True)
class GovernorSettings:
    start_limit: int = _DEFAULT.concurrency_start
    min_limit: int = _DEFAULT.concurrency_min
    max_limit: int = _DEFAULT.concurrency_max
    increase_after: int = _DEFAULT.increase_after  # successes in a row
    pause_seconds: float = _DEFAULT.pause_seconds  # when backpressure gives no Retry-After
    # The longest pause a Retry-After may ask for: a bad header (or proxy) cannot park the
    # campaign for a day.
    max_pause_seconds: float = _DEFAULT.max_pause_seconds
    window: int = _DEFAULT.failure_window  # outcomes the failure rate is measured over
    max_failure_rate: float = _DEFAULT.max_failure_rate

    def __post_init__(self) -> None:
        if not 1 <= self.min_limit <= self.start_limit <= self.max_limit:
            raise ValueError(
                f"governor: need 1 <= min_limit ({self.min_limit}) <= start_limit "
                f"({self.start_limit}) <= max_limit ({self.max_limit})"
            )
        if not 0 < self.pause_seconds <= self.max_pause_seconds:
            raise ValueError(
                f"governor: need 0 < pause_seconds ({self.pause_seconds:g}) <= max_pause_seconds "
                f"({self.max_pause_seconds:g})"
            )


@dataclass(frozen=True)
class GovernorState:
    limit: int
    ok_streak: int = 0
    paused_until: datetime | None = None
    recent: tuple[bool, ...] = field(default=())  # the last `window` outcomes, True = success
    # The pace the driver measured (waves.measured_rate): how many runs to keep queued.
    episodes_per_second: float = 0.0
    measured_at: datetime | None = None

    @classmethod
    def start(cls, settings: GovernorSettings) -> GovernorState:
        return cls(limit=settings.start_limit)

    def is_paused(self, now: datetime) -> bool:
        return self.paused_until is not None and now < self.paused_until

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["paused_until"] = self.paused_until.isoformat() if self.paused_until else None
        data["measured_at"] = self.measured_at.isoformat() if self.measured_at else None
        data["recent"] = list(self.recent)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GovernorState:
        paused, measured = data.get("paused_until"), data.get("measured_at")
        return cls(
            limit=int(data["limit"]),
            ok_streak=int(data.get("ok_streak", 0)),
            paused_until=datetime.fromisoformat(paused) if paused else None,
            recent=tuple(bool(v) for v in data.get("recent", ())),
            episodes_per_second=float(data.get("episodes_per_second", 0.0)),
            measured_at=datetime.fromisoformat(measured) if measured else None,
        )


@dataclass(frozen=True)
class Observation:
    """One finished run as the governor sees it."""

    succeeded: bool
    error_class: str | None = None
    retry_after_seconds: float | None = None


@dataclass(frozen=True)
class Decision:
    message: str
    limit_before: int
    limit_after: int
    paused_until: datetime | None = None

    def details(self) -> dict[str, Any]:
        return {
            "limit_before": self.limit_before,
            "limit_after": self.limit_after,
            "paused_until": self.paused_until.isoformat() if self.paused_until else None,
        }


def _back_off(
    state: GovernorState, settings: GovernorSettings, now: datetime, seconds: float, why: str
) -> tuple[GovernorState, Decision]:
    limit = max(settings.min_limit, state.limit // 2)
    until = now + timedelta(seconds=seconds)
    if state.paused_until is not None and state.paused_until > until:
        until = state.paused_until
    decision = Decision(
        f"{why}: concurrency {state.limit} → {limit}, paused {seconds:g} s",
        state.limit,
        limit,
        until,
    )
    return replace(state, limit=limit, ok_streak=0, paused_until=until, recent=()), decision


def pause_for(seen: Observation, settings: GovernorSettings) -> float:
    """The pause one backpressure signal asks for: its Retry-After, else the default, capped."""
    return min(seen.retry_after_seconds or settings.pause_seconds, settings.max_pause_seconds)


def observe(
    state: GovernorState,
    observations: Sequence[Observation],
    settings: GovernorSettings,
    now: datetime,
) -> tuple[GovernorState, list[Decision]]:
    """Fold one tick's finished runs into the state; the decisions taken, in order.

    As AIMD halves once per congestion event (not per lost packet), the limit is halved at most
    once per tick, and not at all by backpressure while an earlier back-off's pause lasts: the
    runs that fail together in a burst, or that were in flight when it began, are one signal. A
    later signal asking for a longer pause extends it without halving again.
    """
    decisions: list[Decision] = []
    halved = False
    for seen in observations:
        if not seen.succeeded and seen.error_class in BACKPRESSURE:
            seconds = pause_for(seen, settings)
            if halved or state.is_paused(now):
                until = now + timedelta(seconds=seconds)
                if state.paused_until is None or until > state.paused_until:
                    decisions.append(
                        Decision(
                            f"{seen.error_class} again: pause extended to {seconds:g} s "
                            f"(concurrency stays {state.limit})",
                            state.limit,
                            state.limit,
                            until,
                        )
                    )
                    state = replace(state, paused_until=until)
                continue
            state, decision = _back_off(state, settings, now, seconds, seen.error_class or "")
            decisions.append(decision)
            halved = True
            continue
        recent = (*state.recent, seen.succeeded)[-settings.window :]
        state = replace(state, recent=recent)
        failures = recent.count(False)
        if (
            not halved
            and len(recent) >= settings.window
            and failures / len(recent) > settings.max_failure_rate
        ):
            why = f"failure rate {failures}/{len(recent)} over the window"
            state, decision = _back_off(state, settings, now, settings.pause_seconds, why)
            decisions.append(decision)
            halved = True
            continue
        if not seen.succeeded:
            state = replace(state, ok_streak=0)
            continue
        streak = state.ok_streak + 1
        if streak >= settings.increase_after and state.limit < settings.max_limit:
            decisions.append(
                Decision(
                    f"{streak} successes in a row: concurrency {state.limit} → {state.limit + 1}",
                    state.limit,
                    state.limit + 1,
                )
            )
            state = replace(state, limit=state.limit + 1, ok_streak=0)
        else:
            state = replace(state, ok_streak=streak)
    return state, decisions
