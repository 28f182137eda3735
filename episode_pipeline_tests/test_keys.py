"""Episode keys: the one place ids, S3 keys and partition keys are built and validated."""

import uuid

import pytest

from episode_pipeline.episodes.keys import (
    EpisodeRef,
    InvalidEpisodeKey,
    UnkeyableRow,
    is_raw_archive_key,
    parse_partition_key,
    parse_s3_key,
    ref_of_row,
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


def test_a_trailing_newline_is_no_id():
    # Python's `$` matches before a final newline: the id must match in full.
    with pytest.raises(InvalidEpisodeKey, match="invalid episode id"):
        EpisodeRef("acme", "ep-1\n")


@pytest.mark.parametrize(
    "org, episode, reason",
    [
        ("acme", "", "invalid episode id ''"),
        ("acme", "--help", "invalid episode id '--help'"),
        ("acme", "a b", "invalid episode id 'a b'"),
        ("acme", "épisode-ü", "invalid episode id 'épisode-ü'"),
        ("bad org", "ep-1", "invalid org id 'bad org'"),
        (None, "ep-1", "org_id is NULL"),
    ],
)
def test_a_row_the_pipeline_cannot_key_is_named_not_raised(org, episode, reason):
    row = ref_of_row(org, episode)
    assert isinstance(row, UnkeyableRow)
    assert (row.org_id, row.episode_id) == (org, episode)
    assert reason in row.reason
    assert reason in row.describe() or "NULL" in row.describe()


def test_a_long_id_is_named_by_its_start_and_length():
    row = ref_of_row("acme", "x" * 300)
    assert isinstance(row, UnkeyableRow)
    assert row.episode_id == "x" * 300  # kept whole: `status --invalid` prints it to fix
    assert "(300 characters)" in row.describe() and "x" * 41 not in row.describe()


def test_a_good_row_is_its_ref_whatever_the_column_types():
    assert ref_of_row("acme", "ep-1") == EpisodeRef("acme", "ep-1")
    uuid_id = uuid.UUID("6f1c2a52-3c1e-4a9f-9d7e-0a1b2c3d4e5f")
    assert ref_of_row("acme", uuid_id) == EpisodeRef("acme", str(uuid_id))
