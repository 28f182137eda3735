"""The run-status sensors on the real daemon: a tick that sees mixed runs never fails or wedges.

Dagster fails a run-status sensor's tick that yields both a run reaction and a `SkipReason`,
without moving its cursor, so every later tick would fail on the same pair. One tick here sees,
for `episode_upload_done`, two succeeded runs that hold a message around one that holds none (a
backfill's run), and for `episode_failed_on_run_failure` a failed run that changes its episode
beside one that changes nothing: every message must be deleted, the episode marked `failed`,
and no tick of either sensor fail.

The run-status sensors' per-tick limits (`config/daemon_throughput.py`) are environment
variables of the code server, set when the code location loads: one tick of the daemon's
`episode_upload_done` must release more succeeded runs than Dagster's defaults allow (25 read,
5 acted on).

The runs are recorded straight into the daemon's instance (their workers would be ECS tasks;
running them here costs minutes and decides nothing the sensors read): the daemon, its code
server, the queue and the database are real. Reuses the crash tests' private instance and queue.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from dagster import (
    DagsterEvent,
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
)

from episode_pipeline.config import daemon_throughput as throughput
from episode_pipeline.db.connection import connect
from episode_pipeline.db.episodes import PROCESSING, ensure_episode_row, episode_row
from episode_pipeline.defs.sensors.sqs import UPLOAD_DONE_SENSOR_NAME
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_tags import EPISODE_JOB_NAME, PARTITION_TAG, episode_tags
from episode_pipeline.orchestration.upload_runs import sqs_tag
from episode_pipeline.uploads.deliveries import HeldMessage
from episode_pipeline_tests.support.daemon import CrashStage, Daemon, wait_until
from episode_pipeline_tests.support.dagster_internals import (
    InProcessCodeLocationOrigin,
    InstigatorTick,
    LoadableTargetOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
    TickStatus,
    create_run_for_test,
)
from episode_pipeline_tests.support.queues import depth

pytestmark = pytest.mark.integration

FAILURE_SENSOR_NAME = "episode_failed_on_run_failure"
SENSOR_START_SECONDS = 180  # the daemon and its code server start, each sensor ticks once
REACT_SECONDS = 120
RECEIVE_SECONDS = 60  # the uploads sensor may hold our message for the queue's 24 s
DAGSTER_FETCH_LIMIT, DAGSTER_PROCESS_LIMIT = 25, 5  # Dagster's defaults, per tick
BURST = DAGSTER_FETCH_LIMIT + DAGSTER_PROCESS_LIMIT  # 6 ticks at least with the defaults

# The code location as the daemon loads it (episode_pipeline/local/workspace.yaml): a
# run-status sensor only looks at runs of its own location and repository.
JOB_ORIGIN = RemoteJobOrigin(
    repository_origin=RemoteRepositoryOrigin(
        code_location_origin=InProcessCodeLocationOrigin(
            LoadableTargetOrigin(module_name="episode_pipeline.definitions"),
            location_name="episode_pipeline",
        ),
        repository_name="__repository__",
    ),
    job_name=EPISODE_JOB_NAME,
)


def sensor_ticks(instance: DagsterInstance, name: str) -> list[InstigatorTick]:
    states = [s for s in instance.all_instigator_state() if s.instigator_name == name]
    return [
        tick
        for state in states
        for tick in instance.get_ticks(state.instigator_origin_id, state.selector_id)
    ]


def started_run(instance: DagsterInstance, tags: dict[str, str]) -> DagsterRun:
    return create_run_for_test(
        instance,
        job_name=EPISODE_JOB_NAME,
        status=DagsterRunStatus.STARTED,
        tags=tags,
        remote_job_origin=JOB_ORIGIN,
    )


def finish(instance: DagsterInstance, run: DagsterRun, event_type: DagsterEventType) -> None:
    """The event a run worker reports at its end: what the run-status sensors read."""
    instance.report_dagster_event(
        DagsterEvent(event_type_value=event_type.value, job_name=run.job_name), run.run_id
    )


def held_messages(stage: CrashStage, bodies: list[str]) -> list[HeldMessage]:
    """Messages on the stage's queue, received and hidden long enough that only their runs'
    success can remove them. Another message received meanwhile (the bucket's s3:TestEvent) is
    made visible again for the daemon's uploads sensor, which deletes it."""
    client, url = stage.queue.client, stage.queue.queue_url
    for start in range(0, len(bodies), 10):
        entries = [{"Id": str(i), "MessageBody": b} for i, b in enumerate(bodies[start:][:10])]
        client.send_message_batch(QueueUrl=url, Entries=entries)
    held: dict[str, HeldMessage] = {}
    deadline = time.monotonic() + RECEIVE_SECONDS
    while len(held) < len(bodies) and time.monotonic() < deadline:
        received = client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=900, WaitTimeSeconds=1
        ).get("Messages", [])
        for message in received:
            if message["Body"] in bodies:
                held[message["Body"]] = HeldMessage(
                    message["MessageId"], message["ReceiptHandle"], 1
                )
                continue
            client.change_message_visibility(
                QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
            )
    missing = sorted(set(bodies) - set(held))
    assert not missing, f"messages {missing} not received within {RECEIVE_SECONDS} s"
    return [held[body] for body in bodies]


@pytest.fixture(scope="module")
def daemon(crash_stage: CrashStage) -> Iterator[tuple[Daemon, DagsterInstance]]:
    """The daemon, once both run-status sensors have ticked (their first tick only sets the
    cursor: runs that end after it are theirs)."""
    daemon = Daemon(crash_stage, "run-status-sensors")
    try:
        with DagsterInstance.from_config(str(crash_stage.dagster_home)) as instance:
            ticked: Callable[[], bool] = lambda: all(  # noqa: E731
                sensor_ticks(instance, name)
                for name in (UPLOAD_DONE_SENSOR_NAME, FAILURE_SENSOR_NAME)
            )
            wait_until(ticked, SENSOR_START_SECONDS, lambda: f"no first ticks:\n{daemon.tail()}")
            yield daemon, instance
    finally:
        daemon.stop()


def test_a_tick_of_mixed_runs_deletes_every_message_and_marks_every_episode(
    crash_stage: CrashStage,
    daemon: tuple[Daemon, DagsterInstance],
    db_conn,
) -> None:
    stage = crash_stage
    process, instance = daemon
    before = {
        name: {t.tick_id for t in sensor_ticks(instance, name)}
        for name in (UPLOAD_DONE_SENSOR_NAME, FAILURE_SENSOR_NAME)
    }

    ref = EpisodeRef("test-org", f"ep-mixed-{uuid.uuid4().hex[:8]}")
    holding = [
        started_run(
            instance,
            {**episode_tags(ref.partition_key), **sqs_tag([message])},
        )
        for message in held_messages(stage, ["first upload", "second upload"])
    ]
    backfill = started_run(instance, {"dagster/backfill": "reprocess"})
    processing = EpisodeRef("test-org", f"ep-failing-{uuid.uuid4().hex[:8]}")
    ensure_episode_row(db_conn, processing)
    db_conn.execute(
        "UPDATE episodes SET status = %s WHERE id = %s",
        (PROCESSING, processing.episode_id),
    )
    failing = started_run(
        instance,
        {**episode_tags(processing.partition_key), PARTITION_TAG: processing.partition_key},
    )
    unrelated = started_run(instance, {})  # a run of no episode: changes nothing
    # Back to back, so the next tick of each sensor sees all of its runs.
    for run in (holding[0], backfill, holding[1]):
        finish(instance, run, DagsterEventType.RUN_SUCCESS)
    for run in (unrelated, failing):
        finish(instance, run, DagsterEventType.RUN_FAILURE)

    def status() -> str:
        with connect(stage.settings.database) as conn:
            return episode_row(conn, processing)["status"]

    def new_ticks(name: str) -> list[InstigatorTick]:
        return [t for t in sensor_ticks(instance, name) if t.tick_id not in before[name]]

    def reacted() -> bool:
        for name in before:  # a failed tick fails the test at once, not at the deadline
            failed = [t.error for t in new_ticks(name) if t.status == TickStatus.FAILURE]
            assert not failed, (name, failed)
        return depth(stage.queue) == (0, 0) and status() == "failed"

    wait_until(
        reacted,
        REACT_SECONDS,
        lambda: f"queue {depth(stage.queue)}, episode {status()}\n{process.tail()}",
    )
    assert all(new_ticks(name) for name in before)
    assert depth(stage.dlq) == (0, 0)


def test_one_done_tick_releases_more_runs_than_dagster_s_default_limits(
    crash_stage: CrashStage, daemon: tuple[Daemon, DagsterInstance]
) -> None:
    assert throughput.RUN_STATUS_SENSOR_PROCESS_LIMIT >= BURST  # else this proves nothing
    stage = crash_stage
    process, instance = daemon
    messages = held_messages(stage, [f"burst upload {index}" for index in range(BURST)])
    runs = [
        started_run(
            instance,
            {**episode_tags(f"test-org/ep-burst-{uuid.uuid4().hex[:8]}"), **sqs_tag([message])},
        )
        for message in messages
    ]
    first_success = time.time()
    for run in runs:
        finish(instance, run, DagsterEventType.RUN_SUCCESS)
    wait_until(
        lambda: depth(stage.queue) == (0, 0),
        REACT_SECONDS,
        lambda: f"queue {depth(stage.queue)}\n{process.tail()}",
    )
    released = time.time()
    ticks = [
        tick
        for tick in sensor_ticks(instance, UPLOAD_DONE_SENSOR_NAME)
        if tick.timestamp <= released and (tick.end_timestamp or released) >= first_success
    ]
    # With Dagster's limits the burst needs 6 ticks; one reporting the burst half done, one
    # with the rest, one begun before the empty queue was seen.
    assert 1 <= len(ticks) <= 3, [(t.timestamp, t.end_timestamp, t.status) for t in ticks]
    assert not [t.error for t in ticks if t.status == TickStatus.FAILURE]
