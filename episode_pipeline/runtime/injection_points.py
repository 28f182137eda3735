"""Named points where a crash test stops a process at a precise moment, as PostgreSQL's
injection points do for its own tests.

`reach(name)` does nothing unless the environment arms that point
(`armed_injection_points`, never set in production). When armed, it writes the marker
file and holds the process there, so the test can kill it with SIGKILL exactly between two steps
(after a receive, before a delete, ...), or do something to the world (restart a server) and
then `release` it. A point holds once: once its marker exists it is passed (the retry of a
killed run goes through). The hold is bounded: if nobody strikes, the process goes on after
`hold_seconds`. The points and the tests that use them are listed in docs/faults.md.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

INJECTION_POINT_ENV = "EPISODE_PIPELINE_INJECTION_POINT"
INJECTION_ABOUT_ENV = "EPISODE_PIPELINE_INJECTION_ABOUT"

# Points inside a run (the others belong to the sensors' ticks: `orchestration/upload_runs.py`).
MID_EXTRACTION = "extraction.after_member"  # a member uploaded under processed/, more to come
MID_COPY = "frames.mid_copy"  # a COPY into `frames` under way, rows sent, not committed


@dataclass(frozen=True)
class InjectionPoint:
    """A test's request to stop this process at one named point."""

    name: str
    marker: Path  # written when the point is reached, so the test knows when to strike
    about: str = ""  # only when the point is reached about this (an episode's partition key)
    hold_seconds: float = 120.0


ARMED_SEPARATOR = ";"  # between several armed points, and between their `about`s


def armed_injection_points() -> list[InjectionPoint]:
    """`EPISODE_PIPELINE_INJECTION_POINT=<point name>:<marker file>`, optionally
    `EPISODE_PIPELINE_INJECTION_ABOUT=<text>`; never set in production. Several points are
    separated by `;` in both (the n-th `about` goes with the n-th point): a crash test can hold
    a run at one point while the daemon reaches another.

    Read when a point is reached rather than once at start: the crash tests arm one daemon
    process at a time through its environment.
    """
    entries = os.environ.get(INJECTION_POINT_ENV, "").split(ARMED_SEPARATOR)
    abouts = os.environ.get(INJECTION_ABOUT_ENV, "").split(ARMED_SEPARATOR)
    points = []
    for index, entry in enumerate(entries):
        name, _, marker = entry.partition(":")
        if name and marker:
            about = abouts[index] if index < len(abouts) else ""
            points.append(InjectionPoint(name=name, marker=Path(marker), about=about))
    return points


def arming_env(points: list[tuple[str, Path, str]]) -> dict[str, str]:
    """The environment that arms `(point name, marker, about)` each (what a test hands down)."""
    return {
        INJECTION_POINT_ENV: ARMED_SEPARATOR.join(f"{name}:{marker}" for name, marker, _ in points),
        INJECTION_ABOUT_ENV: ARMED_SEPARATOR.join(about for _, _, about in points),
    }


def reach(name: str, about: str = "") -> None:
    """Hold here if this point is armed (and, when the test names what, `about` mentions it)."""
    for point in armed_injection_points():
        if point.name == name and point.about in about and not point.marker.exists():
            _hold(point, about)
            return


def _hold(point: InjectionPoint, about: str) -> None:
    point.marker.parent.mkdir(parents=True, exist_ok=True)
    point.marker.write_text(f"{point.name} reached by pid {os.getpid()} about {about}\n")
    deadline = time.monotonic() + point.hold_seconds
    while time.monotonic() < deadline and not _released(point.marker):
        time.sleep(0.1)


RELEASED = "released"


def release(marker: Path) -> None:
    """Let the process held at the point this marker belongs to go on."""
    with marker.open("a") as out:
        out.write(f"{RELEASED}\n")


def _released(marker: Path) -> bool:
    try:
        return RELEASED in marker.read_text()
    except FileNotFoundError:
        return False
