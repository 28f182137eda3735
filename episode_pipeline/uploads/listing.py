"""An episode's raw archive, found by listing its prefix (the reconciliation sensor's and the run
queue's: one LIST of the top level, each a size and a modification time)."""

from __future__ import annotations

from episode_pipeline.episodes.keys import PROCESSED_DIR, EpisodeRef, is_raw_archive_key
from episode_pipeline.storage.bucket import Bucket, ObjectInfo


def newest_raw_archive(bucket: Bucket, ref: EpisodeRef) -> tuple[ObjectInfo | None, int]:
    """The episode's newest raw archive from its listing, and the LIST requests it took: the
    top level in one request; a folder other than `processed/` (rare) is listed too."""
    newest: ObjectInfo | None = None
    requests = 0
    prefixes = [ref.prefix]
    paginator = bucket.client.get_paginator("list_objects_v2")
    while prefixes:
        prefix = prefixes.pop()
        for page in paginator.paginate(Bucket=bucket.name, Prefix=prefix, Delimiter="/"):
            requests += 1
            for item in page.get("Contents", []):
                if not is_raw_archive_key(item["Key"]):
                    continue
                found = ObjectInfo.listed(item)
                if newest is None or (found.last_modified, found.key) > (
                    newest.last_modified,
                    newest.key,
                ):
                    newest = found
            prefixes += [
                p["Prefix"]
                for p in page.get("CommonPrefixes", [])
                if p["Prefix"] != f"{ref.prefix}{PROCESSED_DIR}/"
            ]
    return newest, requests
