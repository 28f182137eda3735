"""The governor's limit, enforced by the run queue (docs/operations.md#reprocess-the-fleet).

The campaign keeps more runs queued than it may launch (campaign/waves.py: the next wave takes a
driver tick and a backfill daemon iteration to reach the queue). What it may launch is the
governor's limit, per campaign. The driver publishes those limits each tick in the instance's
key-value store (one key: instance/app_state.py). The run coordinator adds them to
`dagster.yaml`'s tag limits on each dequeue: `episode_pipeline/campaign=<id>` at most `limit`
runs at once, 0 while the campaign is paused (by the governor's backpressure or an operator),
stopped or canceled. A halving takes effect at the next dequeue. Running runs finish; queued ones
wait. When the limits cannot be read, no campaign run launches on that dequeue (fail closed);
uploads are not held.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster import DagsterInstance

from episode_pipeline.instance.app_state import publish_limits, published_limits
from episode_pipeline.instance.run_tags import CAMPAIGN_TAG


def hold(instance: DagsterInstance, campaign_id: str) -> None:
    """Hold one campaign at 0 at once (`campaign cancel`), without waiting for the driver's
    next tick; the driver publishes 0 for it from then on."""
    limits = published_limits(instance)
    if limits is None:
        return  # unreadable: the run queue holds every campaign already; the driver rewrites them
    publish_limits(instance, {**limits, campaign_id: 0})


def limit_entries(limits: Mapping[str, int] | None) -> list[dict[str, Any]]:
    """`tag_concurrency_limits` entries for the published limits. Unreadable (None): the campaign
    lane itself at 0 (a key-only entry after `dagster.yaml`'s replaces its limit)."""
    if limits is None:
        return [{"key": CAMPAIGN_TAG, "limit": 0}]
    return [
        {"key": CAMPAIGN_TAG, "value": campaign_id, "limit": max(0, limit)}
        for campaign_id, limit in sorted(limits.items())
    ]
