"""Whether a process lives, by pid: the local launcher's worker check and the in-process runs'."""

from __future__ import annotations

import os


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
