"""An IO manager that keeps asset outputs in the data bucket as JSON or parquet.

Outputs live in S3, not on a local disk, so any step in any process or container (the ECS run
launcher included) can load them. An episode's outputs sit beside its processed files:

    orgs/<org>/episodes/<ep>/processed/_dagster/<asset path>.json   (or .parquet)

and an unpartitioned asset's under `_dagster/<asset path>.json`. Each object is written with one
PUT, so a reader sees the old object or the new one, never half of either.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Mapping
from datetime import date, datetime
from enum import Enum
from pathlib import PurePath
from typing import Any

import polars as pl
from botocore.exceptions import ClientError
from dagster import (
    AssetKey,
    ConfigurableIOManager,
    InputContext,
    MetadataValue,
    OutputContext,
)

from episode_pipeline.defs.resources.storage import EpisodeStorage, _not_found
from episode_pipeline.keys import parse_partition_key

DAGSTER_DIR = "_dagster"
JSON = "json"
PARQUET = "parquet"
FORMATS = (JSON, PARQUET)


class MissingStoredOutput(LookupError):
    """An input's object is not in the bucket: the upstream asset never materialized there."""


def to_jsonable(value: Any) -> Any:
    """Plain JSON types from what assets return: dataclasses, `to_json_dict()` objects, dates..."""
    if hasattr(value, "to_json_dict"):
        return to_jsonable(value.to_json_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(item) for item in value]
    if isinstance(value, set | frozenset):
        return sorted(to_jsonable(item) for item in value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Enum):
        return to_jsonable(value.value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"cannot store a {type(value).__name__} as JSON: {value!r:.80}")


def encode(obj: Any) -> tuple[str, bytes]:
    """(format, bytes) for an output: parquet for a polars DataFrame, JSON for everything else."""
    if isinstance(obj, pl.DataFrame):
        buffer = io.BytesIO()
        obj.write_parquet(buffer, compression="zstd")
        return PARQUET, buffer.getvalue()
    text = json.dumps(to_jsonable(obj), ensure_ascii=False, sort_keys=True, indent=1)
    return JSON, text.encode("utf-8")


def decode(fmt: str, data: bytes) -> Any:
    if fmt == PARQUET:
        return pl.read_parquet(io.BytesIO(data))
    return json.loads(data)


def object_key(asset_key: AssetKey, partition_key: str | None, fmt: str) -> str:
    """Where an asset's output lives: an episode partition's beside its processed files."""
    name = "/".join(asset_key.path)
    if partition_key is None:
        return f"{DAGSTER_DIR}/{name}.{fmt}"
    return f"{parse_partition_key(partition_key).processed_prefix}{DAGSTER_DIR}/{name}.{fmt}"


def _describe(asset_key: AssetKey, partition_key: str | None) -> str:
    where = f" partition {partition_key!r}" if partition_key else ""
    return f"asset {asset_key.to_user_string()!r}{where}"


class S3IOManager(ConfigurableIOManager):
    """Asset outputs as JSON (dicts, lists, dataclasses, `to_json_dict()` objects) or parquet
    (polars DataFrames) in the data bucket.

    Loading returns the parsed JSON (dicts and lists) or a DataFrame; when the input is annotated
    with a class that has a `from_json_dict` classmethod, that class is built from the JSON. An
    asset may pin its format with definition metadata `{"format": "json" | "parquet"}`.
    """

    storage: EpisodeStorage

    def handle_output(self, context: OutputContext, obj: Any) -> None:
        if obj is None and context.dagster_type.is_nothing:
            return
        fmt, data = encode(obj)
        partition = context.asset_partition_key if context.has_asset_partitions else None
        key = object_key(context.asset_key, partition, fmt)
        self.storage.put_bytes(key, data)
        context.add_output_metadata(
            {
                "s3_uri": MetadataValue.path(self.storage.uri(key)),
                "bytes": len(data),
                "format": fmt,
            }
        )

    def load_input(self, context: InputContext) -> Any:
        if not context.has_asset_partitions:
            return self._load_one(context, None)
        keys = context.asset_partition_keys
        if len(keys) == 1:
            return self._load_one(context, keys[0])
        return {partition: self._load_one(context, partition) for partition in keys}

    def _load_one(self, context: InputContext, partition: str | None) -> Any:
        asset_key = context.asset_key
        candidates = self._formats_for(context)
        tried = []
        for fmt in candidates:
            key = object_key(asset_key, partition, fmt)
            tried.append(self.storage.uri(key))
            try:
                data = self.storage.get_bytes(key)
            except ClientError as error:
                if _not_found(error):
                    continue
                raise
            return self._build(context, decode(fmt, data))
        raise MissingStoredOutput(
            f"no stored output for {_describe(asset_key, partition)}: {' nor '.join(tried)} "
            "exists; materialize that asset (for that partition) first"
        )

    @staticmethod
    def _formats_for(context: InputContext) -> list[str]:
        upstream = context.upstream_output
        pinned = upstream.definition_metadata.get("format") if upstream is not None else None
        if pinned in FORMATS:
            return [pinned]
        if context.dagster_type.typing_type is pl.DataFrame:
            return [PARQUET]
        return [JSON, PARQUET]

    @staticmethod
    def _build(context: InputContext, value: Any) -> Any:
        wanted = context.dagster_type.typing_type
        if isinstance(value, pl.DataFrame) or not hasattr(wanted, "from_json_dict"):
            return value
        return wanted.from_json_dict(value)
