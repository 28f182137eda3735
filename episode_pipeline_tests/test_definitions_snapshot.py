"""The whole graph as text, compared with a committed snapshot, so every review sees a change to it.

Assets (deps, code version, group, kinds, owners, partitions), checks (target, severity,
blocking, the step that runs them), sensors (kind, interval, default status) and the job's
selection. After an intended change:

    EPISODE_PIPELINE_UPDATE_SNAPSHOT=1 .venv/bin/pytest -k definitions_match_their_snapshot
"""

from __future__ import annotations

import os
from pathlib import Path

from dagster import Definitions

from episode_pipeline.config.settings import Settings
from episode_pipeline.definitions import build_definitions

SNAPSHOT = Path(__file__).parent / "snapshots" / "definitions.txt"
UPDATE_ENV = "EPISODE_PIPELINE_UPDATE_SNAPSHOT"


def describe(defs: Definitions) -> str:
    graph = defs.resolve_asset_graph()
    lines = ["# assets"]
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = graph.get(key)
        partitions = getattr(node.partitions_def, "name", None) or node.partitions_def
        lines.append(
            f"{key.to_user_string()}: deps={sorted(p.to_user_string() for p in node.parent_keys)} "
            f"code_version={node.code_version} group={node.group_name} "
            f"kinds={sorted(node.kinds)} owners={sorted(node.owners)} partitions={partitions} "
            f"{'observable' if node.is_observable else 'materializable'}"
        )
    lines.append("# checks")
    for key in sorted(graph.asset_check_keys, key=lambda k: (k.asset_key.to_user_string(), k.name)):
        node = graph.get(key)
        severity = node.metadata.get("severity")
        severity = getattr(severity, "value", severity) or "-"
        lines.append(
            f"{key.asset_key.to_user_string()}.{key.name}: severity={severity} "
            f"blocking={node.blocking} step={graph.assets_def_for_key(key).node_def.name}"
        )
    repository = defs.get_repository_def()
    lines.append("# sensors")
    for sensor in sorted(repository.sensor_defs, key=lambda s: s.name):
        lines.append(
            f"{sensor.name}: {sensor.sensor_type.value} every={sensor.minimum_interval_seconds}s "
            f"default={sensor.default_status.value}"
        )
    lines.append("# jobs")
    for job in sorted(repository.get_all_jobs(), key=lambda j: j.name):
        if job.name.startswith("__"):
            continue
        selection = sorted(k.to_user_string() for k in job.asset_layer.selected_asset_keys)
        lines.append(f"{job.name}: assets={selection}")
    return "\n".join(lines) + "\n"


def test_the_definitions_match_their_snapshot(settings: Settings) -> None:
    text = describe(build_definitions(settings))
    if os.environ.get(UPDATE_ENV):
        SNAPSHOT.write_text(text)
    assert SNAPSHOT.exists(), f"no snapshot yet: run with {UPDATE_ENV}=1"
    assert text == SNAPSHOT.read_text(), (
        f"the definitions changed; if intended, rerun with {UPDATE_ENV}=1 and commit "
        f"{SNAPSHOT.relative_to(Path(__file__).parents[1])}"
    )
