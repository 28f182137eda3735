"""`episode_metadata`: the seed's keys and the version-1 `entity_versions` row, one transaction."""

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from episode_pipeline.db.episodes import replace_metadata
from episode_pipeline.defs.partitions import episode_partitions
from episode_pipeline.defs.resources.postgres import PostgresResource
from episode_pipeline.defs.resources.storage import EpisodeStorage
from episode_pipeline.keys import parse_partition_key
from episode_pipeline.lerobot.tasks import first_task
from episode_pipeline.manifest import Manifest
from episode_pipeline.metadata import episode_metadata_items


@asset(
    partitions_def=episode_partitions,
    group_name="episode",
    kinds={"postgres"},
    description="`episode_title` (first task), `robot_type`, `codebase_version` and the editable "
    "placeholders, replacing the episode's earlier keys, plus version 1 in `entity_versions`. "
    "A failure here never changes the episode's status (seed).",
)
def episode_metadata(
    context: AssetExecutionContext,
    extracted_files: Manifest,
    storage: EpisodeStorage,
    postgres: PostgresResource,
) -> MaterializeResult:
    ref = parse_partition_key(context.partition_key)
    manifest = extracted_files
    info = manifest.dataset_info()
    title = None
    if manifest.tasks_key:
        title = first_task(storage.get_bytes(manifest.tasks_key), path=manifest.tasks_key)
    items = episode_metadata_items(
        first_task=title, robot_type=info.robot_type, codebase_version=info.codebase_version
    )
    with postgres.transaction() as conn:
        replace_metadata(conn, ref, items)
    return MaterializeResult(
        metadata={
            "keys_written": len(items),
            "episode_title": title or "(no task table)",
            "values": MetadataValue.json({item.meta_key: item.value for item in items}),
        }
    )
