"""Resource fields that are settings: their defaults and descriptions come from the declaration.

A resource shows its configuration in the UI and the launchpad, so it keeps pydantic fields; each
such field is `setting_field(Group, "name")`, and `resource_values` / `settings_from` move values
between a resource and its settings group, field by field by name. A secret that came from its
variable travels as an `EnvVar` (see `secret_config`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import Field

from episode_pipeline.config.env import EnvSettings, declaration, field_default
from episode_pipeline.defs.resources.secret_config import resolved, secret_field

Group = TypeVar("Group", bound=EnvSettings)


def _settings_fields(group: type[EnvSettings]) -> list[dataclasses.Field]:
    """The group's own settings (nested groups are resources' business, not fields)."""
    return [f for f in dataclasses.fields(group) if declaration(f) is not None]  # type: ignore[arg-type]


def setting_field(group: type[EnvSettings], name: str) -> Any:
    """The pydantic field for `group.name`: the declared default (tuples as lists) and meaning."""
    (found,) = [f for f in _settings_fields(group) if f.name == name]
    about = declaration(found)
    assert about is not None
    description = f"{about.about} ({', '.join(about.env)})"
    default = field_default(found)
    if default is dataclasses.MISSING:
        return Field(description=description)
    if isinstance(default, tuple):
        return Field(default_factory=lambda: list(default), description=description)
    return Field(default=default, description=description)


def resource_values(
    settings: EnvSettings, rename: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A resource's fields from a settings group; `rename` maps a setting to another field name."""
    values: dict[str, Any] = {}
    for f in _settings_fields(type(settings)):
        value = getattr(settings, f.name)
        about = declaration(f)
        assert about is not None
        if about.secret:
            value = secret_field(value, about.env[0])
        elif isinstance(value, tuple):
            value = list(value)
        values[(rename or {}).get(f.name, f.name)] = value
    return values


def settings_from(
    resource: Any, group: type[Group], rename: Mapping[str, str] | None = None
) -> Group:
    """The settings group a resource's fields describe (the inverse of `resource_values`)."""
    values: dict[str, Any] = {}
    for f in _settings_fields(group):
        value = getattr(resource, (rename or {}).get(f.name, f.name))
        values[f.name] = tuple(value) if isinstance(value, list) else resolved(value)
    return group(**values)
