"""The episode asset graph: raw_archive → extracted_files → hls_renditions, frames, episode_metadata
→ episode."""
