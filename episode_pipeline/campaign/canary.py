"""The canary: an episode's new figures against the ones its previous processing recorded.

Seed 004's duration drift is the model: a camera's duration moving by more than
`seconds_tolerance` is a finding, and so are another frame row count (beyond
`frame_rows_tolerance`), another set of renditions (cameras and rungs) and more sync findings.
A campaign that means to change one of them (a new rung on the ladder) says so in `expect`,
and that figure is not compared. Any finding in the canary wave stops the campaign with the
findings as its report. The canary passes only when it compared enough episodes (`judge`): a
canary whose claims were all released, or whose episodes had no figures from before, never
passes silently.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from episode_pipeline.campaign.ledger import REQUESTED, SUCCEEDED

FRAME_ROWS = "frame_rows"
SECONDS_BY_CAMERA = "seconds_by_camera"
RENDITIONS = "renditions"
SYNC_FINDINGS = "sync_findings"
FIGURES = (FRAME_ROWS, SECONDS_BY_CAMERA, RENDITIONS, SYNC_FINDINGS)


@dataclass(frozen=True)
class CanarySettings:
    episodes: int = 50  # the first wave's size, at most
    fraction: float = 0.01  # ... or this share of the selection, whichever is smaller
    seconds_tolerance: float = 0.5
    frame_rows_tolerance: int = 0
    expect: Collection[str] = field(default=())  # figures the change means to change

    def __post_init__(self) -> None:
        unknown = sorted(set(self.expect) - set(FIGURES))
        if unknown:
            raise ValueError(f"canary expect: unknown figure(s) {unknown}; known: {FIGURES}")

    def wave_size(self, selected: int) -> int:
        """The canary wave: 1 % or 50 episodes (the smaller), at least one."""
        return max(1, min(self.episodes, int(selected * self.fraction) or 1, selected))


def compare(
    before: Mapping[str, Any] | None, after: Mapping[str, Any] | None, settings: CanarySettings
) -> list[str]:
    """What changed beyond tolerance and was not expected ([] when nothing, or nothing to
    compare: an episode never recorded before)."""
    if not before or not after:
        return []
    findings: list[str] = []

    def both(name: str) -> bool:
        return (
            name not in settings.expect
            and before.get(name) is not None
            and (after.get(name) is not None)
        )

    if both(FRAME_ROWS):
        old, new = int(before[FRAME_ROWS]), int(after[FRAME_ROWS])
        if abs(new - old) > settings.frame_rows_tolerance:
            findings.append(f"frame rows {old} → {new}")
    if both(SECONDS_BY_CAMERA):
        old_cams, new_cams = before[SECONDS_BY_CAMERA], after[SECONDS_BY_CAMERA]
        for camera in sorted(set(old_cams) | set(new_cams)):
            old_s, new_s = old_cams.get(camera), new_cams.get(camera)
            if old_s is None or new_s is None:
                findings.append(f"camera {camera}: {old_s} s → {new_s} s")
            elif abs(float(new_s) - float(old_s)) > settings.seconds_tolerance:
                findings.append(
                    f"camera {camera}: duration {float(old_s):.3f} s → {float(new_s):.3f} s "
                    f"(drift {float(new_s) - float(old_s):+.3f} s > {settings.seconds_tolerance} s)"
                )
    if both(RENDITIONS):
        old_r, new_r = set(before[RENDITIONS]), set(after[RENDITIONS])
        if old_r != new_r:
            gone, added = sorted(old_r - new_r), sorted(new_r - old_r)
            findings.append(f"renditions: gone {gone or '-'}, new {added or '-'}")
    if both(SYNC_FINDINGS) and int(after[SYNC_FINDINGS]) > int(before[SYNC_FINDINGS]):
        findings.append(f"sync findings {before[SYNC_FINDINGS]} → {after[SYNC_FINDINGS]}")
    return findings


# -- the verdict (pure): what the canary wave(s) showed --------------------------------------------

PASSED = "passed"
WAITING = "waiting"  # a canary episode is still claimed
FINDINGS = "stopped"  # changed beyond tolerance, or too few succeeded: the campaign stops
NO_BASELINE = "no_baseline"  # ran, but too few had figures from before: stops, until accepted
RERUN = "rerun"  # too few settled (claims released): another canary wave for the shortfall


@dataclass(frozen=True)
class CanaryEpisode:
    """One episode of the canary wave(s), as the ledger and `episode_outputs` hold it."""

    key: str
    state: str  # the ledger's
    before: Mapping[str, Any] | None = None  # `previous_figures`, read at the claim
    after: Mapping[str, Any] | None = None
    code_version: str | None = None


@dataclass(frozen=True)
class Verdict:
    outcome: str
    planned: int
    required: int  # episodes to compare (before and after) for a pass
    episodes: int  # claimed and not released
    succeeded: int
    compared: int
    findings: Mapping[str, list[str]] = field(default_factory=dict)
    rerun_size: int = 0

    def message(self) -> str:
        counted = (
            f"{self.compared} of {self.succeeded} succeeded canary episode(s) compared with "
            f"figures from before ({self.required} needed of {self.planned} planned)"
        )
        if self.outcome == PASSED:
            return f"passed: {counted}"
        if self.outcome == FINDINGS:
            return f"stopped: {len(self.findings)} episode(s) changed beyond tolerance; {counted}"
        if self.outcome == NO_BASELINE:
            return (
                f"stopped, no baseline: {counted}. Nothing recorded figures before this campaign "
                "(the first after migration 004?); `episode-pipeline campaign resume <id> "
                "--accept-no-baseline` goes on without the comparison"
            )
        if self.outcome == RERUN:
            return (
                f"rerun: {self.episodes} canary episode(s) left after released claims; "
                f"{counted}; claiming {self.rerun_size} more"
            )
        return f"waiting: {self.episodes} canary episode(s) claimed"

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "canary": self.outcome,
            "planned": self.planned,
            "required": self.required,
            "episodes": self.episodes,
            "succeeded": self.succeeded,
            "compared": self.compared,
        }
        if self.findings:
            data["findings"] = dict(self.findings)
        return data


def required_comparisons(planned: int) -> int:
    """Episodes the canary must compare to pass: half its planned size, at least one (as many
    as must succeed: a canary of 50 whose 2 left after released claims passed would say
    nothing about the other 48's kind)."""
    return max(1, math.ceil(planned / 2))


def judge(
    planned: int,
    episodes: Sequence[CanaryEpisode],
    target_code_version: str,
    settings: CanarySettings,
    accept_no_baseline: bool = False,
) -> Verdict:
    """The canary's verdict over its waves' episodes (released claims are not among them).

    Findings (a figure beyond tolerance, another code version, fewer than half succeeded) stop
    the campaign. It passes only when it compared `required_comparisons(planned)` episodes with
    figures from before and after; when that many succeeded but too few had figures from
    before, it stops for the operator (`accept_no_baseline` is their answer); when too few are
    left at all (claims released: a cancelled backfill, a kill), it runs again for the shortfall.
    """
    required = required_comparisons(planned)
    succeeded = [e for e in episodes if e.state == SUCCEEDED]
    base = {"planned": planned, "required": required, "episodes": len(episodes)}
    if any(e.state == REQUESTED for e in episodes):
        return Verdict(WAITING, succeeded=len(succeeded), compared=0, **base)
    findings: dict[str, list[str]] = {}
    compared = 0
    for episode in succeeded:
        found = compare(episode.before, episode.after, settings)
        if episode.before and episode.after:
            compared += 1
        if episode.code_version != target_code_version:
            found.append(
                f"recorded code version {episode.code_version}, "
                f"not the campaign's {target_code_version}"
            )
        if found:
            findings[episode.key] = found
    if len(succeeded) * 2 < len(episodes):
        findings["(wave)"] = [
            f"only {len(succeeded)} of {len(episodes)} canary episode(s) succeeded"
        ]
    counts = {"succeeded": len(succeeded), "compared": compared, **base}
    if findings:
        return Verdict(FINDINGS, findings=findings, **counts)
    if compared >= required or (accept_no_baseline and len(succeeded) >= required):
        return Verdict(PASSED, **counts)
    if len(succeeded) >= required:
        return Verdict(NO_BASELINE, **counts)
    return Verdict(RERUN, rerun_size=max(1, planned - len(succeeded)), **counts)
