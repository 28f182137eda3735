"""A family of episode checks run by one op: one Dagster step, each check still its own.

Every step costs a run the same event rows whatever it does (start, each input loaded, success),
so a check that is a step of its own pays them again (docs/scale.md). A family's checks share
one step instead, and each keeps what users see: its name and key on its asset, its description,
its severity (declared once, `severity=`), whether it blocks, its own result. The op subsets
(`can_subset=True`), so a check still runs alone from the UI's "Execute" or
`episode-pipeline check --only NAME`.

A check is a function `(context: EpisodeCheckContext, **needs) -> AssetCheckResult`: each
parameter after the context is one of the family's inputs (`ins`) or else a resource key, and
gets only what it names. A check that raises does not stop its siblings: their results are
recorded, the error is logged naming the check, then the step fails with the first error (the
run fails, and `status` shows the error).
"""

import inspect
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetIn,
    AssetKey,
    DagsterInstance,
    multi_asset_check,
)

from episode_pipeline.defs.asset_keys import EXTRACTED_FILES_KEY
from episode_pipeline.defs.partitions import episode_partitions

# The check's metadata entry that declares its severity (the UI and the snapshot show it).
SEVERITY_METADATA = "severity"

CheckFunction = Callable[..., AssetCheckResult]

EXTRACTED_FILES_INS = {"extracted_files": AssetIn(key=EXTRACTED_FILES_KEY)}  # most families'


@dataclass(frozen=True)
class EpisodeCheckContext:
    """What one check of a family is given: its family's op context and its own spec."""

    op: AssetCheckExecutionContext
    spec: AssetCheckSpec

    @property
    def partition_key(self) -> str:
        return self.op.partition_key

    @property
    def instance(self) -> DagsterInstance:
        return self.op.instance

    @property
    def log(self) -> Any:
        return self.op.log

    @property
    def severity(self) -> AssetCheckSeverity:
        return declared_severity(self.spec)


def declared_severity(spec: AssetCheckSpec) -> AssetCheckSeverity:
    """The severity the check declared with `severity=`."""
    value = spec.metadata[SEVERITY_METADATA]
    return AssetCheckSeverity(getattr(value, "value", value))


@dataclass(frozen=True)
class EpisodeCheck:
    spec: AssetCheckSpec
    evaluate: CheckFunction
    needs: tuple[str, ...]  # the function's parameters after the context


class EpisodeCheckFamily:
    """The checks of one asset family, partitioned by episode, run by the op `name`."""

    def __init__(self, name: str, ins: Mapping[str, AssetIn] | None = None) -> None:
        self.name = name
        self.ins = dict(ins or {})
        self.checks: list[EpisodeCheck] = []

    def check(
        self,
        *,
        asset: AssetKey,
        severity: AssetCheckSeverity,
        description: str,
        blocking: bool = False,
        name: str | None = None,
        additional_deps: Sequence[AssetKey] = (),
    ) -> Callable[[CheckFunction], CheckFunction]:
        """Add the decorated function to the family as the check `name` (default: its name)."""

        def add(fn: CheckFunction) -> CheckFunction:
            needs = tuple(inspect.signature(fn).parameters)[1:]
            inputs = [self.ins[need].key for need in needs if need in self.ins]
            deps = [key for key in [*inputs, *additional_deps] if key != asset]
            spec = AssetCheckSpec(
                name=name or fn.__name__,
                asset=asset,
                description=description,
                blocking=blocking,
                additional_deps=deps,
                metadata={SEVERITY_METADATA: severity.value},
                partitions_def=episode_partitions,
            )
            self.checks.append(EpisodeCheck(spec, fn, needs))
            return fn

        return add

    def definition(self) -> AssetChecksDefinition:
        """The family's op: every check it is asked for, in the order they were added."""
        checks = list(self.checks)
        resources = {need for c in checks for need in c.needs if need not in self.ins}

        def run_family(context: AssetCheckExecutionContext, **inputs: Any) -> Iterator[Any]:
            yield from evaluate_selected(context, checks, inputs)

        run_family.__signature__ = self._signature()  # type: ignore[attr-defined]
        return multi_asset_check(
            name=self.name,
            specs=[c.spec for c in checks],
            can_subset=True,
            ins=self.ins,
            required_resource_keys=resources,
            description="Runs: " + ", ".join(c.spec.name for c in checks),
        )(run_family)

    def _signature(self) -> inspect.Signature:
        """`(context, <each input>: <its type in the checks>)`: Dagster reads an op's inputs and
        their types (what the IO manager loads) off its function's signature."""
        types: dict[str, Any] = {}
        for check in self.checks:
            hints = typing.get_type_hints(check.evaluate)
            types |= {need: hints.get(need, Any) for need in check.needs if need in self.ins}
        keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
        return inspect.Signature(
            [
                inspect.Parameter("context", keyword, annotation=AssetCheckExecutionContext),
                *(inspect.Parameter(name, keyword, annotation=t) for name, t in types.items()),
            ]
        )


def evaluate_selected(
    context: AssetCheckExecutionContext, checks: Sequence[EpisodeCheck], inputs: Mapping[str, Any]
) -> Iterator[AssetCheckResult]:
    """Each selected check's result, with its key and declared severity; the first error last."""
    selected = context.selected_asset_check_keys
    failure: Exception | None = None
    for check in checks:
        if check.spec.key not in selected:
            continue
        given = {
            need: inputs[need] if need in inputs else getattr(context.resources, need)
            for need in check.needs
        }
        try:
            result = check.evaluate(EpisodeCheckContext(context, check.spec), **given)
        except Exception as error:  # recorded on the step; the siblings still run
            context.log.error(f"check {check.spec.name} raised {type(error).__name__}: {error}")
            failure = failure or error
            continue
        yield AssetCheckResult(
            passed=result.passed,
            asset_key=check.spec.asset_key,
            check_name=check.spec.name,
            metadata=result.metadata,
            severity=declared_severity(check.spec),
            description=result.description,
        )
    if failure is not None:
        raise failure
