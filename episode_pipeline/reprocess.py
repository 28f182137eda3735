"""`episode-pipeline reprocess`: run episodes again, pruned ones included, as one Dagster backfill.

The episodes come from the application's table (the record that outlives Dagster's retention,
docs/retention.md): named ones (`ORG/EP ...`) or a filter (`--org`, `--status failed`, `--since`).
Their partitions are added back where the retention removed them, and one job backfill of the
episode job is recorded: the daemon launches its runs (each with its org's tags, under the run
queue's limits) and the UI's Backfills page shows it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from episode_pipeline.episodes.keys import (
    EpisodeRef,
    InvalidEpisodeKey,
    UnkeyableRow,
    parse_partition_key,
)
from episode_pipeline.instance.run_tags import REPROCESS_TAG
from episode_pipeline.orchestration.runs import add_partitions

STATUSES = ("uploaded", "processing", "processed", "failed")
# The daemon's backfill thread beats every 30 s (Dagster's default interval); older than four
# beats, no daemon is launching backfills. Dagster's own "healthy" tolerates 30 minutes.
BACKFILL_DAEMON = "BACKFILL"
DAEMON_FRESH_SECONDS = 120
NO_DAEMON = (
    "no daemon is running: start `episode-pipeline dev` (or the production daemon) to launch it"
)


@dataclass(frozen=True)
class Selection:
    """Which episodes to reprocess: named ones, or every row matching all the filters."""

    episodes: tuple[EpisodeRef, ...] = ()
    org: str | None = None
    status: str | None = None
    since: datetime | None = None
    # The code-version digest now deployed: only episodes not recorded under it (episode_outputs;
    # never recorded counts as stale).
    stale_for: str | None = None

    def describe(self) -> str:
        if self.episodes:
            return ", ".join(ref.partition_key for ref in self.episodes[:5]) + (
                f" and {len(self.episodes) - 5} more" if len(self.episodes) > 5 else ""
            )
        filters = [
            f"org {self.org}" if self.org else "",
            f"status {self.status}" if self.status else "",
            f"changed since {self.since:%Y-%m-%d %H:%M}" if self.since else "",
            f"not processed by code version {self.stale_for}" if self.stale_for else "",
        ]
        return ", ".join(f for f in filters if f)


def selection_sql(selection: Selection, has_updated_at: bool) -> tuple[str, tuple[Any, ...]]:
    """The query for a filter selection (pure); raises ValueError for one it cannot answer."""
    if selection.episodes:
        raise ValueError("named episodes need no query")
    if not (selection.org or selection.status or selection.since or selection.stale_for):
        raise ValueError("name episodes (ORG/EP ...) or give --org, --status, --since or --stale")
    where, params = [], []
    if selection.org:
        where.append("org_id = %s")
        params.append(selection.org)
    if selection.status:
        where.append("status = %s")
        params.append(selection.status)
    if selection.since:
        if not has_updated_at:
            raise ValueError("the episodes table has no updated_at column: --since cannot filter")
        where.append("updated_at >= %s")
        params.append(selection.since)
    if selection.stale_for:
        where.append(
            "NOT EXISTS (SELECT 1 FROM episode_outputs o WHERE o.org_id = episodes.org_id"
            " AND o.episode_id = episodes.id AND o.code_version = %s)"
        )
        params.append(selection.stale_for)
    return (
        f"SELECT org_id, id::text FROM episodes WHERE {' AND '.join(where)} ORDER BY org_id, id",
        tuple(params),
    )


def select_episodes(conn: Any, selection: Selection) -> tuple[list[EpisodeRef], list[UnkeyableRow]]:
    """The selected episodes, and the matching rows the pipeline cannot key (skipped); named
    ones as given (the application may not list them)."""
    if selection.episodes:
        return list(dict.fromkeys(selection.episodes)), []
    from episode_pipeline.db.episodes import keyed_rows
    from episode_pipeline.db.schema_check import read_schema

    schema = read_schema(conn)
    if not schema.has("episodes", "org_id"):
        raise ValueError("the episodes table has no org_id column: name the episodes as ORG/EP")
    query, params = selection_sql(selection, schema.has("episodes", "updated_at"))
    selected = keyed_rows(conn.execute(query, params))
    return selected.refs, selected.invalid


def launch_backfill(
    instance: Any, refs: Sequence[EpisodeRef], title: str, tags: dict[str, str] | None = None
) -> str:
    """Add the episodes' partitions that are missing, record one backfill of the episode job
    over them, and return its id (the daemon launches its runs)."""
    from episode_pipeline.orchestration.backfills import record_backfill

    keys = list(dict.fromkeys(ref.partition_key for ref in refs))
    if not keys:
        raise ValueError("no episode matches: nothing to reprocess")
    missing = add_partitions(instance, keys)
    return record_backfill(
        instance,
        keys,
        title=title,
        description=f"{len(keys)} episode(s), {len(missing)} partition(s) added back",
        tags={REPROCESS_TAG: "true", **(tags or {})},
    )


def backfill_daemon_running(instance: Any, now: float | None = None) -> bool:
    """Has a daemon's backfill thread beaten within `DAEMON_FRESH_SECONDS`? (One keyed read of
    the instance's daemon heartbeats, the same in production and locally.)"""
    heartbeat = instance.get_daemon_heartbeats().get(BACKFILL_DAEMON)
    now = time.time() if now is None else now
    return heartbeat is not None and now - heartbeat.timestamp <= DAEMON_FRESH_SECONDS


def reprocess(selection: Selection, instance: Any = None, settings: Any = None) -> dict[str, Any]:
    """The one entry point: select, bring partitions back, launch the backfill. Nothing matching
    records nothing (`backfill_id` None); `daemon_running` says whether a daemon will launch it."""
    from episode_pipeline.config.settings import settings_from_environment
    from episode_pipeline.db.connection import connect

    settings = settings or settings_from_environment()
    if selection.episodes:
        refs, skipped = select_episodes(None, selection)
    else:
        with connect(settings.database) as conn:
            refs, skipped = select_episodes(conn, selection)
    if not refs:
        return {
            "backfill_id": None,
            "episodes": 0,
            "daemon_running": None,
            "skipped": [row.describe() for row in skipped],
        }
    if instance is None:
        from dagster import DagsterInstance

        instance = DagsterInstance.get()
    backfill_id = launch_backfill(instance, refs, f"reprocess: {selection.describe()}")
    return {
        "backfill_id": backfill_id,
        "episodes": len(refs),
        "skipped": [row.describe() for row in skipped],
        "daemon_running": backfill_daemon_running(instance),
    }


# -- command line -------------------------------------------------------------------------------


def _episode(value: str) -> EpisodeRef:
    try:
        return parse_partition_key(value)
    except InvalidEpisodeKey as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def _since(value: str) -> datetime:
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"--since {value!r}: expected a date or time such as 2026-12-01 or 2026-12-01T08:00"
        ) from error
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


def cmd_reprocess(args: argparse.Namespace) -> int:
    from episode_pipeline.local.stack_env import apply_local_stack_env

    if apply_local_stack_env():  # no production settings: the local stack, started if down
        from episode_pipeline.local.stack import ensure_stack

        ensure_stack()
    selection = Selection(tuple(args.episodes), args.org, args.status, args.since)
    if selection.episodes and (args.org or args.status or args.since):
        raise ValueError("name episodes or give filters, not both")
    outcome = reprocess(selection)
    for skipped in outcome["skipped"]:
        print(f"episode-pipeline: skipped {skipped}", file=sys.stderr)
    if outcome["backfill_id"] is None:  # not bad input: the fleet has no such episode (yet)
        print(f"no episodes match {selection.describe()}: nothing to reprocess")
        return 0
    print(
        f"backfill {outcome['backfill_id']}: {outcome['episodes']} episode(s) "
        "(Dagster UI: Overview → Backfills)"
    )
    if not outcome["daemon_running"]:
        print(f"episode-pipeline: {NO_DAEMON}", file=sys.stderr)
    return 0


def add_reprocess_command(commands: Any) -> None:
    """`reprocess` on the `episode-pipeline` parser."""
    parser = commands.add_parser(
        "reprocess", help="run episodes again (pruned ones too) as one Dagster backfill"
    )
    parser.add_argument("episodes", nargs="*", type=_episode, metavar="ORG/EP")
    parser.add_argument("--org", help="every episode of this org")
    parser.add_argument("--status", choices=STATUSES, help="episodes with this status")
    parser.add_argument("--since", type=_since, help="episodes whose row changed since (UTC)")
    parser.set_defaults(handler=cmd_reprocess)
