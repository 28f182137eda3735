"""The partitioned checks' statuses the UI reads, through our event-log storage and Dagster's.

`EpisodeEventLogStorage` (instance/event_log_storage.py) keeps each check's latest execution per
partition between queries and reads only what changed. The statuses it gives must stay the ones
Dagster's own storage computes from scratch: the same GraphQL (`partitionStatuses`, as the UI's
asset graph query asks it) is answered by both instances on one database after each change — a
passed and a failed episode, a check that crashed, an asset materialized again without its
checks, an episode pruned by retention's own statements, its partition added back. A change in
Dagster's rules (or in the private API the storage uses) makes the two differ, or the expected
statuses fail.

Real runs (`materialize`, in-process) of a small partitioned asset with two checks write the
events; the UI's GraphQL runs in-process against a workspace of those definitions.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    AssetSelection,
    DagsterInstance,
    DagsterRunStatus,
    Definitions,
    asset,
    asset_check,
    materialize,
)
from dagster_graphql.test.utils import execute_dagster_graphql

from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME, episode_partitions
from episode_pipeline.instance import event_log_storage
from episode_pipeline.instance.event_log_storage import (
    CheckPartitions,
    EpisodeEventLogStorage,
    KeySet,
    ReadStatusCaches,
    changes_of,
    status_cache_for_keys,
    status_cache_to_store,
    stored_with,
)
from episode_pipeline.local.dagster_home import POOL_SETTINGS
from episode_pipeline.local.stack import StackInfo
from episode_pipeline.orchestration.dagster_tables import delete_episodes
from episode_pipeline_tests.support.dagster_internals import (
    AssetCheckExecutionRecordStatus,
    AssetCheckExecutionResolvedStatus,
    AssetCheckPartitionInfo,
    AssetEntry,
    AssetRecord,
    AssetStatusCacheValue,
    DefaultPartitionsSubset,
    LoadableTargetOrigin,
    SerializableEntitySubset,
    in_process_test_workspace,
)
from episode_pipeline_tests.support.instances import private_instance_config

# -- the pure part --------------------------------------------------------------------------------

CHECK = AssetCheckKey(AssetKey("probe"), "rows_match")


def info(partition: str, status: str, target: int | None, latest: int | None) -> Any:
    return AssetCheckPartitionInfo(
        check_key=CHECK,
        partition_key=partition,
        latest_execution_status=AssetCheckExecutionRecordStatus(status),
        latest_target_materialization_storage_id=target,
        latest_planned_run_id=f"run-{partition}",
        latest_check_event_storage_id=10,
        latest_materialization_storage_id=latest,
    )


def test_a_partitions_status_is_its_latest_current_execution() -> None:
    kept = CheckPartitions(EPISODES_PARTITION_NAME)
    ids = {"a": 1, "b": 2, "c": 3, "d": 4}
    kept.replace(
        None,
        [
            info("a", "SUCCEEDED", 5, 5),
            info("b", "FAILED", 6, 6),
            info("c", "SUCCEEDED", 5, 9),  # the asset was materialized again since
            info("d", "PLANNED", None, 7),
            info("gone", "SUCCEEDED", 5, 5),  # no such partition
        ],
        ids,
    )
    assert kept.status == {
        "a": AssetCheckExecutionRecordStatus.SUCCEEDED,
        "b": AssetCheckExecutionRecordStatus.FAILED,
        "d": AssetCheckExecutionRecordStatus.PLANNED,
    }
    assert kept.planned_run == {"d": "run-d"}
    kept.replace(["a"], [], ids)  # re-read and found nothing: forgotten
    kept.keep_existing({"b": 2, "d": 40})  # d deleted and added again: a new row id
    assert kept.status == {"b": AssetCheckExecutionRecordStatus.FAILED}
    state = kept.state(CHECK, episode_partitions, {}, 10)
    failed = state.subsets[AssetCheckExecutionResolvedStatus.FAILED]
    assert isinstance(failed, SerializableEntitySubset)
    assert set(failed.subset_value.get_partition_keys()) == {"b"}
    assert not state.in_progress_runs
    assert kept.state(CHECK, episode_partitions, {}, 10) is state  # nothing changed since


class CountingIds(dict[str, int]):
    """A key set that counts its look-ups: how often a check compared its partitions to it."""

    lookups = 0

    def get(self, key: str, default: Any = None) -> Any:
        CountingIds.lookups += 1
        return super().get(key, default)


def test_a_check_compares_its_partitions_once_per_key_set() -> None:
    kept = CheckPartitions(EPISODES_PARTITION_NAME)
    ids = CountingIds({"a": 1, "b": 2})
    kept.replace(None, [info("a", "SUCCEEDED", 5, 5), info("b", "FAILED", 5, 5)], ids)
    CountingIds.lookups = 0
    kept.keep_existing(ids)
    kept.keep_existing(ids)  # the same key set again: nothing to compare
    assert CountingIds.lookups == 2
    pruned = CountingIds({"b": 2})
    kept.keep_existing(pruned)  # a new key set is compared, and a pruned partition forgotten
    assert set(kept.status) == {"b"}


def test_a_status_cache_is_made_again_only_when_it_or_the_keys_changed() -> None:
    def record(materialized: str) -> AssetRecord:
        stored = AssetStatusCacheValue(
            latest_storage_id=40,
            partitions_def_id="episode_pipeline/dynamic-partitions:episodes:4",
            serialized_materialized_partition_subset=materialized,
            serialized_failed_partition_subset=subset(),
            serialized_in_progress_partition_subset=subset(),
            earliest_in_progress_materialization_event_id=None,
        )
        entry = AssetEntry(asset_key=AssetKey("probe"), cached_status=stored)
        return AssetRecord(storage_id=1, asset_entry=entry)

    caches = ReadStatusCaches()
    keys = {"episodes": KeySet("hash-1", {"a": 1, "b": 2})}
    first = caches.record(record(subset("a", "b")), keys).asset_entry.cached_status
    again = caches.record(record(subset("a", "b")), keys).asset_entry.cached_status
    assert again is first  # read again from the database, equal: not made again
    assert first is not None
    assert first.partitions_def_id == "hash-1"
    pruned = {"episodes": KeySet("hash-2", {"b": 2})}
    after = caches.record(record(subset("a", "b")), pruned).asset_entry.cached_status
    assert after is not None
    assert after.serialized_materialized_partition_subset == subset("b")
    updated = caches.record(record(subset("b")), pruned).asset_entry.cached_status
    assert updated is not after


def test_a_planned_check_whose_run_ended_is_execution_failed() -> None:
    kept = CheckPartitions(EPISODES_PARTITION_NAME)
    kept.replace(None, [info("a", "PLANNED", None, 7)], {"a": 1})
    running = kept.state(CHECK, episode_partitions, {}, 10)
    assert set(running.in_progress_runs) == {"run-a"}
    ended = kept.state(CHECK, episode_partitions, {"run-a": DagsterRunStatus.FAILURE}, 10)
    failed = ended.subsets[AssetCheckExecutionResolvedStatus.EXECUTION_FAILED]
    assert set(failed.subset_value.get_partition_keys()) == {"a"}
    assert not ended.in_progress_runs


def test_changes_name_the_partitions_events_touched() -> None:
    changes = changes_of(
        [
            ("ASSET_MATERIALIZATION", '["probe"]', "org/ep-1", ""),
            ("ASSET_MATERIALIZATION", '["other"]', None, ""),  # unpartitioned: all of "other"
        ]
    )
    assert changes.of(CHECK) == {"org/ep-1"}
    assert changes.of(AssetCheckKey(AssetKey("other"), "x")) is None
    changes.reload_all = True
    assert changes.of(CHECK) is None


def subset(*keys: str) -> str:
    return DefaultPartitionsSubset(set(keys)).serialize()


def test_a_status_cache_is_stored_by_name_and_read_within_todays_keys() -> None:
    built = AssetStatusCacheValue(
        latest_storage_id=40,
        partitions_def_id="hash-of-a-b-c",
        serialized_materialized_partition_subset=subset("a", "b", "c"),
        serialized_failed_partition_subset=subset("d"),
        serialized_in_progress_partition_subset=subset(),
        earliest_in_progress_materialization_event_id=None,
    )
    built_for = KeySet("hash-of-a-b-c", {"a": 1, "b": 2, "c": 3, "d": 4})
    stored = status_cache_to_store(built, {"batches": KeySet("x", {}), "episodes": built_for})
    assert stored_with(stored) == ("episodes", 4)
    assert (
        stored.serialized_materialized_partition_subset
        == built.serialized_materialized_partition_subset
    )
    # built for a key set that has changed since (or a static definition): stored as it is
    assert status_cache_to_store(built, {"episodes": KeySet("hash-of-a-b", {})}) == built
    assert stored_with(built) is None

    # a pruned; c pruned and added again (a new row id); e new
    now = KeySet("hash-of-b-d-c-e", {"b": 2, "d": 4, "c": 7, "e": 8})
    read = status_cache_for_keys(stored, 4, now)
    assert read.partitions_def_id == "hash-of-b-d-c-e"
    assert read.serialized_materialized_partition_subset == subset("b")
    assert read.serialized_failed_partition_subset == subset("d")
    assert read.latest_storage_id == 40  # Dagster goes on from its cursor


# -- on the real storage, through the UI's GraphQL ------------------------------------------------


@asset(partitions_def=episode_partitions)
def probe(context: AssetExecutionContext) -> None:
    context.log.info(f"probe {context.partition_key}")


@asset_check(asset=probe, partitions_def=episode_partitions)
def always_passes(context: AssetCheckExecutionContext) -> AssetCheckResult:
    return AssetCheckResult(passed=True)


@asset_check(asset=probe, partitions_def=episode_partitions)
def fails_on_bad(context: AssetCheckExecutionContext) -> AssetCheckResult:
    """Fails for an episode named `…bad…`, crashes for one named `…crash…`."""
    if "crash" in context.partition_key:
        raise RuntimeError("the check itself broke")
    passed = "bad" not in context.partition_key
    return AssetCheckResult(passed=passed, severity=AssetCheckSeverity.ERROR)


check_defs = Definitions(assets=[probe], asset_checks=[always_passes, fails_on_bad])


@asset(partitions_def=episode_partitions)
def health_probe(context: AssetExecutionContext) -> None:
    """Fails for an episode named `…bad…`."""
    if "bad" in context.partition_key:
        raise RuntimeError("a bad episode")


health_defs = Definitions(assets=[health_probe])

STATUSES = """
query CheckStatuses($assetKeys: [AssetKeyInput!]!) {
  assetNodes(assetKeys: $assetKeys) {
    assetChecksOrError {
      ... on AssetChecks {
        checks {
          name
          partitionStatuses {
            __typename
            ... on AssetCheckDefaultPartitionStatuses {
              succeededPartitions
              failedPartitions
              inProgressPartitions
              skippedPartitions
              executionFailedPartitions
            }
          }
        }
      }
    }
  }
}
"""
FIELDS = {
    "succeededPartitions": "succeeded",
    "failedPartitions": "failed",
    "inProgressPartitions": "in progress",
    "skippedPartitions": "skipped",
    "executionFailedPartitions": "execution failed",
}


@pytest.fixture(scope="module")
def instances(
    stack: StackInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[DagsterInstance, DagsterInstance]]:
    """Ours and Dagster's own event-log storage on one private database."""
    config = private_instance_config(stack, "check_states")
    homes = []
    for name, storage in (
        ("ours", None),
        ("dagsters", ("dagster_postgres.event_log", "PostgresEventLogStorage")),
    ):
        home = tmp_path_factory.mktemp(f"check-states-{name}")
        if storage:
            module, cls = storage
            connection = config["event_log_storage"]["config"]
            unpooled = {k: v for k, v in connection.items() if k not in POOL_SETTINGS}
            config = {
                **config,
                "event_log_storage": {"module": module, "class": cls, "config": unpooled},
            }
        (home / "dagster.yaml").write_text(yaml.safe_dump(config))
        homes.append(home)
    with (
        DagsterInstance.from_config(str(homes[0])) as ours,
        DagsterInstance.from_config(str(homes[1])) as dagsters,
    ):
        assert isinstance(ours.event_log_storage, EpisodeEventLogStorage)
        assert type(dagsters.event_log_storage).__name__ == "PostgresEventLogStorage"
        yield ours, dagsters


def statuses(instance: DagsterInstance) -> dict[str, dict[str, list[str]]]:
    """check → status → episodes, as the UI's asset graph query returns them."""
    origin = LoadableTargetOrigin(python_file=str(Path(__file__)), attribute="check_defs")
    with in_process_test_workspace(instance, origin) as context, context:  # as a request is
        result = execute_dagster_graphql(context, STATUSES, {"assetKeys": [{"path": ["probe"]}]})
    (node,) = result.data["assetNodes"]
    found = {}
    for check in node["assetChecksOrError"]["checks"]:
        by_status = check["partitionStatuses"]
        assert by_status["__typename"] == "AssetCheckDefaultPartitionStatuses"
        found[check["name"]] = {
            FIELDS[name]: sorted(keys)
            for name, keys in by_status.items()
            if name in FIELDS and keys
        }
    return found


def agreed(instances: tuple[DagsterInstance, DagsterInstance]) -> dict[str, dict[str, list[str]]]:
    ours, dagsters = instances
    health(ours, "probe", "check_defs")  # as the asset page: its cache is stored, then read
    found = statuses(ours)
    assert found == statuses(dagsters)
    return found


def run(instance: DagsterInstance, episode: str, checks: bool = True) -> None:
    selection = AssetSelection.assets(probe)
    materialize(
        [probe, always_passes, fails_on_bad],
        instance=instance,
        partition_key=episode,
        selection=selection if checks else selection.without_checks(),
        raise_on_error=False,
    )


def test_statuses_match_dagsters_through_every_change(
    instances, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, _ = instances
    good, bad, crash = "org/ep-good", "org/ep-bad", "org/ep-crash"
    ours.add_dynamic_partitions(EPISODES_PARTITION_NAME, [good, bad, crash])
    assert agreed(instances) == {"always_passes": {}, "fails_on_bad": {}}

    run(ours, good)
    run(ours, bad)
    assert agreed(instances) == {
        "always_passes": {"succeeded": [bad, good]},
        "fails_on_bad": {"succeeded": [good], "failed": [bad]},
    }  # the first read (everything), then each later one reads what changed

    run(ours, crash)  # the check's step fails: its run ends without a result for it
    only_one = [(AssetCheckKey(AssetKey("probe"), "always_passes"), episode_partitions)]
    ours.event_log_storage.get_asset_check_state(only_one)  # the other check waits its turn
    assert agreed(instances)["fails_on_bad"] == {
        "succeeded": [good],
        "failed": [bad],
        "execution failed": [crash],
    }

    run(ours, good, checks=False)  # a new materialization: the old results no longer hold
    assert agreed(instances)["always_passes"] == {"succeeded": [bad, crash]}
    run(ours, good)
    with monkeypatch.context() as burst:  # as after many new events: every check read whole
        burst.setattr(event_log_storage, "READ_WHOLE_ABOVE_EVENTS", 0)
        assert agreed(instances)["always_passes"] == {"succeeded": [bad, crash, good]}

    with ours.run_storage.connect() as conn:  # type: ignore[attr-defined]
        delete_episodes(conn, [bad])  # retention's own statements
    pruned = agreed(instances)
    assert bad not in str(pruned)
    assert pruned["fails_on_bad"] == {"succeeded": [good], "execution failed": [crash]}

    ours.add_dynamic_partitions(EPISODES_PARTITION_NAME, [bad])  # reprocess brings it back
    assert bad not in str(agreed(instances))
    run(ours, bad)
    assert agreed(instances)["fails_on_bad"]["failed"] == [bad]


HEALTH = """
query Health($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    ... on AssetNode {
      assetPartitionStatuses {
        __typename
        ... on DefaultPartitionStatuses {
          materializedPartitions
          failedPartitions
          materializingPartitions
          unmaterializedPartitions
        }
      }
    }
  }
}
"""


def health(
    instance: DagsterInstance, asset_name: str = "health_probe", defs: str = "health_defs"
) -> dict[str, list[str]]:
    """The asset's health bar (its partitions by status), as the asset page asks for it."""
    origin = LoadableTargetOrigin(python_file=str(Path(__file__)), attribute=defs)
    with in_process_test_workspace(instance, origin) as context, context:
        result = execute_dagster_graphql(context, HEALTH, {"assetKey": {"path": [asset_name]}})
    by_status = result.data["assetNodeOrError"]["assetPartitionStatuses"]
    assert by_status["__typename"] == "DefaultPartitionStatuses"
    return {
        name.removesuffix("Partitions"): sorted(k for k in keys if k.startswith("health/"))
        for name, keys in by_status.items()
        if name.endswith("Partitions")
    }


def test_the_health_bar_survives_a_changed_key_set_without_a_rebuild(
    instances, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dagster rebuilds an asset's partition status cache from all its events when the key set
    changes; ours goes on from the cache's cursor. Each answer is the one Dagster's storage
    rebuilds from scratch (told not to store its cache, which ours would then read)."""
    ours, dagsters = instances
    monkeypatch.setattr(dagsters.event_log_storage, "can_write_asset_status_cache", lambda: False)
    good, bad, later = "health/ep-good", "health/ep-bad", "health/ep-later"
    ours.add_dynamic_partitions(EPISODES_PARTITION_NAME, [good, bad])
    for episode in (good, bad):
        materialize([health_probe], instance=ours, partition_key=episode, raise_on_error=False)
    first = health(ours)  # a failed partition is unmaterialized too, as Dagster counts it
    assert first == {
        "materialized": [good],
        "failed": [bad],
        "materializing": [],
        "unmaterialized": [bad],
    }
    assert first == health(dagsters)

    rebuilds = []
    storage = ours.event_log_storage
    whole = storage.get_materialized_partitions

    def counted(asset_key, before_cursor=None, after_cursor=None):  # type: ignore[no-untyped-def]
        if after_cursor is None:
            rebuilds.append(asset_key)
        return whole(asset_key, before_cursor=before_cursor, after_cursor=after_cursor)

    monkeypatch.setattr(storage, "get_materialized_partitions", counted)
    ours.add_dynamic_partitions(EPISODES_PARTITION_NAME, [later])  # a new upload
    added = health(ours)
    assert not rebuilds, "a new partition rebuilt the cache from every event"
    assert added == {**first, "unmaterialized": [bad, later]} == health(dagsters)

    with ours.run_storage.connect() as conn:  # type: ignore[attr-defined]
        delete_episodes(conn, [good])  # retention's own statements
    # a campaign brings it back before anyone looked: a new row id, so the cache drops it
    ours.add_dynamic_partitions(EPISODES_PARTITION_NAME, [good])
    returned = health(ours)
    assert not rebuilds
    assert returned == {**added, "materialized": [], "unmaterialized": [bad, good, later]}
    assert returned == health(dagsters)
    materialize([health_probe], instance=ours, partition_key=good)
    assert health(ours)["materialized"] == [good] == health(dagsters)["materialized"]
