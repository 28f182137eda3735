"""Whether processes are still alive."""

from __future__ import annotations

import time
from pathlib import Path


def alive(pid: int) -> bool:
    """Running or stopped; a zombie (killed, not yet reaped by init) counts as dead."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def gone(pids: list[int]) -> bool:
    """All of `pids` dead within a few seconds (a SIGKILL takes effect asynchronously)."""
    for _ in range(50):
        if not any(alive(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return False
