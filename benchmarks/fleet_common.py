"""What the `fleet` stage shares with its parts (fleet_ui, fleet_daemon).

Here, not in `fleet`, which imports the parts: a part importing `fleet` back made a circle.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from benchmarks.common import BenchContext, private_stack

UI_PAGE_SECONDS = 3.0  # the target of every UI page (issue 18)


def fleet_stack(ctx: BenchContext) -> Any:
    """A stack of this stage's own (its Dagster instance fills up with the fleet)."""
    return private_stack(ctx, "fleet-stack-home")


@dataclasses.dataclass
class Sample:
    """One size's measurements: metric → each repeat's value, and what a probe saw."""

    size: int
    values: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    def add(self, metric: str, value: float) -> None:
        self.values.setdefault(metric, []).append(value)


def sizes(config: Any) -> list[int]:
    """The fleet's sizes; `0` alone (`--set fleet_sizes=0`) builds no fleet."""
    listed = [int(s) for s in str(config.fleet_sizes).replace("_", "").split(",") if s.strip()]
    return [size for size in listed if size > 0]
