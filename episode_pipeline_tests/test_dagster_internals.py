"""Every private Dagster name the package imports (`from dagster._…`), listed, and all of them
behind one door: the instance's plugins (`instance/`, subclasses of Dagster's storages, run
coordinator and launcher) import theirs, every other module through `dagster_compat.py`. A
Dagster upgrade re-checks that file and `instance/`; a new private import fails here until it
is listed. The tests take theirs through one door of their own,
`episode_pipeline_tests/support/dagster_internals.py`."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "episode_pipeline"
DOOR = "dagster_compat.py"
PLUGINS = "instance/"
TESTS = Path(__file__).resolve().parent
TESTS_DOOR = "support/dagster_internals.py"

LISTED: dict[str, set[str]] = {
    "dagster_compat.py": {
        "dagster._core.definitions.data_version.DATA_VERSION_TAG",
        "dagster._core.definitions.data_version.get_input_data_version_tag",
        "dagster._core.definitions.data_version.get_input_event_pointer_tag",
        "dagster._core.definitions.external_asset.create_external_asset_from_source_asset",
        "dagster._core.definitions.repository_definition.SINGLETON_REPOSITORY_NAME",
        "dagster._core.definitions.selector.InstigatorSelector",
        "dagster._core.execution.backfill.BULK_ACTION_TERMINAL_STATUSES",
        "dagster._core.execution.backfill.BulkActionStatus",
        "dagster._core.execution.backfill.BulkActionsFilter",
        "dagster._core.execution.backfill.PartitionBackfill",
        "dagster._core.remote_origin.InProcessCodeLocationOrigin",
        "dagster._core.remote_origin.RemotePartitionSetOrigin",
        "dagster._core.remote_origin.RemoteRepositoryOrigin",
        "dagster._core.remote_representation.external_data.partition_set_snap_name_for_job_name",
        "dagster._core.scheduler.instigation.TickStatus",
        "dagster._core.storage.asset_check_execution_record.AssetCheckExecutionRecord",
        "dagster._core.storage.asset_check_execution_record.AssetCheckExecutionRecordStatus",
        "dagster._core.storage.event_log.schema.AssetCheckExecutionsTable",
        "dagster._core.storage.tags.AUTO_RETRY_RUN_ID_TAG",
        "dagster._core.storage.tags.PARENT_RUN_ID_TAG",
        "dagster._core.storage.tags.PARTITION_NAME_TAG",
        "dagster._core.storage.tags.PRIORITY_TAG",
        "dagster._core.storage.tags.WILL_RETRY_TAG",
        "dagster._core.types.loadable_target_origin.LoadableTargetOrigin",
        "dagster._utils.error.SerializableErrorInfo",
    },
    "instance/event_log_storage.py": {
        "dagster._core.asset_graph_view.serializable_entity_subset.SerializableEntitySubset",
        "dagster._core.definitions.asset_key.AssetCheckKey",
        "dagster._core.definitions.partitions.subset.default.DefaultPartitionsSubset",
        "dagster._core.definitions.partitions.utils.base.generate_partition_key_based_definition_id",
        "dagster._core.events.log.EventLogEntry",
        "dagster._core.storage.asset_check_execution_record.AssetCheckExecutionRecordStatus",
        "dagster._core.storage.asset_check_execution_record.AssetCheckExecutionResolvedStatus",
        "dagster._core.storage.asset_check_execution_record.AssetCheckPartitionInfo",
        "dagster._core.storage.asset_check_state.AssetCheckState",
        "dagster._core.storage.asset_check_state._process_run_statuses",
        "dagster._core.storage.dagster_run.FINISHED_STATUSES",
        "dagster._core.storage.dagster_run.RunsFilter",
        "dagster._core.storage.event_log.base.AssetRecord",
        "dagster._core.storage.event_log.schema.DynamicPartitionsTable",
        "dagster._core.storage.event_log.schema.SqlEventLogStorageTable",
        "dagster._core.storage.partition_status_cache.AssetStatusCacheValue",
        "dagster._record.copy",
        "dagster._serdes.ConfigurableClassData",
        "dagster._serdes.deserialize_value",
    },
    "instance/run_coordinator.py": {
        "dagster._core.run_coordinator.QueuedRunCoordinator",
        "dagster._core.run_coordinator.SubmitRunContext",
        "dagster._core.run_coordinator.queued_run_coordinator.RunQueueConfig",
        "dagster._core.storage.dagster_run.ACTIVE_RUN_STATUSES",
    },
    "instance/run_launcher.py": {
        "dagster._core.launcher.DefaultRunLauncher",
        "dagster._core.launcher.base.CheckRunHealthResult",
        "dagster._core.launcher.base.WorkerStatus",
    },
    "instance/run_tags.py": {
        "dagster._core.storage.tags.PARTITION_NAME_TAG",
    },
    "instance/storage.py": {
        "dagster._serdes.ConfigurableClassData",
    },
}


def private_imports(root: Path = PACKAGE) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dagster._"):
                names = {f"{node.module}.{alias.name}" for alias in node.names}
                found.setdefault(str(path.relative_to(root)), set()).update(names)
    return found


def test_every_private_dagster_import_is_listed() -> None:
    found = private_imports()
    unlisted = {
        f: sorted(n - LISTED.get(f, set())) for f, n in found.items() if n - LISTED.get(f, set())
    }
    stale = {
        f: sorted(n - found.get(f, set())) for f, n in LISTED.items() if n - found.get(f, set())
    }
    assert not unlisted, f"private Dagster imports not listed here: {unlisted}"
    assert not stale, f"listed here but no longer imported: {stale}"


def test_private_dagster_imports_are_only_in_the_plugins_and_the_compatibility_module() -> None:
    outside = {
        module: sorted(names)
        for module, names in private_imports().items()
        if module != DOOR and not module.startswith(PLUGINS)
    }
    assert not outside, f"private Dagster imports outside {PLUGINS} and {DOOR}: {outside}"


def test_the_tests_take_dagster_internals_through_their_door() -> None:
    found = private_imports(TESTS)
    assert set(found) == {TESTS_DOOR}, (
        f"private Dagster imports outside {TESTS_DOOR}: "
        f"{ {module: sorted(names) for module, names in found.items() if module != TESTS_DOOR} }"
    )
