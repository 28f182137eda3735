"""`episode_metadata`: the contract's keys and version 1 in `entity_versions`, one transaction."""

from dagster import AssetExecutionContext, MaterializeResult

from episode_pipeline.db.episodes import replace_metadata
from episode_pipeline.defs.asset_keys import EPISODE_KEY
from episode_pipeline.defs.metadata import materialized, table, table_schema
from episode_pipeline.defs.partitions import SERVING, episode_asset
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.episodes.episode_rows import metadata_items
from episode_pipeline.episodes.extracted_files import ExtractedFiles
from episode_pipeline.episodes.keys import parse_partition_key

VALUES_COLUMNS = [
    ("meta_key", "text", "The key the application reads"),
    ("value", "text", "Its value (empty: NULL)"),
    ("status", "text", "editable or non_editable"),
]


@episode_asset(
    deps=[EPISODE_KEY],
    kinds={"postgres"},
    tags=SERVING,
    # Bump when the same upload gives other keys or values (episodes/episode_rows.py,
    # lerobot/tasks.py).
    code_version="1",
    metadata={
        "dagster/table_name": "public.episode_metadata",
        "dagster/column_schema": table_schema(VALUES_COLUMNS),
    },
    description="The episode's rows in `episode_metadata`, with version 1 in `entity_versions`: "
    "`episode_title` (first task), `robot_type`, `codebase_version` and the editable "
    "placeholders, replacing the keys the pipeline wrote before. Written after the episode is "
    "processed; a failure here is recorded (log, `error` "
    "metadata, the failed `metadata_keys_present` check) and never fails the run or changes "
    "the episode's status.",
)
def episode_metadata(
    context: AssetExecutionContext,
    extracted_files: ExtractedFiles,
    s3: S3BucketResource,
    postgres: PostgresResource,
) -> MaterializeResult:
    # docs/contract.md#failure-semantics: any failure here is recorded, never raised.
    try:
        ref = parse_partition_key(context.partition_key)
        title, items = metadata_items(extracted_files, s3.get_client())
        # The keys and version 1 in one transaction.
        with postgres.transaction() as conn:
            replace_metadata(conn, postgres.database_schema(), ref, items)
    except Exception as error:
        message = f"{type(error).__name__}: {error}"
        context.log.error(f"episode {context.partition_key}: metadata not written: {message}")
        return materialized(context, {"keys_written": 0, "error": message})
    return materialized(
        context,
        {
            "keys_written": len(items),
            "episode_title": title or "(no task table)",
            "values": table(
                VALUES_COLUMNS,
                (
                    {"meta_key": item.meta_key, "value": item.value, "status": item.status}
                    for item in items
                ),
            ),
            "dagster/row_count": len(items),
        },
    )
