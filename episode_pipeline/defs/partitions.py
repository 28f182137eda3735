"""The episode partitions: one dynamic partition per uploaded episode, keyed `ORG/EP`."""

from dagster import DynamicPartitionsDefinition

from episode_pipeline.keys import EpisodeRef

EPISODES_PARTITION_NAME = "episodes"

episode_partitions = DynamicPartitionsDefinition(name=EPISODES_PARTITION_NAME)


def partition_key_for(ref: EpisodeRef) -> str:
    """The only way a partition key is built (validated by EpisodeRef)."""
    return ref.partition_key
