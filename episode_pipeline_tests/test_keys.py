"""Episode keys: the one place ids, S3 keys and partition keys are built and validated."""

import pytest

from episode_pipeline.episodes.keys import (
    EpisodeRef,
    InvalidEpisodeKey,
    is_raw_archive_key,
    parse_partition_key,
    parse_s3_key,
)


def test_partition_key_round_trip_and_prefixes():
    ref = EpisodeRef("acme", "ep-42")
    assert ref.partition_key == "acme/ep-42"
    assert parse_partition_key("acme/ep-42") == ref
    assert ref.prefix == "orgs/acme/episodes/ep-42/"
    assert ref.processed_key("ds/data/chunk-000/file-000.parquet") == (
        "orgs/acme/episodes/ep-42/processed/ds/data/chunk-000/file-000.parquet"
    )
    assert ref.hls_prefix("observation.images.front") == (
        "orgs/acme/episodes/ep-42/processed/hls/observation.images.front/"
    )


@pytest.mark.parametrize(
    "org, episode",
    [
        ("acme", "ep 1"),  # whitespace: the Dagster UI rejects it
        ("acme", "a,b"),
        ("acme", "[x]"),
        ("acme", "a...b"),  # Dagster reads '...' as a range
        ("acme", ".."),
        ("", "ep"),
        ("acme", "-starts-with-dash"),
        ("acme", "x" * 129),
        ("ac/me", "ep"),
        ("acme", "tab\tid"),
    ],
)
def test_ids_the_ui_cannot_handle_are_rejected_with_the_part_named(org, episode):
    with pytest.raises(InvalidEpisodeKey, match=r"invalid (org|episode) id"):
        EpisodeRef(org, episode)


def test_partition_key_without_separator_is_rejected():
    with pytest.raises(InvalidEpisodeKey, match=r"not ORG/EPISODE"):
        parse_partition_key("acme-ep-42")


def test_s3_keys_are_real_keys_never_decoded_again():
    assert parse_s3_key("orgs/acme/episodes/ep-1/run%2B1.tar.zst") == EpisodeRef("acme", "ep-1")
    # A real key whose name holds "%2F" is not an object below processed/.
    assert is_raw_archive_key("orgs/acme/episodes/ep-1/processed%2Fx.tar.zst")
    with pytest.raises(InvalidEpisodeKey, match="is not orgs/<org_id>/episodes"):
        parse_s3_key("uploads/acme/ep-1.tar.zst")


@pytest.mark.parametrize(
    "key, expected",
    [
        ("orgs/acme/episodes/ep-1/take.tar.zst", True),
        ("orgs/acme/episodes/ep-1/take+2.tar.zst", True),
        ("orgs/acme/episodes/ep-1/processed/x.tar.zst", False),  # our own output
        ("orgs/acme/episodes/ep-1/take.tar.gz", False),
        ("orgs/acme/ep-1/take.tar.zst", False),
    ],
)
def test_which_keys_are_uploads_to_process(key, expected):
    assert is_raw_archive_key(key) is expected
