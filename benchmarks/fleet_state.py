"""The `fleet` stage's deployment, built synthetically but truthfully in the real stores.

One real episode is processed first (`episode-pipeline process` of a sample, the CLI a user
runs): its rows in Dagster's tables are the template. Each synthetic episode then gets what a
processed episode has, in the same tables, in bulk (`COPY`), grown in steps (1,000, then 10,000,
then ...) so every size is measured on the store the smaller one grew into:

- a dynamic partition `fleet/ep-NNNNNNN` (Dagster's own `add_dynamic_partitions`);
- a row in the application's `episodes` (status `processed`), and the same episode in a second
  application database whose ids are `uuid`s and which has `org_id` (the variant the issue names);
- a successful run of the episode job with the tags the upload sensor's runs carry (episode,
  upload, held message, partition, run key, sensor), stored with Dagster's own insertion values
  (`RunStorage._get_run_insertion_values`, serialising a copy of the template's `DagsterRun`);
- the template run's materialization, check and run-lifecycle events (`CLONED_EVENTS`), its
  `asset_event_tags` and `asset_check_executions` rows: the template's rows as Dagster serialised
  them, with the run id, partition key, episode id and timestamps substituted (so the JSON is
  Dagster's own); the step and log events are left out (`fleet_all_events=1` clones them too:
  the real run's 100+ rows an episode);
- the archive in S3 for the first `fleet_s3_objects` episodes (the ones a reconciliation walk
  visits first), with the same object version the runs' upload tags name.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

FLEET_ORG = "fleet"
TEMPLATE_ORG = "fleettpl"
ARCHIVE_NAME = "take.tar.zst"
ARCHIVE_BODY = b"fleet archive placeholder"  # the walk reads only its listing and HEAD
EPISODES_PER_DAY = 10_000  # the fleet: synthetic runs are spread that far apart
CLONED_EVENTS = (
    "ASSET_MATERIALIZATION",
    "ASSET_MATERIALIZATION_PLANNED",
    "ASSET_CHECK_EVALUATION",
    "ASSET_CHECK_EVALUATION_PLANNED",
    # run-lifecycle events keep their legacy names in the `dagster_event_type` column
    "PIPELINE_ENQUEUED",
    "PIPELINE_STARTING",
    "PIPELINE_START",
    "PIPELINE_SUCCESS",
)
DAGSTER_TABLES = (
    "runs",
    "run_tags",
    "event_logs",
    "dynamic_partitions",
    "asset_event_tags",
    "asset_check_executions",
    "asset_keys",
    "kvs",
)
_TIMESTAMP = re.compile(r'("timestamp": )([0-9]+\.[0-9]+)')


def episode_id(index: int) -> str:
    return f"ep-{index:07d}"


def uuid_id(index: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"fleet/{index}"))


def partition_key(index: int) -> str:
    return f"{FLEET_ORG}/{episode_id(index)}"


def archive_key(org: str, episode: str) -> str:
    return f"orgs/{org}/episodes/{episode}/{ARCHIVE_NAME}"


@dataclass
class Template:
    """The real run's rows: what each synthetic episode gets a copy of."""

    run_id: str
    partition_key: str
    episode_id: str
    dagster_run: Any
    events: list[dict[str, Any]]  # event_logs rows (with `id`), in order
    event_tags: list[dict[str, Any]]
    check_executions: list[dict[str, Any]]
    start: float  # the run's first event, time.time()


def dagster_dsn(env: dict[str, str]) -> str:
    return (
        f"host=127.0.0.1 port={env['DB_PORT']} user=postgres password={env['DB_PASSWORD']} "
        "dbname=dagster"
    )


def _rows(conn: psycopg.Connection, query: str, params: Sequence[Any]) -> list[dict[str, Any]]:
    cursor = conn.execute(query, params)
    names = [column.name for column in cursor.description or []]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def capture_template(instance: Any, dsn: str, run_id: str, all_events: bool) -> Template:
    """The real run's rows, read back from Dagster's tables."""
    run = instance.get_run_by_id(run_id)
    key = run.tags["dagster/partition"]
    with psycopg.connect(dsn) as conn:
        events = _rows(conn, "SELECT * FROM event_logs WHERE run_id = %s ORDER BY id", [run_id])
        if not all_events:
            events = [e for e in events if e["dagster_event_type"] in CLONED_EVENTS]
        ids = [e["id"] for e in events]
        tags = _rows(conn, "SELECT * FROM asset_event_tags WHERE event_id = ANY(%s)", [ids])
        checks = _rows(conn, "SELECT * FROM asset_check_executions WHERE run_id = %s", [run_id])
    return Template(
        run_id=run_id,
        partition_key=key,
        episode_id=key.split("/", 1)[1],
        dagster_run=run,
        events=events,
        event_tags=tags,
        check_executions=checks,
        start=min(e["timestamp"] for e in events).replace(tzinfo=UTC).timestamp(),
    )


def storage_of_run(dsn: str, run_id: str, key: str) -> dict[str, dict[str, int]]:
    """Rows and bytes (`pg_column_size` of each row) one run wrote, table by table."""
    queries = {
        "runs": ("SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0) FROM runs t "
                 "WHERE run_id = %s", [run_id]),
        "run_tags": ("SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0) FROM run_tags t "
                     "WHERE run_id = %s", [run_id]),
        "event_logs": ("SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0) FROM event_logs t "
                       "WHERE run_id = %s", [run_id]),
        "asset_event_tags": ("SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0) FROM "
                             "asset_event_tags t WHERE event_id IN (SELECT id FROM event_logs "
                             "WHERE run_id = %s)", [run_id]),
        "asset_check_executions": ("SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0) FROM "
                                   "asset_check_executions t WHERE run_id = %s", [run_id]),
        "dynamic_partitions": ("SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0) FROM "
                               "dynamic_partitions t WHERE partition = %s", [key]),
    }  # fmt: skip
    out = {}
    with psycopg.connect(dsn) as conn:
        for table, (query, params) in queries.items():
            rows, size = conn.execute(query, params).fetchone()  # type: ignore[misc]
            out[table] = {"rows": int(rows), "bytes": int(size)}
    return out


def events_of_run(dsn: str, run_id: str) -> dict[str, Any]:
    """The run's `event_logs` rows and bytes by event type (a log line has none: `LOG`) and by
    step (`run`: the run's own events), most bytes first, and the text of its log lines."""
    query = (
        "SELECT coalesce({}, %s), count(*), sum(pg_column_size(t.*)) FROM event_logs t "
        "WHERE run_id = %s GROUP BY 1 ORDER BY 3 DESC"
    )
    out: dict[str, Any] = {}
    with psycopg.connect(dsn) as conn:
        for column, missing, name in (
            ("dagster_event_type", "LOG", "by_type"),
            ("step_key", "run", "by_step"),
        ):
            rows = conn.execute(query.format(column), [missing, run_id]).fetchall()
            out[name] = {key: {"rows": int(n), "bytes": int(size)} for key, n, size in rows}
        logs = conn.execute(
            "SELECT event FROM event_logs WHERE run_id = %s AND dagster_event_type IS NULL "
            "ORDER BY id",
            [run_id],
        ).fetchall()
    out["log_lines"] = [json.loads(event).get("user_message", "")[:200] for (event,) in logs]
    return out


def store_sizes(dsn: str) -> dict[str, dict[str, int]]:
    """Rows (exact) and on-disk bytes (with indexes and TOAST) of Dagster's tables."""
    out = {}
    with psycopg.connect(dsn) as conn:
        for table in DAGSTER_TABLES:
            rows, size = conn.execute(
                f"SELECT count(*), pg_total_relation_size('{table}') FROM {table}"
            ).fetchone()  # type: ignore[misc]
            out[table] = {"rows": int(rows), "bytes": int(size)}
    return out


@dataclass
class FleetState:
    """The synthetic fleet in the stores, grown with `grow(n)`."""

    env: dict[str, str]
    instance: Any
    settings: Any
    template: Template
    uuid_database: Any  # DatabaseSettings of the `uuid` application database
    s3_objects: int
    size: int = 0
    archive_version: str = ""
    build_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def dsn(self) -> str:
        return dagster_dsn(self.env)

    def grow(self, target: int) -> None:
        """Add episodes `size`..`target - 1` everywhere."""
        if target <= self.size:
            return
        indexes = range(self.size, target)
        self._timed("s3", lambda: self._archives(indexes))
        self._timed("application rows", lambda: self._app_rows(indexes))
        self._timed("dynamic partitions", lambda: self._partitions(indexes))
        for start in range(self.size, target, 5_000):
            chunk = range(start, min(target, start + 5_000))
            self._timed("runs and events", lambda chunk=chunk: self._runs(chunk))
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for table in ("runs", "run_tags", "event_logs", "asset_event_tags",
                          "asset_check_executions", "dynamic_partitions"):  # fmt: skip
                conn.execute(f"ANALYZE {table}")
        self.size = target

    def _timed(self, name: str, call: Any) -> None:
        started = time.perf_counter()
        call()
        self.build_seconds[name] = round(
            self.build_seconds.get(name, 0.0) + time.perf_counter() - started, 2
        )

    # -- S3 and the application's tables ------------------------------------------------------

    def _archives(self, indexes: range) -> None:
        from episode_pipeline.storage.bucket import Bucket

        bucket = Bucket(self.settings.bucket, self.settings.aws)
        wanted = [i for i in indexes if i < self.s3_objects]
        client = bucket.client

        def put(index: int) -> str:
            response = client.put_object(
                Bucket=bucket.name, Key=archive_key(FLEET_ORG, episode_id(index)), Body=ARCHIVE_BODY
            )
            return response.get("VersionId") or response["ETag"]

        with ThreadPoolExecutor(8) as pool:
            versions = set(pool.map(put, wanted))
        if not self.archive_version:
            head = bucket.head(archive_key(FLEET_ORG, episode_id(0))) if wanted else None
            self.archive_version = (head.version_id or head.etag) if head else "fleet-version"
        if len(versions) > 1 and not any(v.startswith('"') for v in versions):
            raise RuntimeError("the bucket is versioned: each archive needs its own upload tag")

    def _app_rows(self, indexes: range) -> None:
        from episode_pipeline.db.connection import connect

        processed = datetime.now(UTC)
        copy_rows = "COPY episodes (id, org_id, status, processed_at) FROM STDIN"
        for database, ids in ((self.settings.database, episode_id), (self.uuid_database, uuid_id)):
            with connect(database) as conn, conn.cursor() as cursor, cursor.copy(copy_rows) as copy:
                for index in indexes:
                    copy.write_row((ids(index), FLEET_ORG, "processed", processed))

    def _partitions(self, indexes: range) -> None:
        from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME

        keys = [partition_key(i) for i in indexes]
        for start in range(0, len(keys), 10_000):
            self.instance.add_dynamic_partitions(
                EPISODES_PARTITION_NAME, keys[start : start + 10_000]
            )

    # -- runs and their events ------------------------------------------------------------------

    def run_tags(self, index: int, run_id: str) -> dict[str, str]:
        """The tags of an upload sensor's run of episode `index` (defs.sensors.sqs.run_tags)."""
        from episode_pipeline.defs.runs import episode_tags, upload_id, upload_run_key
        from episode_pipeline.defs.sensors import sqs

        key = partition_key(index)
        upload = upload_id(key, self.archive_version)
        held = sqs.HeldMessage(str(uuid.uuid5(uuid.NAMESPACE_OID, key)), receipt(key), 1)
        return {
            **episode_tags(key),
            "episode_pipeline/upload": upload,
            **sqs.sqs_tag([held]),
            "dagster/partition": key,
            "dagster/run_key": upload_run_key(upload),
            "dagster/sensor_name": sqs.UPLOADS_SENSOR_NAME,
        }

    def _runs(self, indexes: range) -> None:
        from dagster import DagsterRunStatus
        from dagster._serdes import serialize_value

        template = self.template
        base_run = template.dagster_run
        now = time.time()
        spacing = 86_400 / EPISODES_PER_DAY
        runs_rows: list[tuple[Any, ...]] = []
        tag_rows: list[tuple[Any, ...]] = []
        event_rows: list[tuple[Any, ...]] = []
        event_tag_rows: list[tuple[Any, ...]] = []
        check_rows: list[tuple[Any, ...]] = []
        per_run = len(template.events)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            first_id = int(conn.execute(
                "SELECT setval('event_logs_id_seq', nextval('event_logs_id_seq') + %s) - %s",
                (per_run * len(indexes), per_run * len(indexes)),
            ).fetchone()[0])  # type: ignore[index]  # fmt: skip
        template_ids = {e["id"]: j for j, e in enumerate(template.events)}
        for offset, index in enumerate(indexes):
            run_id = str(uuid.uuid4())
            # Older episodes first: episode `size - 1` ran just now, one every 8.6 s before it.
            shift = now - (index_age(index, spacing, indexes.stop)) - template.start
            run = base_run._replace(
                run_id=run_id, tags=self.run_tags(index, run_id), status=DagsterRunStatus.SUCCESS
            )
            created = datetime.fromtimestamp(template.start + shift, UTC).replace(tzinfo=None)
            runs_rows.append((
                run_id, run.job_snapshot_id, run.job_name, DagsterRunStatus.SUCCESS.value,
                serialize_value(run), partition_key(index), None, created, created,
                template.start + shift, template.start + shift + 8.0,
            ))  # fmt: skip
            tag_rows += [(run_id, k, v) for k, v in run.tags_for_storage().items()]
            substitute = _substitution(template, run_id, index, shift)
            first = first_id + offset * per_run
            for j, event in enumerate(template.events):
                event_rows.append((
                    first + j, run_id, substitute(event["event"]), event["dagster_event_type"],
                    event["timestamp"] + timedelta(seconds=shift), event["step_key"],
                    event["asset_key"], partition_key(index) if event["partition"] else None,
                ))  # fmt: skip
            for tag in template.event_tags:
                value = tag["value"].replace(template.partition_key, partition_key(index))
                event_tag_rows.append((
                    first + template_ids[tag["event_id"]], tag["asset_key"], tag["key"], value,
                    tag["event_timestamp"] + timedelta(seconds=shift),
                ))  # fmt: skip
            for row in template.check_executions:
                check_rows.append((
                    row["asset_key"], row["check_name"], partition_key(index), run_id,
                    row["execution_status"], substitute(row["evaluation_event"] or ""),
                    row["evaluation_event_timestamp"] + timedelta(seconds=shift),
                    _mapped(first, template_ids, row["evaluation_event_storage_id"]),
                    _mapped(first, template_ids, row["materialization_event_storage_id"]),
                    (row["create_timestamp"] or created) + timedelta(seconds=shift),
                ))  # fmt: skip
        with psycopg.connect(self.dsn) as conn, conn.cursor() as cursor:
            _copy(cursor, "runs (run_id, snapshot_id, pipeline_name, status, run_body, partition, "
                  "partition_set, create_timestamp, update_timestamp, start_time, end_time)",
                  runs_rows)  # fmt: skip
            _copy(cursor, "run_tags (run_id, key, value)", tag_rows)
            _copy(cursor, "event_logs (id, run_id, event, dagster_event_type, timestamp, "
                  "step_key, asset_key, partition)", event_rows)  # fmt: skip
            _copy(cursor, "asset_event_tags (event_id, asset_key, key, value, event_timestamp)",
                  event_tag_rows)  # fmt: skip
            _copy(cursor, "asset_check_executions (asset_key, check_name, partition, run_id, "
                  "execution_status, evaluation_event, evaluation_event_timestamp, "
                  "evaluation_event_storage_id, materialization_event_storage_id, "
                  "create_timestamp)", check_rows)  # fmt: skip


def index_age(index: int, spacing: float, newest: int) -> float:
    """How long ago episode `index` ran, seconds (the newest just now)."""
    return (newest - index) * spacing


def receipt(key: str) -> str:
    """A receipt handle as long as SQS's (they run to ~400 characters)."""
    return (uuid.uuid5(uuid.NAMESPACE_DNS, key).hex * 12)[:380]


def _mapped(first: int, template_ids: dict[int, int], storage_id: int | None) -> int | None:
    if storage_id is None:
        return None
    return first + template_ids[storage_id] if storage_id in template_ids else storage_id


def _substitution(template: Template, run_id: str, index: int, shift: float) -> Any:
    """The template's serialised JSON, made episode `index`'s run's: ids, keys and times."""
    new_key = partition_key(index)
    new_episode = episode_id(index)

    def moved(match: re.Match[str]) -> str:
        return f"{match[1]}{float(match[2]) + shift!r}"

    def substitute(text: str) -> str:
        text = text.replace(template.run_id, run_id)
        text = text.replace(template.partition_key, new_key)
        text = text.replace(template.episode_id, new_episode).replace(TEMPLATE_ORG, FLEET_ORG)
        return _TIMESTAMP.sub(moved, text)

    return substitute


def _copy(cursor: psycopg.Cursor, target: str, rows: Iterable[tuple[Any, ...]]) -> None:
    with cursor.copy(f"COPY {target} FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def create_uuid_database(env: dict[str, str], database: Any) -> Any:
    """A second application database: `uuid` ids and `org_id` (the issue's variant)."""
    import dataclasses

    from episode_pipeline.db.connection import connect

    name = f"fleet_app_uuid_{uuid.uuid4().hex[:6]}"
    with connect(database, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    variant = dataclasses.replace(database, name=name)
    from episode_pipeline_tests.test_application_schema import APPLICATION_SCHEMA

    with connect(variant, autocommit=True) as conn:
        conn.execute(APPLICATION_SCHEMA)
        conn.execute("ALTER TABLE episodes ADD COLUMN org_id text")
    return variant
