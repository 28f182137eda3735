"""S3IOManager against the moto server: episode-partitioned JSON round trips."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from dagster import DagsterInstance, DynamicPartitionsDefinition, asset, materialize

from episode_pipeline.config.settings import Settings
from episode_pipeline.defs.io_managers.s3_outputs import S3IOManager
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.storage.bucket import Bucket, MissingStoredOutput

pytestmark = pytest.mark.integration

EPISODES = DynamicPartitionsDefinition(name="s3_io_test_episodes")


@dataclasses.dataclass
class Manifest:
    keys: list[str]
    cameras: dict[str, str]

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> Manifest:
        return cls(keys=list(data["keys"]), cameras=dict(data["cameras"]))


@asset(partitions_def=EPISODES)
def manifest() -> Manifest:
    return Manifest(keys=["a.mp4", "b.parquet"], cameras={"a.mp4": "cam_main"})


@asset(partitions_def=EPISODES)
def summary(manifest: dict) -> dict:
    """Plain `dict` input: the JSON as stored."""
    return {"files": len(manifest["keys"]), "cams": manifest["cameras"]}


@asset(partitions_def=EPISODES)
def typed_reader(manifest: Manifest) -> list:
    """A `from_json_dict` class input: rebuilt from the JSON."""
    assert isinstance(manifest, Manifest)
    return manifest.keys


@pytest.fixture(scope="module")
def s3(settings: Settings) -> S3BucketResource:
    return S3BucketResource.from_settings(settings)


@pytest.fixture
def storage(s3: S3BucketResource) -> Bucket:
    return s3.get_client()


@pytest.fixture
def new_partition(
    episode_ref: Callable[[], EpisodeRef], instance: DagsterInstance
) -> Callable[[], EpisodeRef]:
    """A fresh episode partition (no database row needed: this manager only touches S3)."""

    def make() -> EpisodeRef:
        ref = episode_ref()
        instance.add_dynamic_partitions(EPISODES.name, [ref.partition_key])
        return ref

    return make


def test_json_round_trips_beside_the_processed_files(
    storage: Bucket,
    s3: S3BucketResource,
    instance: DagsterInstance,
    new_partition: Callable[[], EpisodeRef],
) -> None:
    ref = new_partition()
    result = materialize(
        [manifest, summary, typed_reader],
        partition_key=ref.partition_key,
        instance=instance,
        resources={"io_manager": S3IOManager(s3=s3)},
    )
    assert result.success

    prefix = f"{ref.processed_prefix}_dagster/"
    assert storage.list_keys(prefix) == [
        f"{prefix}manifest.json",
        f"{prefix}summary.json",
        f"{prefix}typed_reader.json",
    ]
    stored = json.loads(storage.get_bytes(f"{prefix}manifest.json"))
    assert stored == {"cameras": {"a.mp4": "cam_main"}, "keys": ["a.mp4", "b.parquet"]}
    assert json.loads(storage.get_bytes(f"{prefix}summary.json")) == {
        "cams": {"a.mp4": "cam_main"},
        "files": 2,
    }
    assert json.loads(storage.get_bytes(f"{prefix}typed_reader.json")) == ["a.mp4", "b.parquet"]

    info = storage.head(f"{prefix}manifest.json")
    assert info is not None
    assert info.size > 0
    metadata = result.asset_materializations_for_node("manifest")[0].metadata
    assert metadata["s3_uri"].value == storage.uri(f"{prefix}manifest.json")
    assert metadata["bytes"].value == info.size


def test_a_missing_upstream_object_names_the_key_and_the_partition(
    storage: Bucket,
    s3: S3BucketResource,
    instance: DagsterInstance,
    new_partition: Callable[[], EpisodeRef],
) -> None:
    ref = new_partition()
    with pytest.raises(MissingStoredOutput) as raised:
        materialize(
            [manifest, summary],
            selection=[summary],
            partition_key=ref.partition_key,
            instance=instance,
            resources={"io_manager": S3IOManager(s3=s3)},
        )
    message = str(raised.value)
    assert ref.partition_key in message
    assert f"{ref.processed_prefix}_dagster/manifest.json" in message
    assert "asset 'manifest'" in message


def test_unpartitioned_output_lives_under_dagster_prefix(
    storage: Bucket, s3: S3BucketResource
) -> None:
    name = f"s3io_plain_{uuid.uuid4().hex[:8]}"

    @asset(name=name)
    def plain() -> dict:
        return {"ok": True}

    assert materialize([plain], resources={"io_manager": S3IOManager(s3=s3)}).success
    assert json.loads(storage.get_bytes(f"_dagster/{name}.json")) == {"ok": True}


def test_a_later_run_loads_the_bucket_not_what_an_earlier_run_wrote(
    storage: Bucket,
    s3: S3BucketResource,
    instance: DagsterInstance,
    new_partition: Callable[[], EpisodeRef],
) -> None:
    """Outputs are kept in memory for the run that wrote them only."""
    ref = new_partition()
    io_manager = S3IOManager(s3=s3)
    run = {"partition_key": ref.partition_key, "instance": instance}
    assert materialize([manifest], resources={"io_manager": io_manager}, **run).success
    replaced = {"keys": ["c.mp4"], "cameras": {}}
    storage.put_bytes(
        f"{ref.processed_prefix}_dagster/manifest.json", json.dumps(replaced).encode()
    )

    result = materialize(
        [manifest, summary], selection=[summary], resources={"io_manager": io_manager}, **run
    )
    assert result.output_for_node("summary") == {"files": 1, "cams": {}}
