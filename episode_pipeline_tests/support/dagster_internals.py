"""Dagster's private names the tests use (test utilities, daemons' iterations, tags, storage
records): one door, so a Dagster upgrade re-checks them here, as `episode_pipeline/defs/
dagster_internals.py` is the package's. `test_dagster_internals.py` fails on a test module that
imports `dagster._…` other than through this one. Checked against Dagster 1.13.
"""

from __future__ import annotations

from dagster._config import process_config
from dagster._core.asset_graph_view.serializable_entity_subset import SerializableEntitySubset
from dagster._core.code_pointer import ModuleCodePointer
from dagster._core.definitions.data_version import DATA_VERSION_TAG
from dagster._core.definitions.partitions.context import partition_loading_context
from dagster._core.definitions.partitions.subset.default import DefaultPartitionsSubset
from dagster._core.definitions.run_request import InstigatorType
from dagster._core.errors import DagsterAssetCheckFailedError
from dagster._core.event_api import PartitionKeyFilter
from dagster._core.events import (
    AssetObservationData,
    EngineEventData,
    RunFailureReason,
    StepMaterializationData,
)
from dagster._core.execution.backfill import BulkActionStatus
from dagster._core.execution.plan.objects import StepFailureData
from dagster._core.instance.config import dagster_instance_config
from dagster._core.launcher import LaunchRunContext
from dagster._core.launcher.base import CheckRunHealthResult, WorkerStatus
from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
from dagster._core.remote_origin import (
    GrpcServerCodeLocationOrigin,
    InProcessCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.run_coordinator import QueuedRunCoordinator, SubmitRunContext
from dagster._core.run_coordinator.queued_run_coordinator import RunQueueConfig
from dagster._core.scheduler.instigation import InstigatorTick, TickData, TickStatus
from dagster._core.storage.asset_check_execution_record import (
    AssetCheckExecutionRecordStatus,
    AssetCheckExecutionResolvedStatus,
    AssetCheckPartitionInfo,
)
from dagster._core.storage.dagster_run import RunRecord
from dagster._core.storage.event_log.base import AssetEntry, AssetRecord
from dagster._core.storage.partition_status_cache import AssetStatusCacheValue
from dagster._core.storage.tags import (
    BACKFILL_ID_TAG,
    PARENT_RUN_ID_TAG,
    PARTITION_NAME_TAG,
    PRIORITY_TAG,
    ROOT_RUN_ID_TAG,
    RUN_FAILURE_REASON_TAG,
    RUN_KEY_TAG,
    SENSOR_NAME_TAG,
    WILL_RETRY_TAG,
)
from dagster._core.test_utils import (
    create_run_for_test,
    create_test_daemon_workspace_context,
    in_process_test_workspace,
    instance_for_test,
)
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.utils import make_new_run_id
from dagster._core.workspace.config_schema import ensure_workspace_config
from dagster._core.workspace.load_target import EmptyWorkspaceTarget, ModuleTarget
from dagster._daemon.auto_run_reexecution.auto_run_reexecution import (
    consume_new_runs_for_automatic_reexecution,
    retry_run,
)
from dagster._daemon.backfill import execute_backfill_iteration
from dagster._daemon.daemon import BackfillDaemon
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon
from dagster._daemon.types import DaemonHeartbeat
from dagster._serdes import ConfigurableClassData, serialize_value
from dagster._utils.error import SerializableErrorInfo
from dagster._utils.tags import TagConcurrencyLimitsCounter

__all__ = [
    "BACKFILL_ID_TAG",
    "DATA_VERSION_TAG",
    "PARENT_RUN_ID_TAG",
    "PARTITION_NAME_TAG",
    "PRIORITY_TAG",
    "ROOT_RUN_ID_TAG",
    "RUN_FAILURE_REASON_TAG",
    "RUN_KEY_TAG",
    "SENSOR_NAME_TAG",
    "WILL_RETRY_TAG",
    "AssetCheckExecutionRecordStatus",
    "AssetCheckExecutionResolvedStatus",
    "AssetCheckPartitionInfo",
    "AssetEntry",
    "AssetObservationData",
    "AssetRecord",
    "AssetStatusCacheValue",
    "BackfillDaemon",
    "BulkActionStatus",
    "CheckRunHealthResult",
    "ConfigurableClassData",
    "DaemonHeartbeat",
    "DagsterAssetCheckFailedError",
    "DefaultPartitionsSubset",
    "EmptyWorkspaceTarget",
    "EngineEventData",
    "GrpcServerCodeLocationOrigin",
    "InProcessCodeLocationOrigin",
    "InstigatorTick",
    "InstigatorType",
    "JobPythonOrigin",
    "LaunchRunContext",
    "LoadableTargetOrigin",
    "ModuleCodePointer",
    "ModuleTarget",
    "PartitionKeyFilter",
    "QueuedRunCoordinator",
    "QueuedRunCoordinatorDaemon",
    "RemoteJobOrigin",
    "RemoteRepositoryOrigin",
    "RepositoryPythonOrigin",
    "RunFailureReason",
    "RunQueueConfig",
    "RunRecord",
    "SerializableEntitySubset",
    "SerializableErrorInfo",
    "StepFailureData",
    "StepMaterializationData",
    "SubmitRunContext",
    "TagConcurrencyLimitsCounter",
    "TickData",
    "TickStatus",
    "WorkerStatus",
    "consume_new_runs_for_automatic_reexecution",
    "create_run_for_test",
    "create_test_daemon_workspace_context",
    "dagster_instance_config",
    "ensure_workspace_config",
    "execute_backfill_iteration",
    "in_process_test_workspace",
    "instance_for_test",
    "make_new_run_id",
    "partition_loading_context",
    "process_config",
    "retry_run",
    "serialize_value",
]
