"""The application's state in Dagster's key-value store (its `kvs` table): every key the pipeline
keeps there, the format of its value, and its reads and writes through the instance's public API
(`run_storage.get_cursor_values` / `set_cursor_values`).

- the campaign registry, `episode_pipeline/campaign/<id>` → `1`: a campaign this deployment
  started (`campaign start`); the driver drives only those;
- the campaigns' launch limits, `episode_pipeline/campaign_limits` → JSON, campaign id → runs:
  written by the driver each tick (and `campaign cancel`), read by the run queue on each dequeue
  (instance/campaign_queue.py);
- upload-done records, `episode_pipeline/upload-done/<upload>` → JSON `run_id`, `ended`: kept by
  retention's prune for an upload whose successful run it deletes, read by the uploads sensors
  when an upload has no run (docs/retention.md);
- dead-letter reasons, `episode_pipeline/dead-letter-reason/<message id>` → a `RecordedReason`
  as JSON: why the uploads sensor last left a message, read by `dlq list`.

Retention expires the last two by the epoch seconds their value holds (`EXPIRES_BY`). That
expiry, and the write of upload-done records inside the prune's transaction, are statements:
they live with every statement on Dagster's tables, in orchestration/dagster_tables.py.

This module is in instance/ because the run queue (a plugin) reads the limits, and the plugins
import neither the services nor the definitions.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping

from dagster import DagsterInstance

from episode_pipeline.uploads.reasons import RecordedReason

log = logging.getLogger(__name__)

# -- the campaign registry ----------------------------------------------------------------------

# A campaign belongs to the Dagster deployment that started it: its id is kept in that instance's
# key-value table, and a driver drives only its own (another deployment — staging, or a test's
# private instance — on the same application database leaves it alone).
CAMPAIGN_REGISTRY_PREFIX = "episode_pipeline/campaign/"


def register_campaign(instance: DagsterInstance, campaign_id: str) -> None:
    instance.run_storage.set_cursor_values({CAMPAIGN_REGISTRY_PREFIX + campaign_id: "1"})


def registered(instance: DagsterInstance, campaign_ids: Iterable[str]) -> set[str]:
    """The campaigns among these that this deployment started (one query)."""
    keys = {CAMPAIGN_REGISTRY_PREFIX + campaign_id for campaign_id in campaign_ids}
    if not keys:
        return set()
    return {
        key.removeprefix(CAMPAIGN_REGISTRY_PREFIX)
        for key in instance.run_storage.get_cursor_values(keys)
    }


# -- the campaigns' launch limits (the run queue's campaign lanes) ------------------------------

CAMPAIGN_LIMITS_KEY = "episode_pipeline/campaign_limits"


def publish_limits(instance: DagsterInstance, limits: Mapping[str, int]) -> None:
    """Each driven campaign's launch limit (campaign id → runs), replacing the last tick's."""
    instance.run_storage.set_cursor_values(
        {CAMPAIGN_LIMITS_KEY: json.dumps(dict(sorted(limits.items())))}
    )


def published_limits(instance: DagsterInstance) -> dict[str, int] | None:
    """The limits the driver published ({} when none yet), or None when they cannot be read:
    the run queue then launches no campaign run (`campaign_queue.limit_entries`), and says why
    in the daemon's log. Failing open would let a paused campaign launch the whole lane."""
    try:
        raw = instance.run_storage.get_cursor_values({CAMPAIGN_LIMITS_KEY}).get(CAMPAIGN_LIMITS_KEY)
        return {str(key): int(value) for key, value in json.loads(raw).items()} if raw else {}
    except Exception as error:  # a dequeue must not fail on this: uploads still launch
        log.warning(f"campaign limits not read ({error}): no campaign run launches this dequeue")
        return None


# -- upload-done records: an upload whose successful run retention deleted ----------------------

UPLOAD_DONE_PREFIX = "episode_pipeline/upload-done/"


def upload_done_key(upload: str) -> str:
    return UPLOAD_DONE_PREFIX + upload


def upload_record(run_id: str, ended: float) -> str:
    return json.dumps({"run_id": run_id, "ended": ended}, separators=(",", ":"))


def pruned_successes(instance: DagsterInstance, uploads: Iterable[str]) -> dict[str, str]:
    """Upload → the id of its successful run, for uploads whose runs were pruned: one query."""
    keys = {upload_done_key(upload) for upload in uploads}
    if not keys:
        return {}
    found = instance.run_storage.get_cursor_values(keys)
    return {
        key.removeprefix(UPLOAD_DONE_PREFIX): json.loads(value)["run_id"]
        for key, value in found.items()
    }


# -- dead-letter reasons: why the uploads sensor last left a message ----------------------------

# SQS keeps no reason with a dead letter: the sensor keeps it here, by message id, for `dlq list`.
DEAD_LETTER_REASON_PREFIX = "episode_pipeline/dead-letter-reason/"


def record_dead_letter_reasons(
    instance: DagsterInstance, recorded: Mapping[str, RecordedReason]
) -> None:
    """Keep why each of these messages (by id) was left, for `dlq list`: one statement."""
    if recorded:
        instance.run_storage.set_cursor_values(
            {
                DEAD_LETTER_REASON_PREFIX + message_id: r.to_json()
                for message_id, r in recorded.items()
            }
        )


def recorded_dead_letter_reasons(
    instance: DagsterInstance, message_ids: Iterable[str]
) -> dict[str, RecordedReason]:
    """Message id → what the sensor recorded when it last left it (one query)."""
    keys = {DEAD_LETTER_REASON_PREFIX + message_id for message_id in message_ids}
    if not keys:
        return {}
    found = instance.run_storage.get_cursor_values(keys)
    parsed = {
        key.removeprefix(DEAD_LETTER_REASON_PREFIX): RecordedReason.from_json(value)
        for key, value in found.items()
    }
    return {message_id: r for message_id, r in parsed.items() if r is not None}


# -- what retention expires ---------------------------------------------------------------------

# Key prefix → the field of the value holding its epoch seconds; retention deletes a record once
# that is older than `RETENTION_UPLOAD_RECORD_DAYS` (longer than any message of it lives).
EXPIRES_BY = {
    UPLOAD_DONE_PREFIX: "ended",  # upload_record
    DEAD_LETTER_REASON_PREFIX: "at",  # RecordedReason.at
}
