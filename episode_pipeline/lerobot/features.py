"""Which features hold a frame's state and action: one rule for every dataset.

Datasets in the wild name them differently (`observation.state`, `state`,
`observation.joint_state`; `action`, `actions`), so the names are resolved once per upload from
`meta/info.json`'s features (or, when it lists none, from a data file's columns) with the rule in
docs/lerobot-archives.md#state-and-action.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from episode_pipeline.lerobot.info import DatasetInfo

STATE_NAMES = ("observation.state", "state")
ACTION_NAMES = ("action", "actions")
OBSERVATION_PREFIX = "observation."
STATE_RULE = "observation.state, else state, else a single observation.*state* vector"

# info.json dtypes of a numeric vector (LeRobot writes numpy dtype names).
_NUMERIC_DTYPE_PREFIXES = ("float", "int", "uint")


def is_numeric_dtype(dtype: object) -> bool:
    """True for an info.json feature dtype such as ``float32`` or ``int64``."""
    return isinstance(dtype, str) and dtype.lower().startswith(_NUMERIC_DTYPE_PREFIXES)


@dataclass(frozen=True)
class FrameFeatures:
    """The resolved state and action feature names (``None``: the dataset has none)."""

    state: str | None
    action: str | None
    source: str  # where the names came from: "meta/info.json" or a data file's columns
    state_candidates: tuple[str, ...] = ()  # observation.*state* vectors that competed

    @property
    def missing_state(self) -> str | None:
        """Why there is no state feature, for an operator; ``None`` when there is one."""
        if self.state is not None:
            return None
        if self.state_candidates:
            return (
                f"{self.source}: no single state feature ({STATE_RULE}); several candidates: "
                f"{', '.join(self.state_candidates)}"
            )
        return f"{self.source}: no state feature ({STATE_RULE})"


def resolve_frame_features(numeric: Mapping[str, bool], *, source: str) -> FrameFeatures:
    """Apply the rule to feature names; ``numeric[name]`` says whether the feature is numeric.

    State: ``observation.state``, else ``state``, else the one numeric feature whose name starts
    with ``observation.`` and contains ``state`` (none or several: no state). Action: ``action``,
    else ``actions``. Exact names win whatever their type: a wrong type is the file's error.
    """
    state = next((name for name in STATE_NAMES if name in numeric), None)
    candidates: tuple[str, ...] = ()
    if state is None:
        candidates = tuple(
            sorted(
                name
                for name, is_numeric in numeric.items()
                if is_numeric
                and name.startswith(OBSERVATION_PREFIX)
                and "state" in name[len(OBSERVATION_PREFIX) :].lower()
            )
        )
        if len(candidates) == 1:
            state, candidates = candidates[0], ()
    action = next((name for name in ACTION_NAMES if name in numeric), None)
    return FrameFeatures(state, action, source, candidates)


def features_from_info(info: DatasetInfo) -> FrameFeatures | None:
    """Resolve from info.json's ``features``; ``None`` when it lists none (ask the data files)."""
    if not info.features:
        return None
    numeric = {name: is_numeric_dtype(spec.get("dtype")) for name, spec in info.features.items()}
    return resolve_frame_features(numeric, source=info.source)
