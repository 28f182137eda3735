"""The episode graph's asset keys, named once: assets declare `deps`, checks their targets and
inputs, sensors and failures their selections by these keys, so no module imports another asset's
definition to name it."""

from dagster import AssetKey

RAW_ARCHIVE_KEY = AssetKey("raw_archive")
EXTRACTED_FILES_KEY = AssetKey("extracted_files")
HLS_RENDITIONS_KEY = AssetKey("hls_renditions")
FRAMES_KEY = AssetKey("frames")
EPISODE_KEY = AssetKey("episode")
EPISODE_METADATA_KEY = AssetKey("episode_metadata")
