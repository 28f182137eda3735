"""The episode partitions (one dynamic partition per uploaded episode, keyed `ORG/EP`), and the
decorators that put an asset or a check of the episode graph on them."""

from typing import Any

from dagster import DynamicPartitionsDefinition, asset, asset_check

EPISODES_PARTITION_NAME = "episodes"
EPISODE_GROUP = "episode"  # every asset of the graph, one group in the UI

episode_partitions = DynamicPartitionsDefinition(name=EPISODES_PARTITION_NAME)


def episode_asset(**kwargs: Any) -> Any:
    """`@asset`, partitioned by episode, in the episode group."""
    return asset(partitions_def=episode_partitions, group_name=EPISODE_GROUP, **kwargs)


def episode_check(**kwargs: Any) -> Any:
    """`@asset_check`, partitioned by episode: its result belongs to one episode."""
    return asset_check(partitions_def=episode_partitions, **kwargs)
