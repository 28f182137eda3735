"""A PostgreSQL IO manager for polars DataFrames: partition-scoped atomic replace with COPY.

Dagster ships none (dagster#14080, #32700), so this one stands on its own:

- What an asset declares: a `PartitionTable` (`db/partition_tables.py`) in its definition
  metadata (`metadata=PartitionTable(...).as_metadata()`): the table (default: the asset's
  name) in schema `schema` (default `public`), the column holding the partition's value, the
  load order, and the optional columns, written only when the table has them. The table must
  exist (migrations own DDL); nothing is created here.
- Partition scope: the partition column's value comes from the partition key through
  `partition_value()` (episode keys `ORG/EP` → the episode id, unique across orgs). An
  unpartitioned asset is refused: a whole-table replace of an application's table is never
  what a pipeline step means.
- Write: in ONE transaction, the partition's rows replaced (`db/partition_tables.py`: an advisory
  lock, DELETE, COPY in text format slice by slice). A failure anywhere (a NOT NULL violation in
  the last row included) rolls back to the old rows.
- Streaming: an asset may return `RowBatches` (parts of DataFrames made one after another, e.g.
  one part per source file) instead of one DataFrame; each batch is copied as it comes, so memory
  stays flat however long the episode. Each part is copied under a savepoint: a part whose
  producer raises `SkippedRows` (an unreadable file found mid-way) leaves none of its rows.
- Load: the partition's rows (in the declaration's `order_by`, a column or several), typed
  from the result's column types. json/jsonb columns come back as **text** (JSON strings,
  exactly as PostgreSQL prints them); decode with `pl.col(c).str.json_decode()` if needed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl
from dagster import ConfigurableIOManager, InputContext, OutputContext
from pydantic import Field

from episode_pipeline.db.partition_tables import (
    PartitionTable,
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
        declared, values = self._scope(context, context.definition_metadata)
        table = declared.table
        if not isinstance(obj, pl.DataFrame | RowBatches):
            raise TypeError(
                f"asset {context.asset_key.to_user_string()!r} returned a "
                f"{type(obj).__name__}; the PostgreSQL IO manager stores polars DataFrames "
                f"(or RowBatches of them) in {self._qualified_name(table)}"
            )
        if len(values) > 1:
            raise ValueError(
                f"asset {context.asset_key.to_user_string()!r}: writing "
                f"{self._qualified_name(table)} needs exactly one partition, got {len(values)}"
            )
        value = values[0]
        started = time.perf_counter()
        rows = self.replace(table, obj, declared.partition_column, value, declared.optional_columns)
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
        declared, values = self._scope(context, metadata)
        return self.select(
            declared.table, declared.partition_column, values, order_by=declared.order_by
        )

    def select(
        self,
        table: str,
        column: str,
        values: list[Any],
        order_by: str | Sequence[str] | None = None,
    ) -> pl.DataFrame:
        """The partitions' rows as a DataFrame (json/jsonb as text), typed from the result."""
        with self.postgres.connect() as conn:
            return select_partitions(conn, self.schema_, table, column, values, order_by)

    # -- helpers -------------------------------------------------------------------------------

    def _qualified_name(self, table: str) -> str:
        return qualified(self.schema_, table)

    def _scope(
        self, context: InputContext | OutputContext, metadata: Mapping[str, Any] | None
    ) -> tuple[PartitionTable, list]:
        """(the asset's declared table, its partition column's values) for this context."""
        if not context.has_asset_partitions:
            raise ValueError(
                f"asset {context.asset_key.to_user_string()!r} is not partitioned: the PostgreSQL "
                "IO manager replaces one partition's rows and refuses to replace a whole table"
            )
        declared = PartitionTable.from_metadata(metadata, context.asset_key.path)
        return declared, [self.partition_value(key) for key in context.asset_partition_keys]
