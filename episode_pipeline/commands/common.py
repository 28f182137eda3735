"""What every sub-command shares: the ORG/EP argument and reaching the right stack."""

from __future__ import annotations

import argparse
import os

from episode_pipeline.episodes.keys import EpisodeRef, InvalidEpisodeKey, parse_partition_key

EPISODE_HELP = "the episode's partition key ORG/EP (org id / episode id, e.g. acme/ep-42)"


def episode_arg(value: str) -> EpisodeRef:
    try:
        return parse_partition_key(value)
    except InvalidEpisodeKey as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def local_stack_unless_production() -> None:
    """Start the embedded stack (saying so) when it is down and export its variables into this
    process, unless production's are set: with `DB_HOST` exported the command reads
    production, never a local stack. What the command then runs reads only its environment."""
    if os.environ.get("DB_HOST"):
        return
    from episode_pipeline.local.stack import ensure_stack
    from episode_pipeline.local.stack_env import apply_local_stack_env

    ensure_stack()
    apply_local_stack_env()
