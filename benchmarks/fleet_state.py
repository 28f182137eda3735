"""The `fleet` stage's deployment, built synthetically but truthfully in the real stores.

One real episode is processed first (`episode-pipeline process` of a sample, the CLI a user
runs): its rows in Dagster's tables are the template. Each synthetic episode then gets what a
processed episode has, in the same tables, in bulk (`COPY`), grown in steps (1,000, then 10,000,
then ...) so every size is measured on the store the smaller one grew into:

- a dynamic partition `fleet/ep-NNNNNNN` (the row `add_dynamic_partitions` inserts);
- a row in the application's `episodes` (status `processed`), and the same episode in a second
  application database whose ids are `uuid`s and which has `org_id` (the variant the issue names);
- a successful run of the episode job with the tags the upload sensor's runs carry (episode,
  upload, held message, partition, run key, sensor): the template's `DagsterRun` serialised once
  by Dagster with a placeholder episode, then compiled (`Compiled`) into literal pieces and slots
  (run id, episode, message id, receipt), so each run is one string join, already `COPY` text;
- the template run's materialization, check and run-lifecycle events (`CLONED_EVENTS`), its
  `asset_event_tags` and `asset_check_executions` rows: the template's rows as Dagster serialised
  them, compiled the same way (run id, episode and serialised times are slots), so the JSON is
  Dagster's own; the step and log events are left out (`fleet_all_events=1` clones them too);
- the archive in S3 for the first `fleet_s3_objects` episodes (the ones a reconciliation walk
  visits first), with the same object version the runs' upload tags name.

After each size one synthetic run is read back through Dagster's API (`verify`). Above
`unpruned_max` a size is what a deployment with retention holds (`settle`, `SettledPlan`): every
application row, but in Dagster only retention's window and the `upload-done` records.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Sequence
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


def application_sizes(database: Any) -> dict[str, dict[str, int]]:
    """Rows and on-disk bytes of an application database's `episodes` table."""
    from episode_pipeline.db.connection import connect

    with connect(database) as conn:
        rows, size = conn.execute(
            "SELECT count(*), pg_total_relation_size('episodes') FROM episodes"
        ).fetchone()  # type: ignore[misc]
    return {"episodes": {"rows": int(rows), "bytes": int(size)}}


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
    unpruned_max: int = 100_000  # beyond: the state a deployment with retention holds
    per_day: int = EPISODES_PER_DAY  # uploads a day: sizes retention's window
    build_seconds: dict[str, float] = field(default_factory=dict)
    settled: dict[str, int] = field(default_factory=dict)  # what `settle` kept, when it ran
    _compiled_runs: Any = None

    @property
    def dsn(self) -> str:
        return dagster_dsn(self.env)

    def grow(self, target: int) -> None:
        """Add episodes `size`..`target - 1` everywhere: up to `unpruned_max` as a deployment
        without retention holds them (every run kept), beyond it as one with retention
        (`settle`)."""
        if target <= self.size:
            return
        if target > self.unpruned_max:
            self.settle(target)
            return
        indexes = range(self.size, target)
        self._timed("s3", lambda: self._archives(indexes))
        self._timed("application rows", lambda: self._app_rows(indexes))
        self._timed("dynamic partitions", lambda: self._partitions(indexes))
        self._timed("runs and events", lambda: self._runs(indexes, target))
        self._timed("analyze", self._analyze)
        self.size = target

    def status_index(self) -> int:
        """An episode Dagster still holds (its runs are inside the window when settled)."""
        held = self.settled.get("window_episodes", self.size) if self.settled else self.size
        return self.size - 1 - held // 2

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
        """The rows `add_dynamic_partitions` inserts (its `create_timestamp` by default)."""
        from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME

        with (
            psycopg.connect(self.dsn) as conn,
            conn.cursor() as cursor,
            cursor.copy(
                "COPY dynamic_partitions (partitions_def_name, partition) FROM STDIN"
            ) as copy,
        ):
            copy.write("".join(f"{EPISODES_PARTITION_NAME}\t{partition_key(i)}\n" for i in indexes))

    # -- runs and their events ------------------------------------------------------------------

    def run_tags(self, index: int, run_id: str) -> dict[str, str]:
        """The tags of an upload sensor's run of episode `index` (`upload_runs.run_tags`)."""
        from episode_pipeline.defs.sensors import sqs
        from episode_pipeline.instance.run_tags import episode_tags, upload_id, upload_run_key
        from episode_pipeline.orchestration.upload_runs import sqs_tag
        from episode_pipeline.uploads.deliveries import HeldMessage

        key = partition_key(index)
        upload = upload_id(key, self.archive_version)
        held = HeldMessage(message_id(key), receipt(key), 1)
        return {
            **episode_tags(key),
            "episode_pipeline/upload": upload,
            **sqs_tag([held]),
            "dagster/partition": key,
            "dagster/run_key": upload_run_key(upload),
            "dagster/sensor_name": sqs.UPLOADS_SENSOR_NAME,
        }

    def _compiled(self) -> CompiledRuns:
        if self._compiled_runs is None:
            self._compiled_runs = CompiledRuns.of(self)
        return self._compiled_runs

    def _runs(self, indexes: range, newest: int) -> None:
        """Runs, tags, events, event tags and check results of episodes `indexes`, as COPY text
        rendered from the compiled template (one join per row), sent while the next chunk is
        rendered."""
        compiled = self._compiled()
        per_run = len(self.template.events)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            first_id = int(
                conn.execute(
                    "SELECT setval('event_logs_id_seq', nextval('event_logs_id_seq') + %s) - %s",
                    (per_run * len(indexes), per_run * len(indexes)),
                ).fetchone()[0]
            )  # type: ignore[index]
        now = time.time()
        chunks = [
            range(s, min(indexes.stop, s + RUN_CHUNK))
            for s in range(indexes.start, indexes.stop, RUN_CHUNK)
        ]
        rendering = 0.0  # of the wall time: the rest is PostgreSQL taking the COPY
        with ThreadPoolExecutor(1) as sender:
            pending = None
            for chunk in chunks:
                first = first_id + (chunk.start - indexes.start) * per_run
                started = time.perf_counter()
                texts = compiled.render(chunk, first, now, newest, self.per_day)
                rendering += time.perf_counter() - started
                if pending is not None:
                    pending.result()
                pending = sender.submit(self._send, texts)
            if pending is not None:
                pending.result()
        key = "runs and events: of which rendering"
        self.build_seconds[key] = round(self.build_seconds.get(key, 0.0) + rendering, 2)
        if indexes:
            self.verify(indexes.stop - 1)

    def verify(self, index: int) -> None:
        """Read one synthetic run back through Dagster's own API, as the sensors and the UI
        read it: its body, tags, events and check results deserialise to the template's."""
        from dagster import DagsterRunStatus
        from dagster._serdes import deserialize_value

        key = partition_key(index)
        runs = self.instance.get_runs(filters=_run_filter(key), limit=2)
        if len(runs) != 1 or runs[0].status != DagsterRunStatus.SUCCESS:
            raise RuntimeError(f"fleet: {key}: {len(runs)} run(s) read back, expected 1 success")
        run = runs[0]
        expected = self.run_tags(index, run.run_id)
        if {k: run.tags.get(k) for k in expected} != expected:
            raise RuntimeError(f"fleet: {key}: tags read back differ from the sensor's")
        events = self.instance.all_logs(run.run_id)
        if len(events) != len(self.template.events):
            raise RuntimeError(f"fleet: {key}: {len(events)} events read back")
        for event in events:
            if event.dagster_event and event.dagster_event.partition not in (None, key):
                raise RuntimeError(f"fleet: {key}: an event names {event.dagster_event.partition}")
        with psycopg.connect(self.dsn) as conn:
            bodies = conn.execute(
                "SELECT evaluation_event FROM asset_check_executions WHERE run_id = %s",
                [run.run_id],
            ).fetchall()
        if len(bodies) != len(self.template.check_executions):
            raise RuntimeError(f"fleet: {key}: {len(bodies)} check results read back")
        for (body,) in bodies:
            named = deserialize_value(body).dagster_event.partition if body else None
            if named not in (None, key):
                raise RuntimeError(f"fleet: {key}: a check result names {named}")

    def _send(self, texts: dict[str, str]) -> None:
        with psycopg.connect(self.dsn) as conn, conn.cursor() as cursor:
            for target, text in texts.items():
                with cursor.copy(f"COPY {target} FROM STDIN") as copy:
                    copy.write(text)

    # -- a deployment with retention: the window, the records, the application's N -----------

    def settle(self, target: int) -> None:
        """The state a deployment with retention holds at `target` episodes: every application
        row, Dagster's runs and partitions of the newest `window` episodes only, the upload
        records of the successes retention pruned within `upload_record_days`. Episodes already
        in the store and older than the window are pruned with retention's own statements."""
        from episode_pipeline.config.settings import RetentionSettings

        plan = SettledPlan.of(self.size, target, self.per_day, RetentionSettings())
        indexes = range(self.size, target)
        self._timed("s3", lambda: self._archives(indexes))
        self._timed("application rows", lambda: self._app_rows(indexes))
        self._timed("pruned by retention", lambda: self._prune(plan.pruned, plan.record_start))
        self._timed("dynamic partitions", lambda: self._partitions(plan.new_runs))
        self._timed("runs and events", lambda: self._runs(plan.new_runs, target))
        self._timed("upload records", lambda: self._records(plan.new_records, target))
        # What autovacuum keeps a pruned deployment at: the live rows, not the 100,000's pages.
        self._timed("vacuum", lambda: self._analyze(full=True))
        self.settled = {
            "window_episodes": len(plan.window),
            "upload_records": plan.window.start - plan.record_start,
            "application_rows": target,
            "pruned_from_store": len(plan.pruned),
        }
        self.size = target

    def _prune(self, indexes: range, record_start: int) -> None:
        """Retention's delete (`dagster_tables.delete_episodes`), in bigger batches; the records of
        episodes older than `upload_record_days` expire as the retention sensor expires them."""
        from episode_pipeline.orchestration import dagster_tables

        keys = [partition_key(i) for i in indexes]
        with dagster_tables.connect(self.instance) as conn:
            for start in range(0, len(keys), PRUNE_BATCH):
                dagster_tables.delete_episodes(conn, keys[start : start + PRUNE_BATCH])
        expired = [self.record_key(i) for i in indexes if i < record_start]
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for start in range(0, len(expired), PRUNE_BATCH):
                conn.execute(
                    "DELETE FROM kvs WHERE key = ANY(%s)", [expired[start : start + PRUNE_BATCH]]
                )

    def record_key(self, index: int) -> str:
        from episode_pipeline.instance.app_state import upload_done_key
        from episode_pipeline.instance.run_tags import upload_id

        return upload_done_key(upload_id(partition_key(index), self.archive_version))

    def _records(self, indexes: range, newest: int) -> None:
        """`upload-done` records (app_state.upload_record) of successes pruned since."""
        from episode_pipeline.instance.app_state import upload_record

        now = time.time()
        spacing = 86_400 / self.per_day
        copy_records = "COPY kvs (key, value) FROM STDIN"
        with (
            psycopg.connect(self.dsn) as conn,
            conn.cursor() as cursor,
            cursor.copy(copy_records) as copy,
        ):
            for index in indexes:
                ended = now - index_age(index, spacing, newest) + 8.0
                copy.write_row((self.record_key(index), upload_record(str(uuid.uuid4()), ended)))

    def _analyze(self, full: bool = False) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for table in DAGSTER_TABLES:
                conn.execute(f"VACUUM FULL ANALYZE {table}" if full else f"ANALYZE {table}")


@dataclass(frozen=True)
class SettledPlan:
    """Which episodes `settle` gives what, growing a store of `size` episodes to `target`.

    Episodes are numbered oldest first, one every 86,400 / `per_day` s, the newest just now.
    """

    window: range  # the newest episodes: runs, events and partitions in Dagster
    record_start: int  # the oldest episode whose `upload-done` record has not expired
    pruned: range  # episodes already in the store and older than the window: deleted
    new_runs: range  # window episodes not in the store yet: runs to build
    new_records: range  # records to write (the pruned ones got theirs from the delete)

    @classmethod
    def of(cls, size: int, target: int, per_day: int, retention: Any) -> SettledPlan:
        window = round(retention.episode_days * per_day)
        records = round((retention.upload_record_days - retention.episode_days) * per_day)
        window_start = max(0, target - window)
        record_start = max(0, window_start - records)
        pruned_end = min(size, window_start)
        return cls(
            window=range(window_start, target),
            record_start=record_start,
            pruned=range(0, pruned_end),
            new_runs=range(max(size, window_start), target),
            new_records=range(max(record_start, pruned_end), window_start),
        )


RUN_CHUNK = 2_000  # episodes rendered per COPY transaction
PRUNE_BATCH = 10_000  # episodes per retention delete while settling (the sensor's is 500)
SENTINEL = 9_999_999  # the placeholder episode the run template is serialised with


def _run_filter(key: str) -> Any:
    from dagster import RunsFilter

    return RunsFilter(tags={"dagster/partition": key})


def message_id(key: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_OID, key))


class Compiled:
    """A serialised text with its per-run parts cut out: literal pieces (already escaped for
    COPY's text format) between named slots or timestamps; rendering is one join."""

    def __init__(self, text: str, slots: dict[str, str], timestamps: bool) -> None:
        names = {old: name for old, name in slots.items() if old}
        alternatives = [re.escape(old) for old in sorted(names, key=len, reverse=True)]
        if timestamps:
            alternatives.append(_TIMESTAMP.pattern)
        pattern = re.compile("|".join(f"(?:{a})" for a in alternatives) or r"(?!x)x")
        self.literals: list[str] = []
        self.slots: list[str | float] = []
        position = 0
        for match in pattern.finditer(text):
            if match.group(0) in names:
                self.literals.append(copy_escape(text[position : match.start()]))
                self.slots.append(names[match.group(0)])
            else:  # a timestamp: keep `"timestamp": `, move the number
                number_at = match.start(0) + len(match.group(0)) - len(match.group(0).split()[-1])
                self.literals.append(copy_escape(text[position:number_at]))
                self.slots.append(float(text[number_at : match.end()]))
            position = match.end()
        self.literals.append(copy_escape(text[position:]))

    def render(self, values: dict[str, str], shift: float) -> str:
        out = [self.literals[0]]
        for slot, literal in zip(self.slots, self.literals[1:], strict=True):
            out.append(values[slot] if isinstance(slot, str) else repr(slot + shift))
            out.append(literal)
        return "".join(out)


def copy_escape(text: str) -> str:
    """COPY's text format: backslash, tab, newline and carriage return escaped."""
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _null(value: Any) -> str:
    return "\\N" if value is None else copy_escape(str(value))


@dataclass
class CompiledRuns:
    """The template run, its tags, events, event tags and check results, compiled once."""

    run_body: Compiled
    run_head: str  # snapshot id, job name, status (COPY text)
    tags: list[tuple[str, Compiled]]
    events: list[tuple[int, Compiled, str, datetime, bool]]  # id, body, columns, time, partition
    event_tags: list[tuple[int, str, Compiled, datetime]]  # event index, asset/key, value, time
    checks: list[tuple[str, str, Compiled, datetime, int | None, int | None, datetime | None]]
    start: float
    template_ids: dict[int, int]

    @classmethod
    def of(cls, state: FleetState) -> CompiledRuns:
        from dagster import DagsterRunStatus
        from dagster._serdes import serialize_value

        template = state.template
        sentinel_key = partition_key(SENTINEL)
        sentinel_run = str(uuid.UUID(int=SENTINEL))
        # Slots of the run body: what differs between two episodes' runs of the sensor.
        run_slots = {
            sentinel_run: "run",
            receipt(sentinel_key): "receipt",
            message_id(sentinel_key): "message",
            episode_id(SENTINEL): "episode",
        }
        run = template.dagster_run._replace(
            run_id=sentinel_run,
            tags=state.run_tags(SENTINEL, sentinel_run),
            status=DagsterRunStatus.SUCCESS,
        )

        def of_template(text: str, timestamps: bool = True) -> Compiled:
            return compile_template_text(template, text, timestamps)

        template_ids = {e["id"]: j for j, e in enumerate(template.events)}
        events = []
        for event in template.events:
            columns = "\t".join(
                (event["dagster_event_type"], _null(event["step_key"]), _null(event["asset_key"]))
            )
            events.append(
                (
                    event["id"],
                    of_template(event["event"]),
                    columns,
                    event["timestamp"],
                    bool(event["partition"]),
                )
            )
        event_tags = [
            (
                template_ids[tag["event_id"]],
                f"{_null(tag['asset_key'])}\t{_null(tag['key'])}",
                of_template(tag["value"], timestamps=False),
                tag["event_timestamp"],
            )
            for tag in template.event_tags
        ]
        checks = [
            (
                f"{_null(row['asset_key'])}\t{_null(row['check_name'])}",
                _null(row["execution_status"]),
                of_template(row["evaluation_event"] or ""),
                row["evaluation_event_timestamp"],
                row["evaluation_event_storage_id"],
                row["materialization_event_storage_id"],
                row["create_timestamp"],
            )
            for row in template.check_executions
        ]
        return cls(
            run_body=Compiled(serialize_value(run), run_slots, timestamps=False),
            run_head="\t".join(
                (_null(run.job_snapshot_id), _null(run.job_name), DagsterRunStatus.SUCCESS.value)
            ),
            tags=[
                (copy_escape(k), Compiled(v, run_slots, timestamps=False))
                for k, v in run.tags_for_storage().items()
            ],
            events=events,
            event_tags=event_tags,
            checks=checks,
            start=template.start,
            template_ids=template_ids,
        )

    def render(
        self, indexes: range, first_id: int, now: float, newest: int, per_day: int
    ) -> dict[str, str]:
        """COPY text of each table for the runs of episodes `indexes` (event ids from
        `first_id`); episode `newest - 1` ran just now, `per_day` a day before it."""
        spacing = 86_400 / per_day
        runs, tags, events, event_tags, checks = [], [], [], [], []
        per_run = len(self.events)
        for offset, index in enumerate(indexes):
            run_id = str(uuid.uuid4())
            key = partition_key(index)
            values = {
                "run": run_id,
                "episode": episode_id(index),
                "message": message_id(key),
                "receipt": receipt(key),
            }
            shift = now - index_age(index, spacing, newest) - self.start
            started = self.start + shift
            created = _utc(started)
            runs.append(
                f"{run_id}\t{self.run_head}\t{self.run_body.render(values, 0.0)}\t"
                f"{key}\t\\N\t{created}\t{created}\t{started!r}\t{started + 8.0!r}\n"
            )
            for name, value in self.tags:
                tags.append(f"{run_id}\t{name}\t{value.render(values, 0.0)}\n")
            moved = timedelta(seconds=shift)
            first = first_id + offset * per_run
            for j, (_, body, columns, at, has_partition) in enumerate(self.events):
                events.append(
                    f"{first + j}\t{run_id}\t{body.render(values, shift)}\t{columns}\t"
                    f"{at + moved}\t{key if has_partition else chr(92) + 'N'}\n"
                )
            for j, names, value, at in self.event_tags:
                event_tags.append(
                    f"{first + j}\t{names}\t{value.render(values, 0.0)}\t{at + moved}\n"
                )
            for names, status, body, at, evaluation, materialization, made in self.checks:
                checks.append(
                    f"{names}\t{key}\t{run_id}\t{status}\t{body.render(values, shift)}\t"
                    f"{at + moved}\t{self._mapped(first, evaluation)}\t"
                    f"{self._mapped(first, materialization)}\t{(made or created) + moved}\n"
                )
        return {
            "runs (run_id, snapshot_id, pipeline_name, status, run_body, partition, "
            "partition_set, create_timestamp, update_timestamp, start_time, end_time)": "".join(
                runs
            ),
            "run_tags (run_id, key, value)": "".join(tags),
            "event_logs (id, run_id, event, dagster_event_type, step_key, asset_key, "
            "timestamp, partition)": "".join(events),
            "asset_event_tags (event_id, asset_key, key, value, event_timestamp)": "".join(
                event_tags
            ),
            "asset_check_executions (asset_key, check_name, partition, run_id, "
            "execution_status, evaluation_event, evaluation_event_timestamp, "
            "evaluation_event_storage_id, materialization_event_storage_id, "
            "create_timestamp)": "".join(checks),
        }

    def _mapped(self, first: int, storage_id: int | None) -> str:
        if storage_id is None:
            return "\\N"
        return str(
            first + self.template_ids[storage_id] if storage_id in self.template_ids else storage_id
        )


def compile_template_text(template: Template, text: str, timestamps: bool = True) -> Compiled:
    """A row of the template run, compiled: its org is the fleet's; its run id, its episode id
    (which names the org too) and, with `timestamps`, its serialised times are slots."""
    slots = {
        template.run_id: "run",
        template.episode_id.replace(TEMPLATE_ORG, FLEET_ORG): "episode",
    }
    return Compiled(text.replace(TEMPLATE_ORG, FLEET_ORG), slots, timestamps)


def _utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC).replace(tzinfo=None)


def index_age(index: int, spacing: float, newest: int) -> float:
    """How long ago episode `index` ran, seconds (the newest just now)."""
    return (newest - index) * spacing


def receipt(key: str) -> str:
    """A receipt handle as long as SQS's (they run to ~400 characters)."""
    return (uuid.uuid5(uuid.NAMESPACE_DNS, key).hex * 12)[:380]


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
