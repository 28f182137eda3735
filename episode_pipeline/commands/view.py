"""`episode-pipeline view ORG/EP`: an episode's cameras on one clock with its data, in a browser."""

from __future__ import annotations

import argparse
import sys
import webbrowser

from episode_pipeline.commands.common import EPISODE_HELP, episode_arg
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.episodes.timeline import TIMELINE_NAME


def add_view_parser(commands: argparse._SubParsersAction) -> None:
    view = commands.add_parser(
        "view",
        help="look at a processed episode: every camera on one clock, its state and action",
        description="Serves the episode viewer on 127.0.0.1 and prints its address first. The "
        "page reads the episode's outputs through this command with your credentials (the "
        "local stack's, or AWS's when DB_HOST and the AWS variables are exported): nothing in "
        "the bucket is made public. Ctrl-C stops it (docs/operations.md#look-at-an-episode).",
    )
    view.add_argument("episode", type=episode_arg, metavar="ORG/EP", help=EPISODE_HELP)
    view.add_argument(
        "--episode-index",
        type=int,
        metavar="N",
        help="the LeRobot episode of the upload to open (its episode_index; default the first)",
    )
    view.add_argument("--port", type=int, default=0, help="the port (default: a free one)")
    view.add_argument(
        "--no-browser", action="store_true", help="only print the address; open no browser"
    )
    view.set_defaults(handler=cmd_view)


def cmd_view(args: argparse.Namespace) -> int:
    from episode_pipeline.commands.common import local_stack_unless_production
    from episode_pipeline.local.stack_env import load_settings
    from episode_pipeline.storage.bucket import Bucket
    from episode_pipeline.viewer.routes import viewer_url
    from episode_pipeline.viewer.server import WEB, ViewerServer, missing_libraries

    missing = missing_libraries()
    if missing:
        raise FileNotFoundError(
            f"the viewer's libraries are not installed ({', '.join(missing)} in {WEB}): "
            "run scripts/bootstrap.sh (npm ci)"
        )
    ref: EpisodeRef = args.episode
    local_stack_unless_production()
    settings = load_settings()
    bucket = Bucket(settings.bucket, settings.aws, settings.s3_deadlines)
    timeline = ref.processed_prefix + TIMELINE_NAME
    if bucket.head(timeline) is None:
        raise FileNotFoundError(
            f"{bucket.uri(timeline)}: missing: {ref.partition_key} is not processed by this "
            f"version (see `episode-pipeline status {ref.partition_key}`)"
        )
    server = ViewerServer(bucket, args.port)
    url = viewer_url(server.base_url, ref, args.episode_index)
    print(url, flush=True)
    print(f"viewing {ref.partition_key} from {bucket.uri(ref.processed_prefix)}; Ctrl-C stops")
    if not args.no_browser:
        webbrowser.open(url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        server.server_close()
    return 0
