"""Where the dataset sits inside an archive and what each member is.

A robot tars its dataset folder, so paths may or may not start with a top-level folder; the
dataset root is the folder holding ``meta/info.json``. Members stream in any order, so the
stream-time decision (:func:`member_kind` without a root) needs nothing but the path, and
:class:`ArchiveLayout` refines it once every path is known.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

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


def _is_meta_file(relative: str, name: str) -> bool:
    return relative == name or relative.endswith("/" + name)


def member_kind(path: str, root: str | None = None) -> MemberKind:
    """Classify one member path; with ``root`` the test runs on the path relative to the root.

    A parquet is frame data when it sits under a ``data`` folder (seed rule "path contains /data/",
    extended to a ``data/`` folder at the start since tar paths have no leading slash).
    """
    relative = path.strip("/")
    if root:
        prefix = root.strip("/") + "/"
        if relative.startswith(prefix):
            relative = relative[len(prefix) :]
    lower = relative.lower()
    if lower.endswith(".mp4"):
        return MemberKind.VIDEO
    if lower.endswith(".parquet"):
        return MemberKind.DATA_PARQUET if _in_data_folder(relative) else MemberKind.OTHER_PARQUET
    if any(_is_meta_file(relative, name) for name in KEPT_METADATA):
        return MemberKind.METADATA
    return MemberKind.SKIPPED


def should_keep(path: str) -> bool:
    """Stream-time decision: is this member worth uploading / remembering at all?"""
    return member_kind(path) is not MemberKind.SKIPPED


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


def root_for(path: str, roots: Sequence[str]) -> str | None:
    """The deepest dataset root that contains ``path``, or ``None``."""
    path = path.strip("/")
    best: str | None = None
    for root in roots:
        if (root == "" or path.startswith(root + "/")) and (best is None or len(root) > len(best)):
            best = root
    return best


def relative_to(path: str, root: str | None) -> str:
    path = path.strip("/")
    if root and path.startswith(root + "/"):
        return path[len(root) + 1 :]
    return path


_DIGITS = re.compile(r"(\d+)")


def natural_key(path: str) -> tuple:
    """Sort key that orders ``file-2`` before ``file-10`` (zero padding is usual, not certain)."""
    return tuple(int(part) if part.isdigit() else part for part in _DIGITS.split(path))


@dataclass(frozen=True)
class ClassifiedMember:
    path: str  # as in the archive (normalised)
    root: str | None  # dataset root holding it, None when no info.json covers it
    relative: str  # path relative to that root
    kind: MemberKind


@dataclass(frozen=True)
class ArchiveLayout:
    """Every member path classified against the dataset root(s) found in the archive."""

    roots: tuple[str, ...]
    members: tuple[ClassifiedMember, ...]

    @classmethod
    def from_paths(cls, paths: Iterable[str]) -> ArchiveLayout:
        paths = [posixpath.normpath(p.strip("/")) for p in paths]
        roots = find_dataset_roots(paths)
        members = []
        for path in paths:
            root = root_for(path, roots)
            members.append(
                ClassifiedMember(path, root, relative_to(path, root), member_kind(path, root))
            )
        return cls(tuple(roots), tuple(members))

    @property
    def root(self) -> str | None:
        """The main dataset root (the shallowest), ``None`` when no ``meta/info.json`` exists."""
        return self.roots[0] if self.roots else None

    def of_kind(self, kind: MemberKind) -> list[ClassifiedMember]:
        """Members of one kind in natural path order (the order frames are numbered in)."""
        return sorted(
            (m for m in self.members if m.kind is kind), key=lambda m: natural_key(m.path)
        )

    @property
    def videos(self) -> list[ClassifiedMember]:
        return self.of_kind(MemberKind.VIDEO)

    @property
    def data_parquets(self) -> list[ClassifiedMember]:
        return self.of_kind(MemberKind.DATA_PARQUET)

    def find(self, relative: str, root: str | None = None) -> ClassifiedMember | None:
        """The member at ``relative`` under ``root`` (default: the main root)."""
        root = self.root if root is None else root
        for member in self.members:
            if member.root == root and member.relative == relative:
                return member
        return None

    @property
    def info_json(self) -> ClassifiedMember | None:
        return self.find(INFO_JSON)

    @property
    def task_table(self) -> ClassifiedMember | None:
        """``meta/tasks.parquet`` (v3.0) or else ``meta/tasks.jsonl`` (v2.x)."""
        return self.find(TASKS_PARQUET) or self.find(TASKS_JSONL)
