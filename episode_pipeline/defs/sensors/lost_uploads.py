"""Finding lost uploads at a million episodes: two passes a tick, S3 requests bounded and counted.

An upload is lost when its archive is in S3 and no event announced it (a lost or misfiltered S3
notification, a message purged by hand). Two passes find it, each with a cursor of its own:

- **pending**: the episodes never processed (`status = 'uploaded'`, an index-backed query), last
  changed between `lost_upload_after_seconds` and `pending_lookback_seconds` ago. Few rows at any
  time (the uploads of the last day still waiting), all visited every tick or few: a lost upload of
  a new episode is found within the hour whatever the table's size.
- **walk**: every episode in id order (keyset paging, any id type), sized each tick so the whole
  table is visited once per `walk_cycle_seconds` (a day): a re-upload of a processed episode whose
  event was lost. Capped by `s3_requests_per_hour`; the tick log says when the cap makes the
  cycle longer.

Per episode: the Dagster side first, for the whole page in two queries (a run in flight, the
newest run made), then one S3 LIST of the episode's top level (`Delimiter=/`, so `processed/`
costs nothing), and a HEAD only for an archive that still looks lost (its version id). Each
tick logs the S3 requests it made and the hourly rate they amount to.

`reconcile_tick` is the entry point (the `waiting_uploads` sensor, benchmarks); `triage` is the
rule, without I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from dagster import DagsterInstance, RunRequest, RunsFilter

from episode_pipeline.config.settings import ReconcileSettings
from episode_pipeline.db.episodes import (
    episodes_after,
    estimated_episode_count,
    pending_episodes,
)
from episode_pipeline.db.schema_check import read_schema
from episode_pipeline.episodes.keys import (
    EpisodeRef,
    UnkeyableRow,
)
from episode_pipeline.instance.run_tags import (
    IN_FLIGHT_STATUSES,
    PARTITION_TAG,
    RECONCILED_TAG,
    UPLOAD_TAG,
    episode_tags,
    reconciled_run_key,
    upload_id,
)
from episode_pipeline.orchestration.archive_versions import report_archive_version
from episode_pipeline.orchestration.retention import pruned_successes
from episode_pipeline.orchestration.runs import latest_runs_of_uploads
from episode_pipeline.runtime import metrics
from episode_pipeline.storage.bucket import Bucket, ObjectInfo
from episode_pipeline.uploads.listing import newest_raw_archive

HOUR_SECONDS = 3600
S3_THREADS = 16  # LISTs of one page side by side: a tick of thousands stays within seconds


# -- the cursor ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cursor:
    """Where each pass goes on: the last id it read (None = at the start). The last id may be
    one the pipeline cannot key, even `''`: the pass moves past it all the same."""

    walk: str | None = None
    pending: str | None = None

    def to_json(self) -> str:
        # Own keys, so a legacy cursor's "" (which meant "at the start") is never read as
        # "after the id ''".
        return json.dumps(
            {"walk_after": self.walk, "pending_after": self.pending}, separators=(",", ":")
        )

    @classmethod
    def parse(cls, raw: str | None) -> Cursor:
        """The sensor's cursor; the two older forms (a bare id: the walk's cursor before the
        pending pass; `{"walk": …, "pending": …}` with "" for the start) still work."""
        if not raw:
            return cls()
        try:
            value = json.loads(raw)
        except ValueError:
            return cls(walk=raw)
        if not isinstance(value, dict):
            return cls(walk=raw)
        if "walk_after" in value or "pending_after" in value:
            return cls(_after(value.get("walk_after")), _after(value.get("pending_after")))
        return cls(_after(value.get("walk") or None), _after(value.get("pending") or None))


def _after(value: Any) -> str | None:
    return None if value is None else str(value)


# -- sizing and the rule (pure) -----------------------------------------------------------------


def walk_page_size(episodes: int, settings: ReconcileSettings, pending_requests: int) -> int:
    """Episodes the walk visits this tick: the table once per cycle, at least
    `episodes_per_tick`, within what is left of the tick's share of the S3 budget."""
    ticks_per_cycle = max(1, settings.walk_cycle_seconds // settings.interval_seconds)
    wanted = max(settings.episodes_per_tick, math.ceil(episodes / ticks_per_cycle))
    budget = settings.s3_requests_per_hour * settings.interval_seconds // HOUR_SECONDS
    return max(1, min(wanted, budget - pending_requests))


@dataclass(frozen=True)
class Visit:
    """What one episode looks like, before deciding."""

    ref: EpisodeRef
    processed_at: datetime | None
    in_flight: bool
    archive: ObjectInfo | None  # the newest raw archive, from the listing
    newest_run_created: datetime | None


def triage(visit: Visit, settings: ReconcileSettings, now: datetime) -> str | None:
    """Why the episode's newest upload needs no run, or None: it looks lost (the HEAD and the
    upload's own runs decide). Handled means a run is in flight, or the row says it was
    processed after the archive was written, or any run of the episode was made after that."""
    if visit.in_flight:
        return "a run is in flight"
    archive = visit.archive
    if archive is None:
        return "no archive yet"  # the application made the row; the robot has not uploaded
    if archive.last_modified is None:
        return f"{archive.key} has no LastModified"
    # S3 truncates LastModified to the second: only a second later is surely after the write.
    written_by = archive.last_modified + timedelta(seconds=1)
    if visit.processed_at is not None and visit.processed_at >= written_by:
        return f"processed at {visit.processed_at:%Y-%m-%d %H:%M:%S}, after it was written"
    age = (now - archive.last_modified).total_seconds()
    if age < settings.lost_upload_after_seconds:
        return f"{age:.0f} s old: the queue may still deliver it"
    if visit.newest_run_created is not None and visit.newest_run_created >= written_by:
        return "a run of the episode was made after it was written"
    return None


# -- I/O ----------------------------------------------------------------------------------------


@dataclass
class S3Requests:
    lists: int = 0
    heads: int = 0

    @property
    def total(self) -> int:
        return self.lists + self.heads


def visit_page(
    instance: DagsterInstance,
    bucket: Bucket,
    page: Sequence[tuple[EpisodeRef, datetime | None]],
    requests: S3Requests,
) -> list[Visit]:
    """Everything `triage` needs for a page: two Dagster queries, one LIST per episode."""
    keys = [ref.partition_key for ref, _ in page]
    if not keys:
        return []
    in_flight = {
        run.tags.get(PARTITION_TAG)
        for run in instance.get_runs(
            RunsFilter(tags={PARTITION_TAG: keys}, statuses=IN_FLIGHT_STATUSES)
        )
    }
    newest_run: dict[str, datetime] = {}
    for record in instance.get_run_records(RunsFilter(tags={PARTITION_TAG: keys})):
        key = record.dagster_run.tags.get(PARTITION_TAG, "")
        if key not in newest_run or record.create_timestamp > newest_run[key]:
            newest_run[key] = record.create_timestamp
    with ThreadPoolExecutor(max_workers=S3_THREADS) as pool:
        listed = list(
            pool.map(
                lambda ref: (
                    None if ref.partition_key in in_flight else newest_raw_archive(bucket, ref)
                ),
                [ref for ref, _ in page],
            )
        )
    visits = []
    for (ref, processed_at), found in zip(page, listed, strict=True):
        archive = None
        if found is not None:
            archive, lists = found
            requests.lists += lists
        visits.append(
            Visit(
                ref=ref,
                processed_at=processed_at,
                in_flight=ref.partition_key in in_flight,
                archive=archive,
                newest_run_created=newest_run.get(ref.partition_key),
            )
        )
    return visits


@dataclass
class TickReport:
    """What one reconciliation tick did: the sensor logs it, a benchmark reads it."""

    cursor: Cursor
    run_requests: list[RunRequest] = field(default_factory=list)
    pending_visited: int = 0
    walk_visited: int = 0
    walk_page: int = 0
    episodes: int = 0  # the table's estimated size
    s3: S3Requests = field(default_factory=S3Requests)
    lost: list[str] = field(default_factory=list)
    # Rows the pipeline cannot key, skipped by either pass (each once): named in the tick's log.
    invalid: list[UnkeyableRow] = field(default_factory=list)

    def s3_per_hour(self, settings: ReconcileSettings) -> int:
        return self.s3.total * HOUR_SECONDS // settings.interval_seconds

    def walk_cycle_hours(self, settings: ReconcileSettings) -> float:
        per_tick = max(1, self.walk_page)
        return self.episodes / per_tick * settings.interval_seconds / HOUR_SECONDS

    def describe(self, settings: ReconcileSettings) -> str:
        return (
            f"visited {self.pending_visited} never-processed and {self.walk_visited} walked "
            f"episode(s) (walk page {self.walk_page} of ~{self.episodes}: a full pass every "
            f"{self.walk_cycle_hours(settings):.1f} h); {len(self.run_requests)} lost "
            f"upload(s); S3 requests {self.s3.total} ({self.s3.lists} LIST, {self.s3.heads} "
            f"HEAD), {self.s3_per_hour(settings)} per hour at this pace (budget "
            f"{settings.s3_requests_per_hour})"
            + (
                f"; skipped {len(self.invalid)} row(s) the pipeline cannot key "
                "(episode-pipeline status --invalid)"
                if self.invalid
                else ""
            )
        )


def reconcile_tick(
    instance: DagsterInstance,
    conn: Any,
    bucket: Bucket,
    settings: ReconcileSettings,
    cursor: Cursor,
    now: datetime,
    log: Any = None,
) -> TickReport:
    """One tick: the pending pass, then the walk, each from its own cursor."""
    schema = read_schema(conn)
    pending = pending_episodes(
        conn,
        schema,
        cursor.pending,
        settings.pending_per_tick,
        settings.lost_upload_after_seconds,
        settings.pending_lookback_seconds,
    )
    report = TickReport(cursor=cursor, episodes=estimated_episode_count(conn))
    visits = visit_page(instance, bucket, pending.rows, report.s3)
    report.pending_visited = len(visits)
    report.walk_page = walk_page_size(report.episodes, settings, report.s3.total)
    walk = episodes_after(conn, schema, cursor.walk, report.walk_page)
    seen = {visit.ref for visit in visits}
    walked = visit_page(
        instance, bucket, [row for row in walk.rows if row[0] not in seen], report.s3
    )
    report.walk_visited = len(walk.rows) + len(walk.invalid)
    report.invalid = list(dict.fromkeys([*pending.invalid, *walk.invalid]))
    if log is not None:
        for row in report.invalid:
            log.warning(f"skipped {row.describe()}")
    # Each pass starts over after its last page; an unkeyable last row moves it on all the same.
    report.cursor = Cursor(
        walk=walk.last_id if walk.full else None,
        pending=pending.last_id if pending.full else None,
    )
    suspects = [v for v in [*visits, *walked] if triage(v, settings, now) is None]
    report.run_requests = lost_upload_requests(instance, bucket, suspects, report.s3, log)
    report.lost = [r.partition_key or "" for r in report.run_requests]
    metrics.count(metrics.LOST_UPLOADS_FOUND, len(report.lost))
    return report


def lost_upload_requests(
    instance: DagsterInstance,
    bucket: Bucket,
    suspects: Sequence[Visit],
    requests: S3Requests,
    log: Any = None,
) -> list[RunRequest]:
    """HEAD each suspect's archive (its version id names the upload); one that no run was
    started for, and that was not pruned after succeeding, gets its run."""
    heads: list[tuple[Visit, ObjectInfo]] = []
    for visit in suspects:
        assert visit.archive is not None
        head = bucket.head(visit.archive.key)
        requests.heads += 1
        if head is not None:
            heads.append((visit, head))
    uploads = [upload_id(v.ref.partition_key, h.version_id or h.etag) for v, h in heads]
    handled = set(latest_runs_of_uploads(instance, uploads)) | set(
        pruned_successes(instance, uploads)
    )
    run_requests = []
    for (visit, head), upload in zip(heads, uploads, strict=True):
        if upload in handled:
            if log is not None:
                log.info(f"{visit.ref}: {upload} was handed to a run")
            continue
        report_archive_version(instance, visit.ref.partition_key, head.etag)
        if log is not None:
            log.warning(f"{visit.ref}: upload lost: requesting run {reconciled_run_key(upload)}")
        run_requests.append(
            RunRequest(
                partition_key=visit.ref.partition_key,
                run_key=reconciled_run_key(upload),
                tags={
                    **episode_tags(visit.ref.partition_key),
                    UPLOAD_TAG: upload,
                    RECONCILED_TAG: "true",
                },
            )
        )
    return run_requests
