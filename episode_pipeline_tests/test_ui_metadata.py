"""The pure parts of what the UI shows: links, playlist links, column lineage, code versions.

No servers: the presigned local link is signed offline by botocore with the moto keys.
"""

from __future__ import annotations

import dataclasses
from urllib.parse import parse_qs, urlsplit

from dagster import AssetKey, TableColumnDep

from episode_pipeline.config.settings import AwsSettings, Settings
from episode_pipeline.definitions import build_definitions, hls_settings
from episode_pipeline.defs.assets.episode import playlist_links
from episode_pipeline.defs.assets.frames import column_lineage
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.lerobot.frames import FrameColumns
from episode_pipeline.storage.aws import aws_client
from episode_pipeline.storage.links import BucketLinks

REF = EpisodeRef("acme", "ep-1")
LOCAL = AwsSettings(
    region="us-west-2",
    endpoint_url="http://127.0.0.1:5000",
    access_key_id="testing",
    secret_access_key="testing",
)


def test_on_aws_links_open_the_s3_console_for_the_object_or_folder():
    links = BucketLinks("data", "eu-west-1")
    key = "orgs/acme/episodes/ep 1/take+1.tar.zst"
    url = urlsplit(links.object(key))
    assert (url.scheme, url.netloc, url.path) == (
        "https",
        "console.aws.amazon.com",
        "/s3/object/data",
    )
    assert parse_qs(url.query) == {
        "region": ["eu-west-1"],
        "bucketType": ["general"],
        "prefix": [key],
    }
    folder = urlsplit(links.folder("orgs/acme/episodes/ep-1/processed"))
    assert folder.path == "/s3/buckets/data"
    assert parse_qs(folder.query)["prefix"] == ["orgs/acme/episodes/ep-1/processed/"]


def test_locally_links_point_at_the_endpoint_and_objects_are_presigned():
    client = aws_client("s3", LOCAL)
    links = BucketLinks("data", LOCAL.region, LOCAL.endpoint_url, client=client)
    url = urlsplit(links.object("orgs/acme/episodes/ep-1/a b.tar.zst"))
    assert f"{url.scheme}://{url.netloc}" == LOCAL.endpoint_url
    assert url.path == "/data/orgs/acme/episodes/ep-1/a%20b.tar.zst"
    assert "Signature" in parse_qs(url.query) or "X-Amz-Signature" in parse_qs(url.query)
    folder = links.folder("orgs/acme/episodes/ep-1/processed/")
    assert (
        folder == "http://127.0.0.1:5000/data?prefix=orgs%2Facme%2Fepisodes%2Fep-1%2Fprocessed%2F"
    )


def test_playlist_links_name_each_camera_with_a_playlist_and_nothing_else():
    links = BucketLinks("data", "us-west-2")
    root = REF.hls_root
    keys = [
        f"{root}front/playlist.m3u8",
        f"{root}front/segment_00000.ts",
        f"{root}front/720p/playlist.m3u8",  # a ladder rung: not a camera
        f"{root}wrist/master.m3u8",  # no baseline playlist: no link
        f"{root}top/playlist.m3u8",
    ]
    lines = playlist_links(keys, REF, links).splitlines()
    assert [line.split("]")[0] for line in lines] == ["- [front", "- [top"]
    assert all("console.aws.amazon.com" in line for line in lines)
    assert playlist_links([], REF, links) == "(no playlist)"


def test_column_lineage_follows_the_parquet_fields_each_file_had():
    first = FrameColumns(
        read=("timestamp", "observation.state", "action", "frame_index", "episode_index"),
        state="observation.state",
        action="action",
        kinds={},
    )
    second = FrameColumns(read=("timestamp", "state"), state="state", action=None, kinds={})
    deps = column_lineage([first, second]).deps_by_column
    source = AssetKey("extracted_files")
    assert deps["observation"] == [
        TableColumnDep(source, "observation.state"),
        TableColumnDep(source, "state"),
    ]
    assert deps["timestamp_ms"] == [TableColumnDep(source, "timestamp")]
    assert deps["lerobot_episode_index"] == [TableColumnDep(source, "episode_index")]
    assert deps["action"] == [TableColumnDep(source, "action")]
    assert "frame_order" not in deps  # a position, from no field


def test_encoder_settings_are_part_of_hls_renditions_code_version_only():
    settings = Settings.from_env(
        {"DATA_BUCKET": "data", "DB_HOST": "db.internal", "DB_NAME": "app", "DB_USER": "app"}
    )
    faster = dataclasses.replace(
        settings,
        transcode=dataclasses.replace(
            settings.transcode,
            video=dataclasses.replace(settings.transcode.video, preset="ultrafast"),
        ),
    )

    def versions(s: Settings) -> dict[str, str | None]:
        graph = build_definitions(s).resolve_asset_graph()
        return {
            key.to_user_string(): graph.get(key).code_version for key in graph.get_all_asset_keys()
        }

    before, after = versions(settings), versions(faster)
    assert before["hls_renditions"] == f"2+{hls_settings(settings)}"
    assert "preset=ultrafast," in after["hls_renditions"]
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {"hls_renditions"}
    assert all(before[name] for name in before if name != "raw_archive")  # every asset has one
