"""`episode-pipeline`: the local stack, sample archives, and one-episode processing from a shell.

Each sub-command is a thin shell over a function in the package; heavy imports (Dagster, FFmpeg,
moto) happen inside the command that needs them so `--help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

from episode_pipeline.commands.campaign import add_campaign_parser
from episode_pipeline.commands.common import EPISODE_HELP, episode_arg
from episode_pipeline.commands.health import add_health_parser
from episode_pipeline.commands.process import add_process_parser
from episode_pipeline.commands.status import add_status_parser
from episode_pipeline.commands.view import add_view_parser
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.lerobot.layout import CODEBASE_VERSIONS
from episode_pipeline.reprocess import add_reprocess_command
from episode_pipeline.runtime.fast_exit import skip_teardown

_episode_arg = episode_arg


def _print_json(value: object) -> None:
    print(json.dumps(value, indent=2, default=str))


def shell_exports(env: dict[str, str]) -> str:
    """`export NAME=value` lines a shell can `eval`: how a hand-typed `dg launch` or `dagster
    dev` gets the local stack's settings (the code location reads only its environment)."""
    import shlex

    return "\n".join(f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items()))


def cmd_stack(args: argparse.Namespace) -> int:
    from episode_pipeline.local import stack

    if args.action == "env":
        print(shell_exports(stack.ensure_stack().env))
        return 0
    if args.action == "up":
        info = stack.start_stack()
    elif args.action == "down":
        stack.stop_stack()
        info = stack.stack_status()
    else:
        info = stack.stack_status()
    shown = info if args.show_password else info.redacted()
    if args.json:
        _print_json(
            {**shown.as_dict(), "password_file": str(Path(info.home) / stack.PASSWORD_FILE)}
        )
    else:
        print(shown.describe())
    return 0


def cmd_dev(args: argparse.Namespace) -> int:
    from episode_pipeline.local.dev import run_dev

    return run_dev(args.port)


def cmd_upload(args: argparse.Namespace) -> int:
    from episode_pipeline.local.stack import ensure_stack
    from episode_pipeline.local.upload import upload_episode

    ensure_stack()
    ref = EpisodeRef(args.org, args.episode)
    key = upload_episode(Path(args.archive), ref)
    print(key)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from episode_pipeline.commands.common import local_stack_unless_production
    from episode_pipeline.config.settings import METRICS_OUTPUT_ENV
    from episode_pipeline.defs.checks.sync import CHECK_NAME as SYNC_CHECK
    from episode_pipeline.runner import run_checks

    os.environ.setdefault(METRICS_OUTPUT_ENV, "off")  # as `process` (commands/process.py)

    local_stack_unless_production()
    results = run_checks(args.episode, set(args.only) if args.only else None)
    for name, passed in sorted(results.items()):
        print(f"{'passed' if passed else 'FAILED'}  {name}")
        if name == SYNC_CHECK and not passed:
            _print_sync_findings(args.episode)
    return 0 if all(results.values()) else 1


def _print_sync_findings(ref: EpisodeRef) -> None:
    """Under a failed sync check, what does not line up (docs/sync.md)."""
    from dagster import DagsterInstance

    from episode_pipeline.defs.checks.sync import latest_sync_result

    result = latest_sync_result(DagsterInstance.get(), ref.partition_key) or {}
    for finding in result.get("findings", []):
        print(f"        {finding}")


def _dead_letter_rows(letters: list, instance: object | None) -> list[dict[str, object]]:
    """One row per (message, upload): what an operator needs to act, runs included if known,
    and why it is a dead letter (`uploads.reasons.dead_letter_reason`)."""
    from episode_pipeline.instance.app_state import recorded_dead_letter_reasons
    from episode_pipeline.instance.run_tags import upload_id
    from episode_pipeline.orchestration.runs import latest_runs_of_uploads, upload_history
    from episode_pipeline.orchestration.upload_runs import latest_state
    from episode_pipeline.runner import step_errors
    from episode_pipeline.uploads import reasons

    recorded, latest = {}, {}
    if instance is not None:
        recorded = recorded_dead_letter_reasons(instance, [letter.message_id for letter in letters])
        latest = latest_runs_of_uploads(
            instance,
            [upload_id(u.partition_key, u.object_version) for x in letters for u in x.uploads],
        )
    rows: list[dict[str, object]] = []
    for letter in letters:
        base = {
            "message_id": letter.message_id,
            "receive_count": letter.receive_count,
            "uploaded_at": letter.sent_at,
        }
        if not letter.uploads:
            why = reasons.dead_letter_reason(
                body_problem=letter.body_reason, recorded=None, runs=None
            )
            rows.append(
                {
                    **base,
                    "episode": None,
                    "key": None,
                    "problem": letter.problem,
                    "reason": why.kind,
                    "why": why.text,
                }
            )
        for upload in letter.uploads:
            row: dict[str, object] = {
                **base,
                "episode": upload.partition_key,
                "key": upload.key,
            }
            runs = None
            if instance is not None:
                upload_key = upload_id(upload.partition_key, upload.object_version)
                history = upload_history(instance, upload_key)
                errors = (
                    step_errors(instance, history.last_failed_run_id)
                    if history.last_failed_run_id
                    else []
                )
                row.update(
                    runs=history.runs,
                    failures=history.failures,
                    first_failure=history.first_failure,
                    last_failure=history.last_failure,
                    failed_run=history.last_failed_run_id,
                    error="; ".join(errors) or None,
                )
                newest = latest.get(upload_key)
                status = newest.status if newest is not None else None
                runs = reasons.UploadRuns(
                    runs=history.runs,
                    failures=history.failures,
                    latest_run_id=newest.run_id if newest is not None else None,
                    latest_state=latest_state(status),
                    last_failed_run_id=history.last_failed_run_id,
                    error="; ".join(errors) or None,
                )
            why = reasons.dead_letter_reason(
                body_problem=letter.body_reason,
                recorded=recorded.get(letter.message_id),
                runs=runs,
            )
            row.update(reason=why.kind, why=why.text)
            rows.append(row)
    return rows


def _format_dead_letters(rows: list[dict[str, object]]) -> str:
    if not rows:
        return "the dead-letter queue is empty"
    lines = []
    for row in rows:
        lines.append(f"{row['episode'] or '(no episode)'}  {row['key'] or row.get('problem')}")
        lines.append(
            f"  message {row['message_id']}, received {row['receive_count']} time(s), "
            f"uploaded {row['uploaded_at'] or '?'}"
        )
        lines.append(f"  why: {row['reason']}: {row['why']}")
        if row.get("failures") is not None:
            lines.append(
                f"  {row['failures']} failed run(s) of {row['runs']}: first "
                f"{row['first_failure'] or '-'}, last {row['last_failure'] or '-'}"
            )
            lines.append(
                f"  run {row['failed_run'] or '-'}: {row['error'] or '(no error recorded)'}"
            )
    return "\n".join(lines)


def cmd_dlq(args: argparse.Namespace) -> int:
    from episode_pipeline.local.stack_env import apply_local_stack_env, load_settings
    from episode_pipeline.uploads import dead_letters
    from episode_pipeline.uploads.upload_queue import UploadQueue

    if apply_local_stack_env():  # no production settings: the local stack, started if down
        from episode_pipeline.local.stack import ensure_stack

        ensure_stack()
    settings = load_settings()
    if not settings.dlq_url or not settings.sqs_queue_url:
        raise ValueError("SQS_QUEUE_URL and SQS_DLQ_URL must both be set")
    dlq = UploadQueue(settings.dlq_url, settings.aws)
    letters = dead_letters.peek(dlq)
    if args.action == "list":
        rows = _dead_letter_rows(letters, _dagster_instance())
        if args.json:
            _print_json(rows)
        else:
            print(_format_dead_letters(rows))
        return 0
    if not args.all and args.episode is None:
        raise ValueError("name an episode (ORG/EP) to redrive, or --all")
    chosen = dead_letters.select(letters, None if args.all else args.episode.partition_key)
    queue = UploadQueue(settings.sqs_queue_url, settings.aws)
    moved = dead_letters.redrive(dlq, queue, chosen)
    print(f"moved {len(moved)} message(s) back to the upload queue")
    return 0


def _dagster_instance() -> object | None:
    """The Dagster instance (DAGSTER_HOME), or None: the list then shows no run history."""
    import os

    if not os.environ.get("DAGSTER_HOME"):
        print("episode-pipeline: DAGSTER_HOME is unset: runs not shown", file=sys.stderr)
        return None
    from dagster import DagsterInstance

    return DagsterInstance.get()


def cmd_demo(args: argparse.Namespace) -> int:
    if args.with_failure:
        from episode_pipeline.local.dead_letter_demo import run_dead_letter_demo

        return run_dead_letter_demo()
    from episode_pipeline.local.demo import run_demo

    return run_demo()


def cmd_make_sample(args: argparse.Namespace) -> int:
    from episode_pipeline.samples.writer import SampleSpec, write_sample

    spec = SampleSpec(
        codebase_version=args.format,
        cameras=args.cameras,
        seconds=args.seconds,
        fps=args.fps,
        codec=args.codec,
        episodes=args.episodes,
    )
    summary = write_sample(Path(args.out), spec)
    _print_json(summary)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="episode-pipeline",
        description="Robot-episode uploads to HLS video, frame rows and episode metadata: the "
        "local stack, sample archives, and one episode at a time from a shell.",
        epilog="How to operate it (why an episode failed, reprocessing, the dead-letter queue, "
        "stopping everything): docs/operations.md",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    stack = commands.add_parser("stack", help="start, stop or show the embedded local stack")
    stack.add_argument(
        "action",
        choices=["up", "down", "status", "env"],
        help="up: start in the background (idempotent); down: stop every process of the "
        "stack's home; status: show it; env: start it if down and print its variables as "
        '`export` lines, for `eval "$(episode-pipeline stack env)"` before `dg launch` or '
        "`dagster dev`",
    )
    stack.add_argument("--json", action="store_true", help="machine-readable output")
    stack.add_argument(
        "--show-password",
        action="store_true",
        help="print the database password (masked by default; it is in <home>/db-password)",
    )
    stack.set_defaults(handler=cmd_stack)

    dev = commands.add_parser("dev", help="stack up, then the Dagster webserver and daemon")
    dev.add_argument("--port", type=int, default=3000, help="the UI's port (default 3000)")
    dev.set_defaults(handler=cmd_dev)

    upload = commands.add_parser("upload", help="upload an archive as a robot would")
    upload.add_argument("archive", help="the episode's .tar.zst (see make-sample)")
    upload.add_argument("--org", required=True, help="the org id (the key's orgs/<org>/)")
    upload.add_argument(
        "--episode", required=True, help="the episode id (the key's episodes/<episode>/)"
    )
    upload.set_defaults(handler=cmd_upload)

    add_process_parser(commands)

    check = commands.add_parser("check", help="run an episode's asset checks on what is stored")
    check.add_argument("episode", type=_episode_arg, metavar="ORG/EP", help=EPISODE_HELP)
    check.add_argument("--only", action="append", metavar="CHECK", help="one check (repeatable)")
    check.set_defaults(handler=cmd_check)

    add_status_parser(commands)
    add_view_parser(commands)
    add_health_parser(commands)

    dlq = commands.add_parser("dlq", help="list the dead-letter queue, or send messages back")
    dlq_actions = dlq.add_subparsers(dest="action", required=True)
    dlq_list = dlq_actions.add_parser(
        "list", help="each message: episode, key, receives, failures, the failed run's error"
    )
    dlq_list.add_argument("--json", action="store_true")
    dlq_redrive = dlq_actions.add_parser(
        "redrive", help="move an episode's messages (or --all) back to the upload queue"
    )
    dlq_redrive.add_argument(
        "episode", nargs="?", type=_episode_arg, metavar="ORG/EP", help=EPISODE_HELP
    )
    dlq_redrive.add_argument("--all", action="store_true", help="every message on the queue")
    dlq.set_defaults(handler=cmd_dlq)

    add_reprocess_command(commands)
    add_campaign_parser(commands)

    demo = commands.add_parser("demo", help="the whole pipeline on sample episodes, locally")
    demo.add_argument(
        "--with-failure",
        action="store_true",
        help="instead: one failing upload's way to the dead-letter queue (short queue timing), "
        "`dlq list`, the fix, `dlq redrive` and its processing; a few minutes",
    )
    demo.set_defaults(handler=cmd_demo)

    sample = commands.add_parser("make-sample", help="write a realistic LeRobot episode archive")
    sample.add_argument("out", help="the archive to write (…/NAME.tar.zst)")
    sample.add_argument(
        "--format",
        choices=CODEBASE_VERSIONS,
        default="v3.0",
        help="the LeRobot layout (all three are accepted: docs/lerobot-archives.md; default v3.0)",
    )
    sample.add_argument("--cameras", type=int, default=2, help="video streams (default 2)")
    sample.add_argument(
        "--seconds", type=float, default=4.0, help="length of each LeRobot episode (default 4)"
    )
    sample.add_argument("--fps", type=int, default=30, help="frames per second (default 30)")
    sample.add_argument(
        "--codec", choices=["av1", "h264"], default="h264", help="the mp4s' codec (default h264)"
    )
    sample.add_argument("--episodes", type=int, default=1, help="LeRobot episodes in the archive")
    sample.set_defaults(handler=cmd_make_sample)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # The command itself (not a caller in Python, a test): exit without freeing Dagster & co.
    exiting = skip_teardown() if argv is None else int
    try:
        return exiting(int(args.handler(args)))
    except KeyboardInterrupt:
        return exiting(130)
    except (ValueError, FileNotFoundError) as error:  # bad input: say what, no traceback
        print(f"episode-pipeline: {error}", file=sys.stderr)
        return exiting(2)
    except Exception as error:  # the cause first; the traceback after it, for a bug report
        print(f"episode-pipeline: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        traceback.print_exc()
        return exiting(1)


if __name__ == "__main__":
    sys.exit(main())
