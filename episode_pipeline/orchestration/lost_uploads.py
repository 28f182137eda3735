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

`evaluate_waiting_uploads` is the `waiting_uploads` sensor's tick, `reconcile_tick` its work (the
benchmarks call it too); the rule, without I/O, is `uploads/lost_uploads.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dagster import (
    DagsterInstance,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
)

from episode_pipeline.config.settings import ReconcileSettings
from episode_pipeline.db.episodes import (
    episodes_after,
    estimated_episode_count,
    pending_episodes,
)
from episode_pipeline.db.schema_check import read_schema
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.episodes.keys import (
    EpisodeRef,
    UnkeyableRow,
)
from episode_pipeline.instance.app_state import pruned_successes
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
from episode_pipeline.orchestration.runs import (
    known_partitions,
    latest_runs_of_uploads,
    new_partitions_request,
)
from episode_pipeline.runtime import metrics
from episode_pipeline.storage.bucket import Bucket, ObjectInfo
from episode_pipeline.uploads.listing import newest_raw_archive
from episode_pipeline.uploads.lost_uploads import (
    HOUR_SECONDS,
    Cursor,
    Visit,
    triage,
    walk_page_size,
)

S3_THREADS = 16  # LISTs of one page side by side: a tick of thousands stays within seconds


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


def evaluate_waiting_uploads(
    context: SensorEvaluationContext,
    postgres: PostgresResource,
    bucket: Bucket,
    settings: ReconcileSettings,
) -> SensorResult | SkipReason:
    """One tick of the `waiting_uploads` sensor: a run for each lost upload, the cursor moved on."""
    with postgres.connect() as conn:
        report = reconcile_tick(
            context.instance,
            conn,
            bucket,
            settings,
            Cursor.parse(context.cursor),
            datetime.now(UTC),
            log=context.log,
        )
    summary = report.describe(settings)
    context.log.info(summary)
    context.update_cursor(report.cursor.to_json())
    if not report.run_requests:
        return SkipReason(summary)
    return SensorResult(
        run_requests=report.run_requests,
        dynamic_partitions_requests=new_partitions_request(
            report.lost, known_partitions(context.instance, report.lost)
        ),
    )
