"""The governor's limit, enforced by the run queue (docs/operations.md#reprocess-the-fleet).

The campaign keeps more runs queued than it may launch (campaign/waves.py: the next wave takes a
driver tick and a backfill daemon iteration to reach the queue). What it may launch is the
governor's limit, per campaign. The driver publishes those limits each tick in the instance's
key-value store (one key). The run coordinator adds them to `dagster.yaml`'s tag limits on each
dequeue: `episode_pipeline/campaign=<id>` at most `limit` runs at once, 0 while the campaign is
paused (by the governor's backpressure or an operator), stopped or canceled. A halving takes
effect at the next dequeue. Running runs finish; queued ones wait. When the limits cannot be read,
no campaign run launches on that dequeue (fail closed); uploads are not held.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from dagster import DagsterInstance

from episode_pipeline.instance.run_tags import CAMPAIGN_TAG

LIMITS_KEY = "episode_pipeline/campaign_limits"
log = logging.getLogger(__name__)


def publish_limits(instance: DagsterInstance, limits: Mapping[str, int]) -> None:
    """Each driven campaign's launch limit (campaign id → runs), replacing the last tick's."""
    instance.run_storage.set_cursor_values({LIMITS_KEY: json.dumps(dict(sorted(limits.items())))})


def hold(instance: DagsterInstance, campaign_id: str) -> None:
    """Hold one campaign at 0 at once (`campaign cancel`), without waiting for the driver's
    next tick; the driver publishes 0 for it from then on."""
    limits = published_limits(instance)
    if limits is None:
        return  # unreadable: the run queue holds every campaign already; the driver rewrites them
    publish_limits(instance, {**limits, campaign_id: 0})


def published_limits(instance: DagsterInstance) -> dict[str, int] | None:
    """The limits the driver published ({} when none yet), or None when they cannot be read:
    the run queue then launches no campaign run (`limit_entries`), and says why in the
    daemon's log. Failing open would let a paused campaign launch the whole lane."""
    try:
        raw = instance.run_storage.get_cursor_values({LIMITS_KEY}).get(LIMITS_KEY)
        return {str(key): int(value) for key, value in json.loads(raw).items()} if raw else {}
    except Exception as error:  # a dequeue must not fail on this: uploads still launch
        log.warning(f"campaign limits not read ({error}): no campaign run launches this dequeue")
        return None


def limit_entries(limits: Mapping[str, int] | None) -> list[dict[str, Any]]:
    """`tag_concurrency_limits` entries for the published limits. Unreadable (None): the campaign
    lane itself at 0 (a key-only entry after `dagster.yaml`'s replaces its limit)."""
    if limits is None:
        return [{"key": CAMPAIGN_TAG, "limit": 0}]
    return [
        {"key": CAMPAIGN_TAG, "value": campaign_id, "limit": max(0, limit)}
        for campaign_id, limit in sorted(limits.items())
    ]
