"""Settings declared once: a field names its environment variable, default and meaning together.

`setting(...)` is a dataclass field carrying that declaration in its metadata; one generic
loader (`EnvSettings.from_env`) reads every group from the environment by the fields' types, and
`variables()` lists every declared variable for the docs table, the tests and the infra checks.
A field without a declaration is either a nested group (loaded the same way) or not configurable.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

_DECLARATION = "setting"


@dataclass(frozen=True)
class Declaration:
    """What one field says about its variable(s)."""

    env: tuple[str, ...]  # read in this order: the first one set wins
    about: str
    # Called with the raw value whenever a variable is set (even to ""); else by the field's type.
    parse: Callable[[str], Any] | None = None
    secret: bool = False  # never shown: resources pass it as an EnvVar
    infra: bool = False  # infra/ecs.tf sets it on every container
    stack: bool = False  # the local stack publishes it in stack.json


def setting(
    env: str | tuple[str, ...],
    about: str,
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    parse: Callable[[str], Any] | None = None,
    secret: bool = False,
    infra: bool = False,
    stack: bool = False,
) -> Any:
    """A settings field read from `env`; without a default the variable is required."""
    names = (env,) if isinstance(env, str) else env
    declaration = Declaration(names, about, parse, secret, infra, stack)
    return dataclasses.field(
        default=default,
        default_factory=default_factory,
        metadata={_DECLARATION: declaration},
    )


def declaration(field: dataclasses.Field) -> Declaration | None:
    return field.metadata.get(_DECLARATION)


def field_default(field: dataclasses.Field) -> Any:
    """The field's declared default (made fresh from a factory); MISSING when required."""
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


class MissingSettings(RuntimeError):
    """Required variables are unset."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(
            f"missing environment variable(s) {', '.join(names)}: set them, or take the local "
            "stack's (`episode-pipeline dev` does; in a shell: "
            '`eval "$(episode-pipeline stack env)"`)'
        )
        self.names = names


def _positive(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise RuntimeError(f"{name}={raw!r} is not a number") from None
    if value <= 0:
        raise RuntimeError(f"{name}={raw!r} must be greater than 0")
    return value


def _optional(hint: Any) -> Any:
    """`X` of `X | None`, else the hint itself."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def parse_value(name: str, raw: str, hint: Any) -> Any:
    """One variable's text as the field's type: numbers positive, lists comma-separated."""
    kind = _optional(hint)
    if kind is bool:
        return raw.strip().lower() in {"1", "true", "yes", "on"}
    if kind is int:
        return int(_positive(name, raw.strip()))
    if kind is float:
        return _positive(name, raw.strip())
    if typing.get_origin(kind) is tuple:
        return tuple(item.strip() for item in raw.split(",") if item.strip())
    return raw.strip()


def format_value(value: Any) -> str:
    """The inverse of `parse_value`: how a value is written to the environment."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return ",".join(str(item) for item in value)
    return str(value)


class EnvSettings:
    """Base of every settings group: `from_env` and `to_env` from the fields' declarations."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field]]

    @classmethod
    def from_env(cls, env: Mapping[str, str], **given: Any) -> Self:
        """The group read from `env`; `given` values win. Every missing required variable, of
        this group and the groups inside it, is named in one error."""
        missing: list[str] = []
        group = _load(cls, env, given, missing)
        if missing:
            raise MissingSettings(missing)
        return group

    def to_env(self) -> dict[str, str]:
        """Every set variable of this group (not of groups inside it), as `from_env` reads it."""
        env: dict[str, str] = {}
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            found = declaration(field)
            value = getattr(self, field.name)
            if found is not None and value is not None:
                env.update({name: format_value(value) for name in found.env})
        return env


def _load(cls: type, env: Mapping[str, str], given: Mapping[str, Any], missing: list[str]) -> Any:
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    incomplete = False
    for field in dataclasses.fields(cls):
        if field.name in given:
            values[field.name] = given[field.name]
            continue
        hint = _optional(hints[field.name])
        found = declaration(field)
        if found is None:
            if isinstance(hint, type) and issubclass(hint, EnvSettings):
                before = len(missing)
                values[field.name] = _load(hint, env, {}, missing)
                incomplete |= len(missing) > before
            continue
        name = next((n for n in found.env if env.get(n)), None)
        if found.parse is not None:
            present = next((n for n in found.env if n in env), None)
            if present is not None:
                values[field.name] = found.parse(env[present])
                continue
        elif name is not None:
            values[field.name] = parse_value(name, env[name], hints[field.name])
            continue
        if field_default(field) is dataclasses.MISSING:
            missing.append(found.env[0])
            incomplete = True
    return None if incomplete else cls(**values)


@dataclass(frozen=True)
class Variable:
    """One declared variable, as the docs table and the tests see it."""

    name: str
    group: str  # the dataclass declaring it
    field: str
    default: Any  # MISSING when required
    declaration: Declaration

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING


def variables(root: type) -> list[Variable]:
    """Every variable `root` and the groups inside it read, each once, in declaration order."""
    seen: dict[str, Variable] = {}
    for group, field in _declared_fields(root):
        found = declaration(field)
        assert found is not None
        for name in found.env:
            seen.setdefault(
                name, Variable(name, group.__name__, field.name, field_default(field), found)
            )
    return list(seen.values())


def _declared_fields(cls: type) -> Iterator[tuple[type, dataclasses.Field]]:
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        hint = _optional(hints[field.name])
        if declaration(field) is not None:
            yield cls, field
        elif isinstance(hint, type) and issubclass(hint, EnvSettings):
            yield from _declared_fields(hint)


def _shown(default: Any) -> str:
    if default is dataclasses.MISSING:
        return "required"
    if default is None or default == ():
        return "unset"
    return f"`{format_value(default)}`"


def variables_table(root: type) -> str:
    """The Markdown table of every variable `root` reads (docs/configuration.md)."""
    rows = [
        "| Variable | Default | Meaning | Group | Set by |",
        "| --- | --- | --- | --- | --- |",
    ]
    for variable in variables(root):
        found = variable.declaration
        set_by = [
            label
            for label, flag in (
                ("infra/ecs.tf", found.infra),
                ("local stack", found.stack),
                ("secret", found.secret),
            )
            if flag
        ]
        rows.append(
            f"| `{variable.name}` | {_shown(variable.default)} | {found.about} "
            f"| `{variable.group}.{variable.field}` | {', '.join(set_by)} |"
        )
    return "\n".join(rows) + "\n"
