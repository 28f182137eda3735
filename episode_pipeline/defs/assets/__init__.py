"""The episode asset graph: raw_archive → extracted_files → hls_renditions, frames; episode
depends on extracted_files, frames and hls_renditions; episode_metadata on episode and
extracted_files. Each asset names its upstreams by key (`defs/asset_keys.py`)."""
