"""The code versions of the episode job's assets, read in one place.

Each asset declares its `code_version` next to the modules it stands for, and the definitions
fold in the settings that change its output (`partitions.with_setting_in_code_version`: the
ladder, the presets). The episode asset records these versions with the episode
(`episode_outputs`, in the transaction that marks it processed) and `campaign plan|start` selects
the episodes recorded under other ones (from `build_definitions(settings)`'s graph): both read
them through `code_versions`.
"""

from __future__ import annotations

from typing import Any

from dagster import AssetKey

from episode_pipeline.defs.jobs import EPISODE_ASSETS


def code_versions(asset_graph: Any) -> dict[str, str]:
    """`{asset: code_version}` of the episode job's assets in this asset graph."""
    versions = {}
    for name in EPISODE_ASSETS:
        node = asset_graph.get(AssetKey(name))
        versions[name] = str(node.code_version)
    return versions
