"""Metadata a person reads in the Dagster UI: tables with a schema instead of JSON, one way,
browser links to the bucket, the names of the entries a check reads back, and where an asset's
metadata is stored.

A list of dicts shown as `MetadataValue.json` hides behind "Show JSON"; a `MetadataValue.table`
renders inline as a table whose columns are named and typed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dagster import (
    AssetExecutionContext,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
)

from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.storage.links import BucketLinks

Cell = str | int | float | bool | None

# Entries of the `frames` materialization that the frames_state_present check reads.
STATE_FEATURE_METADATA = "state_feature"
FILES_WITHOUT_STATE_METADATA = "files_without_state"
# Entry of the `frames` materialization that video_frames_in_sync reads: per LeRobot episode,
# rows and timestamp spacing (lerobot/sync.py).
EPISODE_TIMING_METADATA = "lerobot_episode_timing"


def on_materialization(context: AssetExecutionContext, metadata: Mapping[str, Any]) -> None:
    """Record the asset's metadata on its materialization alone. Metadata given with the step's
    output (`Output(metadata=)`, `MaterializeResult(metadata=)`) is stored twice: in the run's
    `STEP_OUTPUT` event too, which the UI shows no more of than the materialization."""
    context.add_asset_metadata(metadata)


def materialized(context: AssetExecutionContext, metadata: Mapping[str, Any]) -> MaterializeResult:
    """The step's result, its metadata on the materialization alone (`on_materialization`)."""
    on_materialization(context, metadata)
    return MaterializeResult()


def bucket_links(s3: S3BucketResource) -> BucketLinks:
    """Browser links for the metadata: the local endpoint, else the S3 console."""
    return BucketLinks(s3.bucket, s3.region, s3.endpoint_url, client=s3.get_client().client)


def table_schema(columns: Sequence[tuple[str, str, str]]) -> TableSchema:
    """A schema from (name, type, description) triples."""
    return TableSchema(
        columns=[TableColumn(name, type_, description) for name, type_, description in columns]
    )


def table(
    columns: Sequence[tuple[str, str, str]], rows: Iterable[Mapping[str, Cell]]
) -> MetadataValue:
    """A table of `rows` (dicts keyed by column name; a missing cell is empty)."""
    schema = table_schema(columns)
    names = [column.name for column in schema.columns]
    return MetadataValue.table(
        records=[TableRecord({name: row.get(name) for name in names}) for row in rows],
        schema=schema,
    )
