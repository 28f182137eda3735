"""The job every upload runs: the episode's partition of the whole graph, with its checks."""

from dagster import AssetSelection, define_asset_job

EPISODE_JOB_NAME = "process_episode"
EPISODE_ASSETS = ("extracted_files", "hls_renditions", "frames", "episode_metadata", "episode")

episode_job = define_asset_job(
    name=EPISODE_JOB_NAME,
    selection=AssetSelection.assets(*EPISODE_ASSETS),
    description="Everything the pipeline makes of one upload, with its checks.",
)
