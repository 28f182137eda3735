"""Finding lost uploads, the rule without I/O: where each pass goes on (`Cursor`), how far the
walk goes this tick (`walk_page_size`), and whether an episode's newest archive looks lost
(`triage`). The tick that visits the stores is `orchestration/lost_uploads.py`."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from episode_pipeline.config.settings import ReconcileSettings
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.storage.bucket import ObjectInfo

HOUR_SECONDS = 3600


# -- the cursor ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cursor:
    """Where each pass goes on: the last id it read (None = at the start). The last id may be
    one the pipeline cannot key, even `''`: the pass moves past it all the same."""

    walk: str | None = None
    pending: str | None = None

    def to_json(self) -> str:
        # Own keys, so a legacy cursor's "" (which meant "at the start") is never read as
        # "after the id ''".
        return json.dumps(
            {"walk_after": self.walk, "pending_after": self.pending}, separators=(",", ":")
        )

    @classmethod
    def parse(cls, raw: str | None) -> Cursor:
        """The sensor's cursor; the two older forms (a bare id: the walk's cursor before the
        pending pass; `{"walk": …, "pending": …}` with "" for the start) still work."""
        if not raw:
            return cls()
        try:
            value = json.loads(raw)
        except ValueError:
            return cls(walk=raw)
        if not isinstance(value, dict):
            return cls(walk=raw)
        if "walk_after" in value or "pending_after" in value:
            return cls(_after(value.get("walk_after")), _after(value.get("pending_after")))
        return cls(_after(value.get("walk") or None), _after(value.get("pending") or None))


def _after(value: Any) -> str | None:
    return None if value is None else str(value)


# -- sizing and the rule (pure) -----------------------------------------------------------------


def walk_page_size(episodes: int, settings: ReconcileSettings, pending_requests: int) -> int:
    """Episodes the walk visits this tick: the table once per cycle, at least
    `episodes_per_tick`, within what is left of the tick's share of the S3 budget."""
    ticks_per_cycle = max(1, settings.walk_cycle_seconds // settings.interval_seconds)
    wanted = max(settings.episodes_per_tick, math.ceil(episodes / ticks_per_cycle))
    budget = settings.s3_requests_per_hour * settings.interval_seconds // HOUR_SECONDS
    return max(1, min(wanted, budget - pending_requests))


@dataclass(frozen=True)
class Visit:
    """What one episode looks like, before deciding."""

    ref: EpisodeRef
    processed_at: datetime | None
    in_flight: bool
    archive: ObjectInfo | None  # the newest raw archive, from the listing
    newest_run_created: datetime | None


def triage(visit: Visit, settings: ReconcileSettings, now: datetime) -> str | None:
    """Why the episode's newest upload needs no run, or None: it looks lost (the HEAD and the
    upload's own runs decide). Handled means a run is in flight, or the row says it was
    processed after the archive was written, or any run of the episode was made after that."""
    if visit.in_flight:
        return "a run is in flight"
    archive = visit.archive
    if archive is None:
        return "no archive yet"  # the application made the row; the robot has not uploaded
    if archive.last_modified is None:
        return f"{archive.key} has no LastModified"
    # S3 truncates LastModified to the second: only a second later is surely after the write.
    written_by = archive.last_modified + timedelta(seconds=1)
    if visit.processed_at is not None and visit.processed_at >= written_by:
        return f"processed at {visit.processed_at:%Y-%m-%d %H:%M:%S}, after it was written"
    age = (now - archive.last_modified).total_seconds()
    if age < settings.lost_upload_after_seconds:
        return f"{age:.0f} s old: the queue may still deliver it"
    if visit.newest_run_created is not None and visit.newest_run_created >= written_by:
        return "a run of the episode was made after it was written"
    return None
