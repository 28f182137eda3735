"""`episode_metadata`: the contract's keys and version 1 in `entity_versions`, one transaction."""

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue

from episode_pipeline.db.episodes import replace_metadata
from episode_pipeline.defs.partitions import episode_asset
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.episode_rows import episode_metadata_items
from episode_pipeline.extracted_files import ExtractedFiles
from episode_pipeline.keys import parse_partition_key
from episode_pipeline.lerobot.tasks import first_task


@episode_asset(
    kinds={"postgres"},
    description="`episode_title` (first task), `robot_type`, `codebase_version` and the editable "
    "placeholders, replacing the episode's earlier keys, plus version 1 in `entity_versions`. "
    "A failure here never changes the episode's status.",
)
def episode_metadata(
    context: AssetExecutionContext,
    extracted_files: ExtractedFiles,
    s3: S3BucketResource,
    postgres: PostgresResource,
) -> MaterializeResult:
    ref = parse_partition_key(context.partition_key)
    info = extracted_files.dataset_info()
    tasks_key = extracted_files.tasks_key
    title = None
    if tasks_key:
        title = first_task(s3.get_client().get_bytes(tasks_key), path=tasks_key)
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
