"""Episode identity in one place: org/episode ids ⇄ S3 keys ⇄ Dagster partition keys.

Dagster does not validate dynamic partition keys, and its UI cannot handle some characters
(`...`, `,`, `[`, `]`, whitespace, control characters). Every id that reaches a partition key,
an S3 key or a SQL filter passes through `EpisodeRef`, so a bad id fails here with a clear message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Letters, digits, '.', '_', '-'; starts with a letter or digit; no '..' (path traversal, and
# Dagster's UI treats '...' as a range). 128 characters is far above any UUID or slug we issue.
# Written in the syntax Python's `re` and PostgreSQL's `~` share: `db.episodes` finds the rows
# that break it with the same pattern (anchored there, `fullmatch` here: Python's `$` would let
# a trailing newline through).
ID_PATTERN = "[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
FORBIDDEN_IN_ID = ".."
_ID_PATTERN = re.compile(ID_PATTERN)
_S3_KEY_PATTERN = re.compile(r"^orgs/(?P<org>[^/]+)/episodes/(?P<episode>[^/]+)/(?P<rest>.+)$")
PARTITION_SEPARATOR = "/"
PROCESSED_DIR = "processed"
ARCHIVE_SUFFIX = ".zst"


class InvalidEpisodeKey(ValueError):
    """An S3 key, partition key or id that cannot name an episode."""


SHOWN_ID_CHARACTERS = 40  # a 300-character id is named by its start and its length


def _shown(value: str | None) -> str:
    if value is None:
        return "NULL"
    if len(value) <= SHOWN_ID_CHARACTERS:
        return repr(value)
    return f"{value[:SHOWN_ID_CHARACTERS]!r}… ({len(value)} characters)"


def _validate_id(kind: str, value: str) -> str:
    if not _ID_PATTERN.fullmatch(value) or FORBIDDEN_IN_ID in value:
        raise InvalidEpisodeKey(
            f"invalid {kind} {_shown(value)}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, without '..'"
        )
    return value


@dataclass(frozen=True, order=True)
class EpisodeRef:
    """One uploaded episode: the pair that names its S3 prefix, its row and its partition."""

    org_id: str
    episode_id: str

    def __post_init__(self) -> None:
        _validate_id("org id", self.org_id)
        _validate_id("episode id", self.episode_id)

    @property
    def partition_key(self) -> str:
        return f"{self.org_id}{PARTITION_SEPARATOR}{self.episode_id}"

    @property
    def prefix(self) -> str:
        """`orgs/<org>/episodes/<episode>/`: where the robot uploads."""
        return f"orgs/{self.org_id}/episodes/{self.episode_id}/"

    @property
    def processed_prefix(self) -> str:
        return f"{self.prefix}{PROCESSED_DIR}/"

    def processed_key(self, member_path: str) -> str:
        """Where a file from the archive goes: its path inside the tar under `processed/`."""
        return self.processed_prefix + member_path.lstrip("/")

    @property
    def hls_root(self) -> str:
        """`…/processed/hls/`: one folder per camera below it."""
        return f"{self.processed_prefix}hls/"

    def hls_prefix(self, camera: str) -> str:
        return f"{self.hls_root}{camera}/"

    def __str__(self) -> str:
        return self.partition_key


@dataclass(frozen=True)
class UnkeyableRow:
    """A row of the application's `episodes` whose ids cannot name a partition, an S3 prefix or
    a run tag (docs/contract.md#episode-ids). Every read that builds keys skips it and counts it;
    `episode-pipeline status --invalid` lists it so the application can fix it."""

    org_id: str | None
    episode_id: str
    reason: str

    def describe(self) -> str:
        shown = f"id {_shown(self.episode_id)} (org_id {_shown(self.org_id)})"
        return f"episodes row {shown}: {self.reason}"


def ref_of_row(org_id: object, episode_id: object) -> EpisodeRef | UnkeyableRow:
    """The rule for every row read from `episodes`: its EpisodeRef, or why it has none.

    Never raises: one row the application wrote with an id the pipeline cannot key must not
    stop a listing or a sensor for every other row.
    """
    episode = str(episode_id)
    org = None if org_id is None else str(org_id)
    if org is None:
        return UnkeyableRow(org, episode, "org_id is NULL")
    try:
        return EpisodeRef(org, episode)
    except InvalidEpisodeKey as error:
        return UnkeyableRow(org, episode, str(error))


def parse_partition_key(partition_key: str) -> EpisodeRef:
    """`ORG/EP` → EpisodeRef; raises InvalidEpisodeKey naming the bad part."""
    org_id, sep, episode_id = partition_key.partition(PARTITION_SEPARATOR)
    if not sep:
        raise InvalidEpisodeKey(f"partition key {partition_key!r} is not ORG/EPISODE")
    return EpisodeRef(org_id, episode_id)


def parse_s3_key(key: str) -> EpisodeRef:
    """An object's real key (decoded: events.py undoes an S3 notification's URL-encoding) →
    EpisodeRef.

    Raises InvalidEpisodeKey for keys outside `orgs/<org_id>/episodes/<episode_id>/…`.
    """
    match = _S3_KEY_PATTERN.match(key)
    if not match:
        raise InvalidEpisodeKey(f"S3 key {key!r} is not orgs/<org_id>/episodes/<episode_id>/…")
    return EpisodeRef(match["org"], match["episode"])


def is_raw_archive_key(key: str) -> bool:
    """An upload that should start processing: a `.zst` under an episode, not our own output."""
    match = _S3_KEY_PATTERN.match(key)
    return (
        match is not None
        and key.endswith(ARCHIVE_SUFFIX)
        and not match["rest"].startswith(f"{PROCESSED_DIR}/")
    )
