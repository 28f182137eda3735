"""`episode-pipeline status`: what the pipeline wrote for episodes, and why one failed."""

from __future__ import annotations

import argparse
import json
import sys

from episode_pipeline.commands.common import episode_arg, local_stack_unless_production


def add_status_parser(commands: argparse._SubParsersAction) -> None:
    status = commands.add_parser(
        "status",
        help="what the pipeline wrote for episodes, and why one failed",
        description="Per episode: the row, frames, metadata, HLS playlists, check results and "
        "its latest run; for a failed episode the failing step's error and the failed checks, "
        "with a link to the run in the Dagster UI.",
    )
    status.add_argument(
        "episode",
        nargs="?",
        type=episode_arg,
        metavar="ORG/EP",
        help="one episode (its partition key, e.g. acme/ep-42); when left out, the --limit "
        "most recently changed episodes (one page, newest first: never the whole fleet)",
    )
    status.add_argument(
        "--failed",
        action="store_true",
        help="only failed episodes, newest first, each with its one-line cause",
    )
    status.add_argument(
        "--invalid",
        action="store_true",
        help="only the rows of `episodes` the pipeline cannot key (an id that breaks "
        "docs/contract.md#episode-ids), newest first, each with the reason: every listing and "
        "sensor skips them, so the application must fix them",
    )
    status.add_argument("--org", help="only this org's episodes")
    status.add_argument(
        "--limit",
        type=int,
        default=50,
        help="at most this many episodes, newest first, without ORG/EP or with --failed or "
        "--invalid (default 50)",
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(handler=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    from episode_pipeline.report import (
        episode_listing,
        failed_episodes,
        format_failed,
        format_invalid,
        format_reports,
        invalid_episodes,
        skipped_note,
    )

    if args.failed and args.invalid:
        raise ValueError("ask for --failed or --invalid, not both")
    if (args.failed or args.invalid) and args.episode is not None:
        raise ValueError(
            f"name an episode or ask for --{'failed' if args.failed else 'invalid'}, not both"
        )
    if args.limit < 1:
        raise ValueError(f"--limit must be at least 1, not {args.limit}")
    local_stack_unless_production()
    if args.invalid:
        rows = invalid_episodes(args.org, args.limit)
        print(json.dumps(rows, indent=2, default=str) if args.json else format_invalid(rows))
        return 0
    if args.failed:
        listing = failed_episodes(args.org, args.limit)
        shown = format_failed(listing.rows)
    else:
        listing = episode_listing(args.episode, org_id=args.org, limit=args.limit)
        if args.org:
            listing.rows = [report for report in listing.rows if report["org_id"] == args.org]
        shown = format_reports(listing.rows)
    print(json.dumps(listing.rows, indent=2, default=str) if args.json else shown)
    note = skipped_note(listing.skipped)
    if note:
        print(f"episode-pipeline: {note}", file=sys.stderr)
    return 0
