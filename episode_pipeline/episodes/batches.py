"""Batch identity (pure): the key that names K episodes processed in one task.

A campaign run processes a batch of episodes in one ECS task, paying one cold start for all of
them (docs/architecture.md#batch-runs). The batch key is the batch's Dagster partition key, its
rows' key in `episode_batches`, and the tag its episodes' runs carry:
`<campaign_id>.w<wave>.b<n>`, e.g. `c12.w3.b7`. It never holds a `/`, so no batch key can be
mistaken for an episode's `ORG/EP`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The campaign id is a slug (no '.', which separates the parts); 64 characters is plenty.
_CAMPAIGN_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"
_KEY_PATTERN = re.compile(
    rf"^(?P<campaign>{_CAMPAIGN_PATTERN})\.w(?P<wave>\d{{1,9}})\.b(?P<n>\d{{1,9}})$"
)


class InvalidBatchKey(ValueError):
    """A string that is not `<campaign_id>.w<wave>.b<n>`, or parts that cannot make one."""


@dataclass(frozen=True, order=True)
class BatchKey:
    campaign_id: str
    wave: int
    number: int

    def __post_init__(self) -> None:
        if not re.fullmatch(_CAMPAIGN_PATTERN, self.campaign_id):
            raise InvalidBatchKey(
                f"invalid campaign id {self.campaign_id!r} for a batch key: use 1-64 letters, "
                "digits, '_' or '-', starting with a letter or digit"
            )
        for name, value in (("wave", self.wave), ("batch number", self.number)):
            if not 0 <= value < 10**9:
                raise InvalidBatchKey(f"invalid {name} {value!r} for a batch key: 0..999999999")

    def __str__(self) -> str:
        return f"{self.campaign_id}.w{self.wave}.b{self.number}"


def batch_key(campaign_id: str, wave: int, number: int) -> str:
    """The key of batch `number` of wave `wave` of a campaign."""
    return str(BatchKey(campaign_id, wave, number))


def parse_batch_key(key: str) -> BatchKey:
    """`<campaign_id>.w<wave>.b<n>` → BatchKey; raises InvalidBatchKey naming the key."""
    match = _KEY_PATTERN.match(key)
    if not match:
        raise InvalidBatchKey(
            f"batch key {key!r} is not <campaign_id>.w<wave>.b<n> (e.g. c12.w3.b7; the campaign "
            "id of letters, digits, '_' or '-')"
        )
    return BatchKey(match["campaign"], int(match["wave"]), int(match["n"]))
