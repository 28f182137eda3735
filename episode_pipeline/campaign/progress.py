"""Is the campaign making progress? (pure; the driver records the answer, `campaign status`
shows it, the `campaign_driver` sensor counts it as `CampaignsStalled`, an alarm watches it).

A campaign stops silently in many ways: its wave size is 0 because the partitions it added fill
its live budget and nothing is in flight to free them; every claim is released (their backfills
end without runs) and claimed again, tick after tick; every episode is rejected; the canary had
nothing to compare. Each is a `Stall` with its cause, recorded on the campaign (its report's
`stall`) until it makes progress again — an episode settled, or the operator's resume.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from episode_pipeline.campaign import canary, ledger

BUDGET_FULL = "budget_full"
CLAIMS_RELEASED = "claims_released"
ALL_REJECTED = "all_rejected"
CANARY_NO_BASELINE = "canary_no_baseline"
CANARY_FINDINGS = "canary_findings"
STOPPED = "stopped"
NO_PROGRESS = "no_progress"
CAUSES = (
    BUDGET_FULL,
    CLAIMS_RELEASED,
    ALL_REJECTED,
    CANARY_NO_BASELINE,
    CANARY_FINDINGS,
    STOPPED,
    NO_PROGRESS,
)


def stall_seconds(stale_claim_seconds: float) -> float:
    """No episode settled for this long is a stall: a claim's run must come within one
    `stale_claim_seconds`; two such windows with nothing settled is not a slow campaign."""
    return 2 * stale_claim_seconds


@dataclass(frozen=True)
class Facts:
    """What one driver tick knows of one campaign."""

    state: str  # the campaign's, after the tick
    counts: Mapping[str, int]  # the ledger's rows by state
    settled: int  # rows the tick moved out of `requested` (succeeded, failed, rejected)
    live_budget_full: bool  # the wave was 0 because the campaign's live partitions fill it
    canary: str | None  # the report's canary verdict (canary.PASSED, NO_BASELINE, ...)
    seconds_since_progress: float  # since an episode last settled (or the start, a resume)
    released_since_progress: int  # claims released since then
    stall_after_seconds: float


@dataclass(frozen=True)
class Stall:
    cause: str
    message: str

    def as_json(self) -> dict[str, Any]:
        return {"cause": self.cause, "message": self.message}


def stall(facts: Facts) -> Stall | None:
    """The reason the campaign cannot go on by itself, or None while it can (or the operator
    paused or canceled it: their own decision)."""
    counts = facts.counts
    succeeded = counts.get(ledger.SUCCEEDED, 0)
    rejected = counts.get(ledger.REJECTED, 0)
    if facts.state == ledger.STOPPED:
        if facts.canary == canary.NO_BASELINE:
            return Stall(
                CANARY_NO_BASELINE,
                "the canary had too few episodes with figures from before to compare: "
                "`campaign resume <id> --accept-no-baseline` to go on without",
            )
        if facts.canary == canary.FINDINGS:
            return Stall(
                CANARY_FINDINGS,
                "the canary found changes beyond tolerance (the report's findings): "
                "`campaign resume` accepts them, `campaign cancel` ends it",
            )
        return Stall(STOPPED, "stopped: `campaign resume` or `campaign cancel`")
    if facts.state == ledger.DONE:
        if rejected and not succeeded:
            return Stall(ALL_REJECTED, f"done with every episode rejected ({rejected}), none done")
        return None
    if facts.state != ledger.RUNNING or facts.settled:
        return None
    if facts.live_budget_full and not counts.get(ledger.REQUESTED, 0):
        return Stall(
            BUDGET_FULL,
            "no wave: the partitions the campaign added and has not pruned fill its live "
            "budget (CAMPAIGN_MAX_LIVE_PARTITIONS), and no run is in flight to free one",
        )
    if facts.seconds_since_progress < facts.stall_after_seconds:
        return None
    minutes = facts.seconds_since_progress / 60
    if facts.released_since_progress:
        return Stall(
            CLAIMS_RELEASED,
            f"no episode settled for {minutes:.0f} min; {facts.released_since_progress} "
            "claim(s) released since: their backfills end without runs",
        )
    return Stall(NO_PROGRESS, f"no episode settled for {minutes:.0f} min")
