"""Which assets a campaign runs: the changed ones and those downstream of them (pure).

An episode's record (`episode_outputs.code_versions`) names the code version of every asset that
made its outputs. The assets whose version differs from the one deployed changed; they and every
asset downstream of them are re-materialized, the others' outputs loaded as stored (the IO
managers: `extracted_files` from its JSON under `processed/_dagster/`). An episode with no record,
or a record that names no version for some asset (an old row, an asset added since), is unknown:
it runs the whole graph. So does one whose stored outputs the selection would load are missing.

The graph is given as `{asset: its downstream assets}` (`defs/code_versions.asset_children`), so
this module knows no Dagster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from episode_pipeline.storage.bucket import MissingStoredOutput

# The error an asset's run fails with when an upstream output it loads is not stored (raised by
# the S3 IO manager): that episode needs the whole graph.
MISSING_STORED_OUTPUT = MissingStoredOutput.__name__


def changed_assets(recorded: Mapping[str, str] | None, current: Mapping[str, str]) -> set[str]:
    """The assets whose recorded version is not the current one; all of them when unknown."""
    if not recorded:
        return set(current)
    return {asset for asset, version in current.items() if recorded.get(asset) != version}


def downstream_closure(assets: Iterable[str], children: Mapping[str, Iterable[str]]) -> set[str]:
    """The assets and every asset downstream of them in the graph."""
    found: set[str] = set()
    todo = list(assets)
    while todo:
        asset = todo.pop()
        if asset not in found:
            found.add(asset)
            todo.extend(children.get(asset, ()))
    return found


def assets_to_run(
    recorded: Mapping[str, str] | None,
    current: Mapping[str, str],
    children: Mapping[str, Iterable[str]],
) -> set[str]:
    """What one episode recorded under `recorded` needs to reach `current`: empty when nothing
    changed, every asset of `current` when its record is unknown."""
    return downstream_closure(changed_assets(recorded, current), children) & set(current)


def stored_inputs(selection: Iterable[str], children: Mapping[str, Iterable[str]]) -> set[str]:
    """The assets outside the selection whose outputs the selected ones read: the stored outputs
    a run of the selection needs."""
    selected = set(selection)
    return {
        asset
        for asset, below in children.items()
        if asset not in selected and selected.intersection(below)
    }


@dataclass(frozen=True)
class AssetPlan:
    """The campaign's asset selection: `assets` for the episodes whose record is known (None:
    the whole graph for every episode), and the episodes that run the whole graph anyway."""

    assets: tuple[str, ...] | None  # graph order; None: the whole graph
    whole_graph: tuple[str, ...]  # every asset of the episode job, graph order
    episodes_whole_graph: int  # no record, an old one, or missing stored outputs
    reasons: dict[str, int]  # why, episode counts: unknown record, missing stored outputs

    @property
    def is_partial(self) -> bool:
        return self.assets is not None

    def as_json(self) -> dict[str, object]:
        return {
            "assets": list(self.assets or self.whole_graph),
            "whole_graph": self.assets is None,
            "episodes_whole_graph": self.episodes_whole_graph,
            "whole_graph_reasons": self.reasons,
        }


UNKNOWN_RECORD = "no record or an old one"
MISSING_OUTPUTS = "stored outputs missing"
ALL_CHANGED = "every asset changed"


def plan_assets(
    groups: Iterable[tuple[Mapping[str, str] | None, int]],
    current: Mapping[str, str],
    children: Mapping[str, Iterable[str]],
    order: Iterable[str],
) -> AssetPlan:
    """The campaign's selection over groups of episodes alike in their record (`(recorded code
    versions or None, episodes)`): the union of the known groups' closures. Unknown records are
    counted to run the whole graph; a known group whose closure is the whole graph makes the
    selection the whole graph for everyone."""
    whole = tuple(asset for asset in order if asset in current)
    union: set[str] = set()
    reasons: dict[str, int] = {}
    for recorded, episodes in groups:
        if not recorded or not set(current) <= set(recorded):
            reasons[UNKNOWN_RECORD] = reasons.get(UNKNOWN_RECORD, 0) + episodes
            continue
        union |= assets_to_run(recorded, current, children)
    unknown = reasons.get(UNKNOWN_RECORD, 0)
    if not union or union >= set(whole):
        # Nothing known changed (a plain reprocess) or everything did: the whole graph for all.
        return AssetPlan(None, whole, 0, {})
    return AssetPlan(tuple(a for a in whole if a in union), whole, unknown, reasons)


def with_missing_outputs(plan: AssetPlan, missing: int) -> AssetPlan:
    """The plan once the stored outputs it reads were looked for: `missing` more episodes run
    the whole graph."""
    if not missing or plan.assets is None:
        return plan
    reasons = {**plan.reasons, MISSING_OUTPUTS: missing}
    return AssetPlan(plan.assets, plan.whole_graph, plan.episodes_whole_graph + missing, reasons)


def is_missing_stored_output(error: str | None) -> bool:
    """A run's error says an input it loads is not stored: run that episode's whole graph."""
    return bool(error) and MISSING_STORED_OUTPUT in (error or "")
