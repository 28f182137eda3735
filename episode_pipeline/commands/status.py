"""`episode-pipeline status`: what the pipeline wrote for episodes, and why one failed."""

from __future__ import annotations

import argparse
import json

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
    status.add_argument("--org", help="only this org's episodes")
    status.add_argument(
        "--limit",
        type=int,
        default=50,
        help="at most this many episodes, newest first, without ORG/EP or with --failed "
        "(default 50)",
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(handler=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    from episode_pipeline.report import (
        episode_reports,
        failed_episodes,
        format_failed,
        format_reports,
    )

    local_stack_unless_production()
    if args.failed:
        if args.episode is not None:
            raise ValueError("name an episode or ask for --failed, not both")
        rows = failed_episodes(args.org, args.limit)
        print(json.dumps(rows, indent=2, default=str) if args.json else format_failed(rows))
        return 0
    if args.limit < 1:
        raise ValueError(f"--limit must be at least 1, not {args.limit}")
    reports = episode_reports(args.episode, org_id=args.org, limit=args.limit)
    if args.org:
        reports = [report for report in reports if report["org_id"] == args.org]
    print(json.dumps(reports, indent=2, default=str) if args.json else format_reports(reports))
    return 0
