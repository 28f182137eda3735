"""Dagster's private names the run bookkeeping uses (runs, retries, backfills, the run queue):
one door, so a Dagster upgrade re-checks them here. `test_dagster_internals.py` lists every
private Dagster import of the package; a new one fails there until it is listed (and, for the
run bookkeeping, imported through this module). Checked against Dagster 1.13.
"""

from dagster._core.execution.backfill import BULK_ACTION_TERMINAL_STATUSES, BulkActionStatus
from dagster._core.run_coordinator import QueuedRunCoordinator, SubmitRunContext
from dagster._core.run_coordinator.queued_run_coordinator import RunQueueConfig
from dagster._core.storage.dagster_run import ACTIVE_RUN_STATUSES, DagsterRun, RunRecord

# run_retries' tags: a failed run it will retry, the retry's parent, the parent's retry.
from dagster._core.storage.tags import (
    AUTO_RETRY_RUN_ID_TAG,
    PARENT_RUN_ID_TAG,
    PRIORITY_TAG,
    WILL_RETRY_TAG,
)

__all__ = [
    "ACTIVE_RUN_STATUSES",
    "AUTO_RETRY_RUN_ID_TAG",
    "BULK_ACTION_TERMINAL_STATUSES",
    "PARENT_RUN_ID_TAG",
    "PRIORITY_TAG",
    "WILL_RETRY_TAG",
    "BulkActionStatus",
    "DagsterRun",
    "QueuedRunCoordinator",
    "RunQueueConfig",
    "RunRecord",
    "SubmitRunContext",
]
