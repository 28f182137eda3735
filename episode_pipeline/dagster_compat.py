"""Dagster's private names, behind one door: every `dagster._` import of the package outside
the instance's plugins (`instance/`, which subclass Dagster's storages, run coordinator and
launcher and import theirs directly) comes from here, so a Dagster upgrade re-checks this file
and `instance/`. `test_dagster_internals.py` lists them all; a new one fails there until it is
listed. Checked against Dagster 1.13.
"""

from dagster._core.definitions.data_version import (
    DATA_VERSION_TAG,
    get_input_data_version_tag,
    get_input_event_pointer_tag,
)
from dagster._core.definitions.external_asset import create_external_asset_from_source_asset
from dagster._core.definitions.repository_definition import SINGLETON_REPOSITORY_NAME
from dagster._core.definitions.selector import InstigatorSelector
from dagster._core.execution.backfill import (
    BULK_ACTION_TERMINAL_STATUSES,
    BulkActionsFilter,
    BulkActionStatus,
    PartitionBackfill,
)
from dagster._core.remote_origin import (
    InProcessCodeLocationOrigin,
    RemotePartitionSetOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.remote_representation.external_data import partition_set_snap_name_for_job_name
from dagster._core.scheduler.instigation import TickStatus
from dagster._core.storage.asset_check_execution_record import (
    AssetCheckExecutionRecord,
    AssetCheckExecutionRecordStatus,
)
from dagster._core.storage.event_log.schema import AssetCheckExecutionsTable

# run_retries' tags: a failed run it will retry, the retry's parent, the parent's retry.
from dagster._core.storage.tags import (
    AUTO_RETRY_RUN_ID_TAG,
    PARENT_RUN_ID_TAG,
    PARTITION_NAME_TAG,
    PRIORITY_TAG,
    WILL_RETRY_TAG,
)
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._utils.error import SerializableErrorInfo

__all__ = [
    "AUTO_RETRY_RUN_ID_TAG",
    "BULK_ACTION_TERMINAL_STATUSES",
    "DATA_VERSION_TAG",
    "PARENT_RUN_ID_TAG",
    "PARTITION_NAME_TAG",
    "PRIORITY_TAG",
    "SINGLETON_REPOSITORY_NAME",
    "WILL_RETRY_TAG",
    "AssetCheckExecutionRecord",
    "AssetCheckExecutionRecordStatus",
    "AssetCheckExecutionsTable",
    "BulkActionStatus",
    "BulkActionsFilter",
    "InProcessCodeLocationOrigin",
    "InstigatorSelector",
    "LoadableTargetOrigin",
    "PartitionBackfill",
    "RemotePartitionSetOrigin",
    "RemoteRepositoryOrigin",
    "SerializableErrorInfo",
    "TickStatus",
    "create_external_asset_from_source_asset",
    "get_input_data_version_tag",
    "get_input_event_pointer_tag",
    "partition_set_snap_name_for_job_name",
]
