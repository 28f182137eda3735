"""Resource fields made from the settings' declarations: a setting is declared once, in its group.

A resource shows its configuration in the UI and the launchpad, so it has pydantic fields. They
are not written again on the resource: `settings_resource(SettingsFields(Group), ...)` is a base
class with one field per setting of each group, named, typed, defaulted and described by the
setting's declaration, so a setting added to a group is a field of the resource. `values` and
`read` move values between a resource and its settings group, field by field by name.

A secret that came from its variable travels as an `EnvVar`: Dagster shows resource config in
the UI and stores it with runs, and an `EnvVar` shows only the variable's name; the value is read
where the resource is used.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from dagster import ConfigurableResource, EnvVar
from pydantic import Field

from episode_pipeline.config.env import EnvSettings, declaration, field_default

Group = TypeVar("Group", bound=EnvSettings)


@dataclass(frozen=True)
class SettingsFields(Generic[Group]):
    """The settings of `group` a resource has as fields: every one, or `only` those named; each
    field is named as its setting unless `rename` maps the setting to another name."""

    group: type[Group]
    only: tuple[str, ...] = ()
    rename: Mapping[str, str] = field(default_factory=dict)

    def settings(self) -> list[dataclasses.Field]:
        """The group's own settings shown (a nested group is another resource's business)."""
        return [
            f
            for f in dataclasses.fields(self.group)  # type: ignore[arg-type]
            if declaration(f) is not None and (not self.only or f.name in self.only)
        ]

    def field_name(self, setting: dataclasses.Field) -> str:
        return self.rename.get(setting.name, setting.name)

    def pydantic_fields(self) -> dict[str, tuple[Any, Any]]:
        """Each field's name, its type as Dagster config takes it, and its pydantic `Field`."""
        hints = typing.get_type_hints(self.group)
        return {
            self.field_name(f): (_config_type(hints[f.name]), _pydantic_field(f))
            for f in self.settings()
        }

    def values(self, settings: Group) -> dict[str, Any]:
        """The resource's field values from a settings group (a secret from its variable as an
        `EnvVar`, a tuple as a list)."""
        values: dict[str, Any] = {}
        for f in self.settings():
            value = getattr(settings, f.name)
            about = declaration(f)
            assert about is not None
            values[self.field_name(f)] = (
                secret_field(value, about.env[0]) if about.secret else _as_config(value)
            )
        return values

    def read(self, resource: Any) -> Group:
        """The settings group the resource's fields describe (the inverse of `values`; for a
        group shown whole)."""
        values: dict[str, Any] = {}
        for f in self.settings():
            value = getattr(resource, self.field_name(f))
            values[f.name] = tuple(value) if isinstance(value, list) else resolved(value)
        return self.group(**values)


def settings_resource(
    *carried: SettingsFields, base: type[ConfigurableResource] = ConfigurableResource
) -> type[Any]:
    """A base class for a resource: `base` with a pydantic field for each setting `carried`.

    Built as a class statement would be (annotations and defaults in its namespace), so Dagster's
    resource metaclass and pydantic see ordinary fields.
    """
    fields = {name: f for shown in carried for name, f in shown.pydantic_fields().items()}

    def body(namespace: dict[str, Any]) -> None:
        namespace["__module__"] = __name__
        namespace["__annotations__"] = {name: hint for name, (hint, _) in fields.items()}
        namespace.update({name: default for name, (_, default) in fields.items()})

    name = "".join(shown.group.__name__ for shown in carried) + "Fields"
    return types.new_class(name, (base,), exec_body=body)


def _as_config(value: Any) -> Any:
    """Dagster config has lists where the settings have tuples."""
    return list(value) if isinstance(value, tuple) else value


def _config_type(hint: Any) -> Any:
    """Dagster config has lists, not tuples: `tuple[X, ...]` is configured as `list[X]`."""
    if typing.get_origin(hint) is tuple:
        return list[typing.get_args(hint)[0]]  # type: ignore[misc]
    return hint


def _pydantic_field(setting: dataclasses.Field) -> Any:
    """The setting's declared default (tuples as lists) and meaning, with its variable(s).

    A list default is given as a value, not a factory: Dagster's config schema (the launchpad)
    shows only a value, and pydantic copies it for each instance."""
    about = declaration(setting)
    assert about is not None
    description = f"{about.about} ({', '.join(about.env)})"
    default = field_default(setting)
    if default is dataclasses.MISSING:
        return Field(description=description)
    return Field(default=_as_config(default), description=description)


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
