"""The canary: an episode's new figures against the ones its previous processing recorded.

Seed 004's duration drift is the model: a camera's duration moving by more than
`seconds_tolerance` is a finding, and so are another frame row count (beyond
`frame_rows_tolerance`), another set of renditions (cameras and rungs) and more sync findings.
A campaign that means to change one of them (a new rung on the ladder) says so in `expect`,
and that figure is not compared. Any finding in the canary wave stops the campaign with the
findings as its report.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

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
