"""Metadata a person reads in the Dagster UI: tables with a schema instead of JSON, one way,
browser links to the bucket, and the names of the entries a check reads back.

A list of dicts shown as `MetadataValue.json` hides behind "Show JSON"; a `MetadataValue.table`
renders inline as a table whose columns are named and typed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from dagster import MetadataValue, TableColumn, TableRecord, TableSchema

from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.storage.links import BucketLinks

Cell = str | int | float | bool | None

# Entries of the `frames` materialization that the frames_state_present check reads.
STATE_FEATURE_METADATA = "state_feature"
FILES_WITHOUT_STATE_METADATA = "files_without_state"
# Entry of the `frames` materialization that video_frames_in_sync reads: per LeRobot episode,
# rows and timestamp spacing (lerobot/sync.py).
EPISODE_TIMING_METADATA = "lerobot_episode_timing"


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
