"""What the checks of an episode's objects and rows conclude, without Dagster: the processed
objects against S3, the metadata keys against the contract, the frames' state feature. The
checks in `defs/checks/` read the stores, call these and show the answer."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from episode_pipeline.episodes.episode_rows import REQUIRED_KEYS
from episode_pipeline.episodes.extracted_files import ProcessedFile
from episode_pipeline.storage.bucket import Bucket


def object_problems(bucket: Bucket, files: Sequence[ProcessedFile]) -> list[dict[str, str]]:
    """Each listed file missing from S3, or there at another size than recorded."""
    problems = []
    for file in files:
        head = bucket.head(file.key)
        if head is None:
            problems.append({"key": file.key, "problem": "missing"})
        elif head.size != file.size:
            problems.append({"key": file.key, "problem": f"size {head.size} != {file.size}"})
    return problems


def missing_metadata_keys(present: Collection[str]) -> list[str]:
    """The contract's required metadata keys the episode lacks, in the contract's order."""
    return [key for key in REQUIRED_KEYS if key not in present]


def missing_state_features(files_without_state: Sequence[Mapping[str, Any]]) -> str | None:
    """The state features the data parquets lacked, once each (None: every file had one)."""
    return "; ".join(sorted({item["missing"] for item in files_without_state})) or None
