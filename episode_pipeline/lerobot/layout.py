"""Where the dataset sits inside an archive and what each member is.

A robot tars its dataset folder, so paths may or may not start with a top-level folder; the
dataset root is the folder holding ``meta/info.json``. Members stream in any order, so the
stream-time decision (:func:`member_kind`) needs nothing but the path.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import StrEnum

# The LeRobot dataset versions whose layouts are accepted (docs/lerobot-archives.md).
CODEBASE_VERSIONS = ("v3.0", "v2.1", "v2.0")
INFO_JSON = "meta/info.json"
TASKS_PARQUET = "meta/tasks.parquet"
TASKS_JSONL = "meta/tasks.jsonl"
EPISODES_JSONL = "meta/episodes.jsonl"
KEPT_METADATA = (INFO_JSON, TASKS_JSONL, EPISODES_JSONL)


class MemberKind(StrEnum):
    VIDEO = "video"  # .mp4: re-uploaded and transcoded to HLS
    DATA_PARQUET = "data_parquet"  # frame rows
    OTHER_PARQUET = "other_parquet"  # meta/tasks.parquet, meta/episodes/*.parquet, ...
    METADATA = "metadata"  # meta/info.json, meta/tasks.jsonl, meta/episodes.jsonl
    SKIPPED = "skipped"  # stats, READMEs, images, anything else


def _in_data_folder(relative: str) -> bool:
    """True when a ``data`` folder holds the file and no ``meta`` folder sits below that one.

    ``data/chunk-000/x.parquet`` and ``ds/data/...`` are frame data; ``data/meta/tasks.parquet``
    (a dataset folder that happens to be called ``data``) is not.
    """
    folders = relative.split("/")[:-1]
    last = {name: i for i, name in enumerate(folders) if name in ("data", "meta")}
    return "data" in last and last["data"] > last.get("meta", -1)


def is_dataset_file(path: str, name: str) -> bool:
    """Is ``path`` the dataset file ``name`` (e.g. ``meta/info.json``) of some dataset root?"""
    return path == name or path.endswith("/" + name)


def member_kind(path: str) -> MemberKind:
    """Classify one member path, from the path alone (members stream in any order).

    A parquet is frame data when it sits under a ``data`` folder (the rule "path contains /data/",
    extended to a ``data/`` folder at the start since tar paths have no leading slash).
    """
    relative = path.strip("/")
    lower = relative.lower()
    if lower.endswith(".mp4"):
        return MemberKind.VIDEO
    if lower.endswith(".parquet"):
        return MemberKind.DATA_PARQUET if _in_data_folder(relative) else MemberKind.OTHER_PARQUET
    if any(is_dataset_file(relative, name) for name in KEPT_METADATA):
        return MemberKind.METADATA
    return MemberKind.SKIPPED


def find_dataset_roots(paths: Iterable[str]) -> list[str]:
    """Folders holding ``meta/info.json`` (``""`` for the archive root), shortest first."""
    roots = set()
    for path in paths:
        path = path.strip("/")
        if path == INFO_JSON:
            roots.add("")
        elif path.endswith("/" + INFO_JSON):
            roots.add(path[: -len("/" + INFO_JSON)])
    return sorted(roots, key=lambda r: (r.count("/") if r else -1, r))


_DIGITS = re.compile(r"(\d+)")


def path_order(path: str) -> tuple[str | int, ...]:
    """The one ordering rule for member paths: ``file-2`` before ``file-10``.

    Numbers compare as numbers, so zero padding (usual, not certain) does not matter. Frames are
    numbered and a camera's mp4s are played in this order.
    """
    return tuple(int(part) if part.isdigit() else part for part in _DIGITS.split(path))
