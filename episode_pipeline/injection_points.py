"""Named points where a crash test stops a process at a precise moment, as PostgreSQL's
injection points do for its own tests.

`reach(name)` does nothing unless the environment arms that point
(`settings.armed_injection_point`, never set in production). When armed, it writes the marker
file and holds the process there, so the test can kill it with SIGKILL exactly between two steps
(after a receive, before a delete, ...). The hold is bounded: if nobody strikes, the process goes
on after `hold_seconds`. The points and the tests that use them are listed in docs/faults.md.
"""

from __future__ import annotations

import os
import time

from episode_pipeline.settings import armed_injection_point


def reach(name: str, about: str = "") -> None:
    """Hold here if this point is armed (and, when the test names what, `about` mentions it)."""
    point = armed_injection_point()
    if point is None or point.name != name or point.about not in about:
        return
    point.marker.parent.mkdir(parents=True, exist_ok=True)
    point.marker.write_text(f"{name} reached by pid {os.getpid()} about {about}\n")
    deadline = time.monotonic() + point.hold_seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)
