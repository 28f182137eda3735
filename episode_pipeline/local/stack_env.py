"""The settings on a laptop: production's variables when they are set, else the local stack's.

`episode-pipeline stack up` writes the stack's variables into `<home>/stack.json`; when `DB_HOST`
is unset, the local tools read them from there (`load_settings`), and the commands that run the
code location export them first (`apply_local_stack_env`): the code location itself reads only
its environment (`config.settings.settings_from_environment`) and never imports this package.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from episode_pipeline.config.settings import Settings

HOME_ENV = "EPISODE_PIPELINE_HOME"
DEFAULT_HOME = ".episode_pipeline"
STACK_STATE_FILE = "stack.json"


def pipeline_home() -> Path:
    """The one directory holding all local state (database, moto state, Dagster instance).

    `EPISODE_PIPELINE_HOME`, else the home whose Dagster instance `DAGSTER_HOME` names (so
    `dagster asset materialize` with the local DAGSTER_HOME works from any directory), else
    `.episode_pipeline` in the working directory.
    """
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).resolve()
    dagster_home = os.environ.get("DAGSTER_HOME")
    if dagster_home and (Path(dagster_home).parent / STACK_STATE_FILE).exists():
        return Path(dagster_home).parent.resolve()
    return Path(DEFAULT_HOME).resolve()


def local_stack_env(home: Path | None = None) -> dict[str, str] | None:
    """The variables the embedded stack publishes in its state file; None if never started."""
    state_file = (home or pipeline_home()) / STACK_STATE_FILE
    if not state_file.exists():
        return None
    return dict(json.loads(state_file.read_text())["env"])


def load_settings() -> Settings:
    """Production variables when `DB_HOST` is set, otherwise the embedded stack's."""
    if os.environ.get("DB_HOST"):
        return Settings.from_env(os.environ)
    stack_env = local_stack_env()
    if stack_env is None:
        raise RuntimeError(
            f"DB_HOST is not set and no local stack state was found in {pipeline_home()}: "
            "run `episode-pipeline stack up` (or set the production variables)"
        )
    return Settings.from_env({**stack_env, **os.environ})


def apply_local_stack_env() -> bool:
    """Export the embedded stack's variables into this process when production's are absent.

    For command-line entry points only (never at import): lets Dagster find the local instance
    (`DAGSTER_HOME`) and child processes the local services. Variables already set win. Returns
    whether the local stack's values applied.
    """
    if os.environ.get("DB_HOST"):
        return False
    stack_env = local_stack_env()
    if stack_env is None:
        return False
    for name, value in stack_env.items():
        os.environ.setdefault(name, value)
    return True
