"""An IO manager that keeps asset outputs in the data bucket as JSON.

Outputs live in S3, not on a local disk, so any step in any process or container (the ECS run
launcher included) can load them. An episode's outputs sit beside its processed files:

    orgs/<org>/episodes/<ep>/processed/_dagster/<asset path>.json

and an unpartitioned asset's under `_dagster/<asset path>.json`. Each object is written with one
PUT, so a reader sees the old object or the new one, never half of either.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime
from enum import Enum
from itertools import islice
from pathlib import PurePath
from typing import Any

from botocore.exceptions import ClientError
from dagster import (
    AssetKey,
    ConfigurableIOManager,
    InputContext,
    MetadataValue,
    OutputContext,
)
from pydantic import PrivateAttr

from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.episodes.keys import EpisodeRef, parse_partition_key
from episode_pipeline.storage.bucket import Bucket, MissingStoredOutput, is_not_found

DAGSTER_DIR = "_dagster"


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


def encode(obj: Any) -> bytes:
    text = json.dumps(to_jsonable(obj), ensure_ascii=False, sort_keys=True, indent=1)
    return text.encode("utf-8")


def object_key(asset_key: AssetKey, partition_key: str | None) -> str:
    """Where an asset's output lives: an episode partition's beside its processed files."""
    name = "/".join(asset_key.path)
    if partition_key is None:
        return f"{DAGSTER_DIR}/{name}.json"
    return f"{parse_partition_key(partition_key).processed_prefix}{DAGSTER_DIR}/{name}.json"


def _describe(asset_key: AssetKey, partition_key: str | None) -> str:
    where = f" partition {partition_key!r}" if partition_key else ""
    return f"asset {asset_key.to_user_string()!r}{where}"


class S3IOManager(ConfigurableIOManager):
    """Asset outputs as JSON (dicts, lists, dataclasses, `to_json_dict()` objects) in the bucket.

    Loading returns the parsed JSON; when the input is annotated with a class that has a
    `from_json_dict` classmethod, that class is built from it. One partition per load: every
    asset of the graph reads its own episode's upstream output.

    What this instance wrote is loaded back from memory: Dagster makes an instance per run (per
    step process under a multiprocess executor), and a run's steps and checks load
    `extracted_files` about ten times. An output of another run is read from the bucket.
    """

    s3: S3BucketResource
    _written: dict[str, bytes] = PrivateAttr(default_factory=dict)

    def handle_output(self, context: OutputContext, obj: Any) -> None:
        if obj is None and context.dagster_type.is_nothing:
            return
        data = encode(obj)
        partition = context.asset_partition_key if context.has_asset_partitions else None
        key = object_key(context.asset_key, partition)
        bucket = self.s3.get_client()
        bucket.put_bytes(key, data)
        self._written[key] = data
        context.add_output_metadata(
            {"s3_uri": MetadataValue.path(bucket.uri(key)), "bytes": len(data)}
        )

    def load_input(self, context: InputContext) -> Any:
        partition = context.asset_partition_key if context.has_asset_partitions else None
        key = object_key(context.asset_key, partition)
        data = self._written.get(key)
        if data is None:
            data = self._read(key, context.asset_key, partition)
        value = json.loads(data)
        wanted = context.dagster_type.typing_type
        return wanted.from_json_dict(value) if hasattr(wanted, "from_json_dict") else value

    def _read(self, key: str, asset_key: AssetKey, partition: str | None) -> bytes:
        bucket = self.s3.get_client()
        try:
            return bucket.get_bytes(key)
        except ClientError as error:
            if not is_not_found(error):
                raise
            raise MissingStoredOutput(
                f"no stored output for {_describe(asset_key, partition)}: "
                f"{bucket.uri(key)} does not exist; materialize that asset (for that partition) "
                "first"
            ) from error


S3_IO_MANAGER_KEY = "s3_io_manager"
PROBE_THREADS = 32  # HEADs at once: a million episodes' stored outputs in minutes


def missing_stored_outputs(
    bucket: Bucket, assets: Iterable[AssetKey], refs: Iterable[EpisodeRef]
) -> list[EpisodeRef]:
    """The episodes whose stored output of one of these assets is not in the bucket (one HEAD
    each): a run that loads it would fail (`MissingStoredOutput`); they need the whole graph."""
    keys = list(assets)
    if not keys:
        return []

    def missing(ref: EpisodeRef) -> bool:
        return any(bucket.head(object_key(key, ref.partition_key)) is None for key in keys)

    with ThreadPoolExecutor(PROBE_THREADS) as pool:
        return [ref for ref, lacks in _probed(pool, missing, refs) if lacks]


def _probed(
    pool: ThreadPoolExecutor, probe: Callable[[EpisodeRef], bool], refs: Iterable[EpisodeRef]
) -> Iterator[tuple[EpisodeRef, bool]]:
    """`(ref, probe(ref))`, a chunk at a time: refs may be streamed, never all in flight."""
    refs = iter(refs)
    while chunk := list(islice(refs, 100 * PROBE_THREADS)):
        yield from zip(chunk, pool.map(probe, chunk), strict=True)
