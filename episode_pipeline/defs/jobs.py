"""The job every upload runs: the episode's partition of the whole graph, with its checks."""

from dagster import AssetSelection, PartitionedConfig, define_asset_job

from episode_pipeline.defs.asset_keys import (
    EPISODE_KEY,
    EPISODE_METADATA_KEY,
    EXTRACTED_FILES_KEY,
    FRAMES_KEY,
    HLS_RENDITIONS_KEY,
)
from episode_pipeline.defs.partitions import episode_partitions
from episode_pipeline.instance.run_tags import EPISODE_JOB_NAME, episode_tags

EPISODE_ASSETS = tuple(
    key.to_user_string()
    for key in (
        EXTRACTED_FILES_KEY,
        HLS_RENDITIONS_KEY,
        FRAMES_KEY,
        EPISODE_METADATA_KEY,
        EPISODE_KEY,
    )
)

episode_job = define_asset_job(
    name=EPISODE_JOB_NAME,
    selection=AssetSelection.assets(*EPISODE_ASSETS),
    description="Everything the pipeline makes of one upload, with its checks.",
    config=PartitionedConfig(
        partitions_def=episode_partitions,
        run_config_for_partition_key_fn=lambda _: {},
        tags_for_partition_key_fn=episode_tags,
    ),
)
