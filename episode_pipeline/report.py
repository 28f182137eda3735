"""`episode-pipeline status`: what the pipeline wrote for each episode, read from the stores."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from dagster import AssetCheckKey, DagsterInstance

from episode_pipeline.config.settings import Settings, settings_from_environment
from episode_pipeline.db import episodes as episode_db
from episode_pipeline.db.connection import connect
from episode_pipeline.definitions import build_definitions
from episode_pipeline.defs.asset_keys import EXTRACTED_FILES_KEY
from episode_pipeline.defs.checks.sync import latest_sync_result
from episode_pipeline.defs.io_managers.s3_outputs import object_key
from episode_pipeline.diagnosis import descriptions_of_checks, diagnose, format_diagnosis
from episode_pipeline.episodes.extracted_files import VIDEO
from episode_pipeline.episodes.keys import EpisodeRef, UnkeyableRow
from episode_pipeline.episodes.sync_check import sync_summary
from episode_pipeline.orchestration.event_log import latest_check_results
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.video.hls import PLAYLIST_NAME
from episode_pipeline.viewer.routes import how_to_view

REPORT_COLUMNS = ("org_id", "episode_id", "status", "frame_count", "frames_rows", "fps")


def hls_playlists(
    bucket: Bucket, ref: EpisodeRef, videos: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Every `processed/hls/<camera>/playlist.m3u8` in S3, with the mp4 it came from."""
    source_of = {video.get("camera"): video.get("key") for video in videos}
    playlists = bucket.list_keys(ref.hls_root, suffix=f"/{PLAYLIST_NAME}")
    entries = []
    for key in playlists:
        camera = key[len(ref.hls_root) :].removesuffix(f"/{PLAYLIST_NAME}")
        if "/" in camera:  # a ladder variant's playlist, inside its camera's folder
            continue
        entries.append({"camera": camera, "source": source_of.get(camera), "playlist": key})
    return entries


def _extracted_videos(bucket: Bucket, ref: EpisodeRef) -> list[dict[str, Any]]:
    key = object_key(EXTRACTED_FILES_KEY, ref.partition_key)
    if bucket.head(key) is None:
        return []
    files = json.loads(bucket.get_bytes(key)).get("files", [])
    return [f for f in files if f.get("kind") == VIDEO]


@dataclass
class Listing:
    """One page of a listing, and the rows of that page the pipeline cannot key (skipped: the
    command names how many, `status --invalid` lists them)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[UnkeyableRow] = field(default_factory=list)


def episode_reports(
    ref: EpisodeRef | None = None,
    settings: Settings | None = None,
    org_id: str | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
    """The report of `ref`, or of the `limit` most recently changed episodes (of `org_id`)."""
    return episode_listing(ref, settings, org_id, limit).rows


def episode_listing(
    ref: EpisodeRef | None = None,
    settings: Settings | None = None,
    org_id: str | None = None,
    limit: int = 50,
) -> Listing:
    """The report of `ref`, or of the `limit` most recently changed episodes (of `org_id`):
    each costs a few keyed queries and S3 requests, so the listing is bounded, not the fleet."""
    settings = settings or settings_from_environment()
    descriptions = _check_descriptions(settings)
    check_keys = list(descriptions)
    instance = DagsterInstance.get()
    bucket = Bucket(settings.bucket, settings.aws)
    listing = Listing()
    reports = listing.rows
    with connect(settings.database) as conn:
        if ref is None:
            page = episode_db.recent_episode_refs(conn, org_id, limit)
            refs, listing.skipped = page.refs, page.invalid
        else:
            refs = [ref]
        for current in refs:
            row = episode_db.episode_row(conn, current)
            if row is None:
                continue
            hls = hls_playlists(bucket, current, _extracted_videos(bucket, current))
            reports.append(
                {
                    "org_id": current.org_id,
                    "episode_id": current.episode_id,
                    "status": row["status"],
                    "processed_at": row["processed_at"],
                    "frame_count": row["frame_count"],
                    "fps": row["fps"],
                    "duration_seconds": row["duration_seconds"],
                    "mp4_s3_path": row["mp4_s3_path"],
                    "parquet_s3_path": row["parquet_s3_path"],
                    "frames_rows": episode_db.frame_rows(conn, current),
                    "metadata": episode_db.metadata_values(conn, current),
                    "hls": hls,
                    "checks": latest_check_results(instance, check_keys, current.partition_key),
                    "sync": latest_sync_result(instance, current.partition_key),
                    "latest_run": diagnose(
                        instance, current, descriptions, settings.ui_url
                    ).as_dict(),
                    "view": how_to_view(current, settings.viewer_url)
                    if row["status"] == "processed"
                    else None,
                }
            )
    return listing


def _check_descriptions(settings: Settings) -> dict[AssetCheckKey, str]:
    graph = build_definitions(settings).resolve_asset_graph()
    return descriptions_of_checks(graph.get_check_spec(key) for key in graph.asset_check_keys)


def failed_episodes(
    org_id: str | None = None, limit: int = 50, settings: Settings | None = None
) -> Listing:
    """The most recently failed episodes, each with its latest run and one-line cause.

    Per episode: the row (by the status index), the newest run by its partition tag, that run's
    failure events and the latest check results; flat in the number of episodes of the fleet.
    """
    settings = settings or settings_from_environment()
    descriptions = _check_descriptions(settings)
    instance = DagsterInstance.get()
    with connect(settings.database) as conn:
        page = episode_db.failed_episode_refs(conn, org_id, limit)
    listing = Listing(skipped=page.invalid)
    rows = listing.rows
    for ref in page.refs:
        diagnosis = diagnose(instance, ref, descriptions, settings.ui_url)
        rows.append(
            {
                "episode": ref.partition_key,
                "org_id": ref.org_id,
                "episode_id": ref.episode_id,
                "run_id": diagnosis.run_id,
                "run_status": diagnosis.run_status,
                "cause": diagnosis.cause or "no failed run or check recorded",
                "run_url": diagnosis.run_url,
            }
        )
    return listing


def invalid_episodes(
    org_id: str | None = None, limit: int = 50, settings: Settings | None = None
) -> list[dict[str, Any]]:
    """The most recently changed rows of `episodes` the pipeline cannot key, with the reason."""
    settings = settings or settings_from_environment()
    with connect(settings.database) as conn:
        return [row.as_dict() for row in episode_db.invalid_episode_rows(conn, org_id, limit)]


def format_invalid(rows: list[dict[str, Any]]) -> str:
    """Ids shown as Python literals, so '' and spaces are visible."""
    if not rows:
        return "no rows the pipeline cannot key"
    return "\n".join(
        f"id {row['id']!r}  org_id {row['org_id']!r}  status {row['status'] or '-'}: "
        f"{row['reason']}"
        for row in rows
    )


def skipped_note(skipped: list[UnkeyableRow]) -> str | None:
    """The line a listing prints (on stderr) when it skipped rows of its page."""
    if not skipped:
        return None
    return (
        f"skipped {len(skipped)} row(s) of this page the pipeline cannot key "
        "(their ids break docs/contract.md#episode-ids): episode-pipeline status --invalid"
    )


def format_failed(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no failed episodes"
    width = max(len(row["episode"]) for row in rows)
    return "\n".join(
        f"{row['episode'].ljust(width)}  {(row['run_id'] or '-')[:8]}  {row['cause']}"
        for row in rows
    )


def format_reports(reports: list[dict[str, Any]]) -> str:
    """A plain table for a terminal; `--json` has everything."""
    if not reports:
        return "no episodes"
    header = [*REPORT_COLUMNS, "hls", "checks", "sync"]
    rows = [
        [
            *("-" if report[c] is None else str(report[c]) for c in REPORT_COLUMNS),
            f"{len(report['hls'])} camera(s)",
            f"{sum(report['checks'].values())}/{len(report['checks'])} passed"
            if report["checks"]
            else "-",
            sync_summary(report.get("sync")),
        ]
        for report in reports
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    if len(reports) == 1 and "latest_run" in reports[0]:  # one episode: why, if it failed
        if reports[0].get("view"):
            lines.append(f"look at it: {reports[0]['view']}")
        lines += format_diagnosis(reports[0]["latest_run"])
    return "\n".join(lines)
