"""Secrets in resource config: an `EnvVar` when the value came from the environment.

Dagster shows resource config in the UI and stores it with runs; an `EnvVar` shows only the
variable's name, and the value is read where the resource is used.
"""

from __future__ import annotations

import os

from dagster import EnvVar


def resolved(value: str | None) -> str | None:
    """An `EnvVar` read outside a Dagster run is just its variable's name: read the variable."""
    if isinstance(value, EnvVar):
        return value.get_value() or None
    return value


def secret_field(value: str | None, env_name: str) -> str | None:
    """`EnvVar(env_name)` when `value` came from that variable, so the UI shows only its name."""
    if value is not None and os.environ.get(env_name) == value:
        return EnvVar(env_name)
    return value
