"""A PostgreSQL IO manager for polars DataFrames: partition-scoped atomic replace with COPY.

Dagster ships none (dagster#14080, #32700), so this one stands on its own:

- Table: asset definition metadata `"table"` (default: the asset's name) in schema `schema`
  (default `public`). The table must exist (migrations own DDL); nothing is created here.
- Partition scope: metadata `"partition_expr"` names the column holding the partition's value.
  The value comes from the partition key through `partition_value()` (episode keys `ORG/EP` →
  the episode id, unique across orgs). An unpartitioned asset is refused: a whole-table replace
  of an application's table is never what a pipeline step means.
- Optional columns: definition metadata `"optional_columns"` names frame columns written only
  when the table has them (an application's table may lack what the pipeline can fill).
- Write: in ONE transaction, the partition's rows replaced (`db/partition_tables.py`: an advisory
  lock, DELETE, COPY in text format slice by slice). A failure anywhere (a NOT NULL violation in
  the last row included) rolls back to the old rows.
- Streaming: an asset may return `RowBatches` (parts of DataFrames made one after another, e.g.
  one part per source file) instead of one DataFrame; each batch is copied as it comes, so memory
  stays flat however long the episode. Each part is copied under a savepoint: a part whose
  producer raises `SkippedRows` (an unreadable file found mid-way) leaves none of its rows.
- Load: the partition's rows (ordered by metadata `"order_by"`, a column name or a list of them),
  typed from the result's column types. json/jsonb columns come back as **text** (JSON strings,
  exactly as PostgreSQL prints them); decode with `pl.col(c).str.json_decode()` if needed.
"""

from __future__ import annotations

import time
from typing import Any

import polars as pl
from dagster import ConfigurableIOManager, InputContext, OutputContext
from pydantic import Field

from episode_pipeline.db.partition_tables import (
    RowBatches,
    qualified,
    replace_partition,
    select_partitions,
)
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.episodes.keys import parse_partition_key


class PostgresPolarsIOManager(ConfigurableIOManager):
    """Stores polars DataFrames in PostgreSQL tables, one partition's rows replaced atomically."""

    postgres: PostgresResource
    schema_: str = Field(default="public", alias="schema", description="Schema of the tables.")

    # -- partition mapping (override for other partition schemes) ------------------------------

    def partition_value(self, partition_key: str) -> Any:
        """The `partition_expr` column's value for a partition: the episode id of `ORG/EP`."""
        return parse_partition_key(partition_key).episode_id

    # -- write ---------------------------------------------------------------------------------

    def handle_output(self, context: OutputContext, obj: pl.DataFrame | RowBatches | None) -> None:
        table = self._table(context.definition_metadata, context.asset_key.path[-1])
        if not isinstance(obj, pl.DataFrame | RowBatches):
            raise TypeError(
                f"asset {context.asset_key.to_user_string()!r} returned a "
                f"{type(obj).__name__}; the PostgreSQL IO manager stores polars DataFrames "
                f"(or RowBatches of them) in {self._qualified_name(table)}"
            )
        column, values = self._scope(context, context.definition_metadata)
        if len(values) > 1:
            raise ValueError(
                f"asset {context.asset_key.to_user_string()!r}: writing "
                f"{self._qualified_name(table)} needs exactly one partition, got {len(values)}"
            )
        value = values[0]
        started = time.perf_counter()
        optional = tuple(context.definition_metadata.get("optional_columns") or ())
        rows = self.replace(table, obj, column, value, optional_columns=optional)
        seconds = time.perf_counter() - started
        produced = obj.metadata() if isinstance(obj, RowBatches) and obj.metadata else {}
        context.add_output_metadata(
            {
                **produced,
                "table": self._qualified_name(table),
                "rows_written": rows,
                "seconds": round(seconds, 3),
                "rows_per_second": round(rows / seconds, 1) if seconds > 0 else 0.0,
                "partition_value": str(value),
            }
        )

    def replace(
        self,
        table: str,
        rows: pl.DataFrame | RowBatches,
        partition_column: str,
        partition_value: Any,
        optional_columns: tuple[str, ...] = (),
    ) -> int:
        """Make `rows` the rows of one partition, in one transaction; returns the rows copied."""
        with self.postgres.transaction() as conn:
            return replace_partition(
                conn, self.schema_, table, rows, partition_column, partition_value,
                optional_columns,
            )  # fmt: skip

    # -- read ----------------------------------------------------------------------------------

    def load_input(self, context: InputContext) -> pl.DataFrame:
        upstream = context.upstream_output
        metadata = upstream.definition_metadata if upstream is not None else {}
        table = self._table(metadata, context.asset_key.path[-1])
        column, values = self._scope(context, metadata)
        return self.select(table, column, values, order_by=metadata.get("order_by"))

    def select(
        self,
        table: str,
        column: str,
        values: list[Any],
        order_by: str | list[str] | None = None,
    ) -> pl.DataFrame:
        """The partitions' rows as a DataFrame (json/jsonb as text), typed from the result."""
        with self.postgres.connect() as conn:
            return select_partitions(conn, self.schema_, table, column, values, order_by)

    # -- helpers -------------------------------------------------------------------------------

    @staticmethod
    def _table(metadata: Any, default: str) -> str:
        return str((metadata or {}).get("table") or default)

    def _qualified_name(self, table: str) -> str:
        return qualified(self.schema_, table)

    def _scope(self, context: InputContext | OutputContext, metadata: Any) -> tuple[str, list]:
        """(partition column, its values) for this context."""
        if not context.has_asset_partitions:
            raise ValueError(
                f"asset {context.asset_key.to_user_string()!r} is not partitioned: the PostgreSQL "
                "IO manager replaces one partition's rows and refuses to replace a whole table"
            )
        column = (metadata or {}).get("partition_expr")
        if not column:
            raise ValueError(
                f"asset {context.asset_key.to_user_string()!r} is partitioned but has no "
                '"partition_expr" definition metadata naming the column that holds the partition '
                "(e.g. metadata={'partition_expr': 'episode_id'})"
            )
        return str(column), [self.partition_value(key) for key in context.asset_partition_keys]
