"""The job every upload runs: the episode's partition of the whole graph, with its checks."""

from dagster import AssetSelection, PartitionedConfig, define_asset_job

from episode_pipeline.defs.partitions import episode_partitions
from episode_pipeline.defs.runs import episode_tags

EPISODE_JOB_NAME = "process_episode"
EPISODE_ASSETS = ("extracted_files", "hls_renditions", "frames", "episode_metadata", "episode")

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
