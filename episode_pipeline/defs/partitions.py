"""The episode partitions (one dynamic partition per uploaded episode, keyed `ORG/EP`), and the
decorator that puts an asset of the episode graph on them, in its group, with its owner (its
checks: `checks/family.py`).

Code versions: every asset declares `code_version`, and Dagster marks an episode's asset stale
when the version it was made with differs from the one deployed. The rule: **bump an asset's code
version when the same upload would give a different output** (another frame mapping, another
encoder setting, another metadata value, another file kept or skipped). Do not bump for a
refactor, a log line or a change to metadata Dagster shows: that would ask every episode to be
reprocessed for nothing. Each asset names, next to its `code_version`, the modules whose output
it stands for.
"""

from typing import Any

from dagster import AssetsDefinition, DynamicPartitionsDefinition, asset, map_asset_specs

EPISODES_PARTITION_NAME = "episodes"
EPISODE_GROUP = "robot_episodes"  # the domain: every asset of the graph, one group in the UI
EPISODE_OWNERS = ["team:episode-pipeline"]

# Asset tags, for filtering in the UI's asset catalog (`tag:layer=serving`): the raw upload,
# the staged files later steps read, and what the application serves.
LAYER_TAG = "layer"
RAW = {LAYER_TAG: "raw"}
STAGING = {LAYER_TAG: "staging"}
SERVING = {LAYER_TAG: "serving"}

episode_partitions = DynamicPartitionsDefinition(name=EPISODES_PARTITION_NAME)
# A campaign's batches (`<campaign>.w<wave>.b<n>`, defs/batches.py): the batch job's partitions.
BATCHES_PARTITION_NAME = "episode_batches"
batch_partitions = DynamicPartitionsDefinition(name=BATCHES_PARTITION_NAME)


def episode_asset(**kwargs: Any) -> Any:
    """`@asset`, partitioned by episode, in the episode group, owned by the pipeline's team."""
    return asset(
        partitions_def=episode_partitions,
        group_name=EPISODE_GROUP,
        owners=EPISODE_OWNERS,
        **kwargs,
    )


def with_setting_in_code_version(assets_def: AssetsDefinition, setting: str) -> AssetsDefinition:
    """The asset with a setting that changes its output appended to its code version.

    A setting such as the transcode preset is not code, yet the same upload gives another output
    under another value: by the rule above it is part of the code version (`1+preset=veryfast`).
    """
    (mapped,) = map_asset_specs(
        lambda spec: spec.replace_attributes(code_version=f"{spec.code_version}+{setting}"),
        [assets_def],
    )
    return mapped
