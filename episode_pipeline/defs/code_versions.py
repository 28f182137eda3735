"""The code versions of the episode job's assets, read in one place.

Each asset declares its `code_version` next to the modules it stands for, and the definitions
fold in the settings that change its output (`partitions.with_setting_in_code_version`: the
ladder, the presets). The episode asset records these versions with the episode
(`episode_outputs`, in the transaction that marks it processed) and `campaign plan|start` selects
the episodes recorded under other ones (from `build_definitions(settings)`'s graph): both read
them through `code_versions`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dagster import AssetKey

from episode_pipeline.defs.io_managers.s3_outputs import S3_IO_MANAGER_KEY
from episode_pipeline.defs.jobs import EPISODE_ASSETS


def code_versions(asset_graph: Any) -> dict[str, str]:
    """`{asset: code_version}` of the episode job's assets in this asset graph."""
    versions = {}
    for name in EPISODE_ASSETS:
        node = asset_graph.get(AssetKey(name))
        versions[name] = str(node.code_version)
    return versions


def asset_children(asset_graph: Any) -> dict[str, set[str]]:
    """`{asset: the episode job's assets directly downstream of it}`, what a campaign's asset
    selection closes over (campaign/assets.py)."""
    names = set(EPISODE_ASSETS)
    children = {}
    for name in EPISODE_ASSETS:
        node = asset_graph.get(AssetKey(name))
        children[name] = {key.to_user_string() for key in node.child_keys} & names
    return children


def stored_in_s3(asset_graph: Any, assets: Iterable[str]) -> list[AssetKey]:
    """Those of `assets` whose output the S3 IO manager stores (under `processed/_dagster/`):
    what a run that does not materialize them loads from the bucket."""
    found = []
    for name in assets:
        key = AssetKey(name)
        node = asset_graph.get(key)
        if node.assets_def.get_io_manager_key_for_asset_key(key) == S3_IO_MANAGER_KEY:
            found.append(key)
    return found
