"""Retention on Dagster's real PostgreSQL storage (docs/retention.md).

Pruning never deletes a run in flight, a run within the window, a failed episode's runs before
its longer window, or an episode whose newer upload waits for its run; it deletes the rest of a
settled episode (runs, tags, events, observations, partition) in batched statements. A
redelivered message of a pruned upload is deleted without a second run, and a pruned episode is
reprocessed as a backfill with its partition back.

The runs are recorded straight into a private instance with their timestamps moved back in
time (a run worker would take minutes and decide nothing the pruning reads).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    DagsterEvent,
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    RunsFilter,
    SensorResult,
    SkipReason,
    build_sensor_context,
)

from episode_pipeline.config.settings import RetentionSettings, Settings
from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME
from episode_pipeline.defs.resources.aws import aws_fields
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.defs.resources.sqs import UploadQueueResource
from episode_pipeline.defs.sensors import sqs
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance import app_state
from episode_pipeline.instance.app_state import pruned_successes
from episode_pipeline.instance.run_tags import (
    EPISODE_JOB_NAME,
    PARTITION_TAG,
    UPLOAD_TAG,
    episode_tags,
    upload_id,
)
from episode_pipeline.local import aws_setup
from episode_pipeline.local.stack import StackInfo
from episode_pipeline.local.upload import upload_episode
from episode_pipeline.orchestration import upload_runs
from episode_pipeline.orchestration.archive_versions import report_archive_version
from episode_pipeline.orchestration.retention import (
    DAY_SECONDS,
    EpisodeRuns,
    prunable,
    prune,
)
from episode_pipeline.reprocess import (
    BACKFILL_DAEMON,
    DAEMON_FRESH_SECONDS,
    NO_DAEMON,
    Selection,
    backfill_daemon_running,
    reprocess,
    selection_sql,
)
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline.uploads.reasons import RecordedReason
from episode_pipeline.uploads.upload_queue import UploadQueue
from episode_pipeline_tests.support.dagster_internals import (
    BACKFILL_ID_TAG,
    AssetObservationData,
    BulkActionStatus,
    StepMaterializationData,
    create_run_for_test,
)
from episode_pipeline_tests.support.instances import private_instance
from episode_pipeline_tests.support.runs import backfill_daemon

POLICY = RetentionSettings(episode_days=3, failed_episode_days=19, upload_record_days=21)
NOW = time.time()


# -- the rule (pure) ----------------------------------------------------------------------------


def summary(status: str = "SUCCESS", ended_days_ago: float = 5, **changes: object) -> EpisodeRuns:
    ended = NOW - ended_days_ago * DAY_SECONDS
    return dataclasses.replace(EpisodeRuns("org/ep", False, status, ended, ended - 60), **changes)


def test_only_a_settled_episode_past_its_window_is_prunable() -> None:
    assert prunable(summary(), POLICY, NOW)
    assert not prunable(summary(ended_days_ago=2), POLICY, NOW)  # within the window
    assert not prunable(summary(in_flight=True), POLICY, NOW)
    assert not prunable(summary("FAILURE"), POLICY, NOW)  # its message may sit in the DLQ
    assert prunable(summary("FAILURE", ended_days_ago=20), POLICY, NOW)
    waiting = summary(newest_observation=NOW - DAY_SECONDS)  # a re-upload after its last run
    assert not prunable(waiting, POLICY, NOW)


def test_windows_must_nest() -> None:
    with pytest.raises(RuntimeError, match="RETENTION_EPISODE_DAYS"):
        RetentionSettings(episode_days=20)


def test_a_pruned_success_is_done_and_nothing_else_changes() -> None:
    upload = "org/ep@etag"
    assert upload_runs.decide(upload, None, "run-1").outcome is upload_runs.Outcome.DONE_PRUNED
    assert upload_runs.decide(upload, None).outcome is upload_runs.Outcome.START


def test_reprocess_filters_become_one_query() -> None:
    query, params = selection_sql(Selection(org="acme", status="failed"), has_updated_at=False)
    assert "org_id = %s AND status = %s" in query and params == ("acme", "failed")
    with pytest.raises(ValueError, match="updated_at"):
        selection_sql(Selection(since=datetime.now(UTC)), False)
    with pytest.raises(ValueError, match="name episodes"):
        selection_sql(Selection(), True)


# -- on the real storage ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def instance(stack: StackInfo) -> Iterator[DagsterInstance]:
    """A Dagster instance of its own in the session's PostgreSQL: pruning sees only our runs."""
    with private_instance(stack, "retention") as private:
        yield private


def new_ref() -> EpisodeRef:
    return EpisodeRef("test-org", f"ep-ret-{uuid.uuid4().hex[:8]}")


def backdate(instance: DagsterInstance, run_id: str, days: float) -> None:
    """Move the run (and what it wrote) `days` into the past."""
    stamp = NOW - days * DAY_SECONDS
    with instance.run_storage.connect() as conn:  # type: ignore[attr-defined]
        conn.execute(
            sa.text(
                "UPDATE runs SET end_time = :end, start_time = :end - 60,"
                " create_timestamp = to_timestamp(:end - 120) AT TIME ZONE 'UTC',"
                " update_timestamp = to_timestamp(:end) AT TIME ZONE 'UTC' WHERE run_id = :id"
            ),
            {"end": stamp, "id": run_id},
        )
        conn.execute(
            sa.text(
                "UPDATE event_logs SET timestamp = to_timestamp(:end) AT TIME ZONE 'UTC'"
                " WHERE run_id = :id"
            ),
            {"end": stamp, "id": run_id},
        )


def record_run(
    instance: DagsterInstance,
    ref: EpisodeRef,
    status: DagsterRunStatus,
    ended_days_ago: float | None,
    upload: str | None = None,
) -> DagsterRun:
    """A run of the episode as the daemon leaves it: tags, a materialization and an engine
    event in the event log, ended `ended_days_ago` (None: still in flight)."""
    tags = {**episode_tags(ref.partition_key), PARTITION_TAG: ref.partition_key}
    if upload:
        tags[UPLOAD_TAG] = upload
    run = create_run_for_test(instance, job_name=EPISODE_JOB_NAME, status=status, tags=tags)
    instance.report_engine_event("step started", run)
    materialization = AssetMaterialization(asset_key="frames", partition=ref.partition_key)
    instance.report_dagster_event(
        DagsterEvent(
            event_type_value=DagsterEventType.ASSET_MATERIALIZATION.value,
            job_name=EPISODE_JOB_NAME,
            event_specific_data=StepMaterializationData(materialization),
        ),
        run.run_id,
    )
    if ended_days_ago is not None:
        backdate(instance, run.run_id, ended_days_ago)
    return run


def episode(instance: DagsterInstance, *runs: tuple[DagsterRunStatus, float | None]) -> EpisodeRef:
    ref = new_ref()
    instance.add_dynamic_partitions(EPISODES_PARTITION_NAME, [ref.partition_key])
    for status, days in runs:
        record_run(instance, ref, status, days, upload=upload_id(ref.partition_key, "v1"))
    return ref


def state(instance: DagsterInstance, ref: EpisodeRef) -> tuple[int, int, bool]:
    """(runs, event log rows, partition present) of the episode."""
    runs = instance.get_runs(RunsFilter(tags={PARTITION_TAG: ref.partition_key}))
    events = sum(len(instance.all_logs(run.run_id)) for run in runs)
    present = instance.has_dynamic_partition(EPISODES_PARTITION_NAME, ref.partition_key)
    return len(runs), events, present


@pytest.mark.integration
def test_pruning_deletes_settled_episodes_and_nothing_in_flight_or_within_its_window(
    instance: DagsterInstance,
) -> None:
    settled = episode(instance, (DagsterRunStatus.FAILURE, 6), (DagsterRunStatus.SUCCESS, 5))
    report_archive_version(instance, settled.partition_key, "v1")  # its upload's observation
    with instance.run_storage.connect() as conn:  # type: ignore[attr-defined]
        conn.execute(
            sa.text(
                "UPDATE event_logs SET timestamp = now() - interval '7 days'"
                " WHERE run_id = '' AND partition = :key"
            ),
            {"key": settled.partition_key},
        )
    recent = episode(instance, (DagsterRunStatus.SUCCESS, 2))
    in_flight = episode(instance, (DagsterRunStatus.SUCCESS, 5), (DagsterRunStatus.STARTED, None))
    failed = episode(instance, (DagsterRunStatus.FAILURE, 5))
    waiting = episode(instance, (DagsterRunStatus.SUCCESS, 5))
    report_archive_version(instance, waiting.partition_key, "v2")  # re-uploaded, run to come
    kept = {ref: state(instance, ref) for ref in (recent, in_flight, failed, waiting)}
    assert state(instance, settled)[:2] == (2, 4)

    report = prune(instance, POLICY, now=NOW)

    assert state(instance, settled) == (0, 0, False)
    assert report.episodes >= 1 and report.runs >= 2 and report.partitions >= 1
    assert report.event_logs >= 5  # 2 runs' events and the observation
    assert {ref: state(instance, ref) for ref in kept} == kept
    assert instance.get_asset_records([AssetKey("raw_archive")])  # the asset itself stays
    # The record of its successful upload outlives its runs.
    upload = upload_id(settled.partition_key, "v1")
    assert upload in pruned_successes(instance, [upload])
    # Past the failed window the failed episode goes too, its upload recorded as not done.
    prune(instance, POLICY, now=NOW + 15 * DAY_SECONDS)
    assert state(instance, failed) == (0, 0, False)
    assert pruned_successes(instance, [upload_id(failed.partition_key, "v1")]) == {}


@pytest.mark.integration
def test_a_runs_own_archive_observation_is_no_upload_waiting(instance: DagsterInstance) -> None:
    """A run of an episode whose observations were pruned (`reprocess`, a campaign) logs the
    observation of the bytes it reads, after its own creation: past the window the episode is
    pruned, not kept for ever for an upload that never comes."""
    ref = new_ref()
    instance.add_dynamic_partitions(EPISODES_PARTITION_NAME, [ref.partition_key])
    run = record_run(instance, ref, DagsterRunStatus.SUCCESS, None)
    observation = AssetObservation(asset_key="raw_archive", partition=ref.partition_key)
    instance.report_dagster_event(
        DagsterEvent(
            event_type_value=DagsterEventType.ASSET_OBSERVATION.value,
            job_name=EPISODE_JOB_NAME,
            event_specific_data=AssetObservationData(observation),
        ),
        run.run_id,
    )
    backdate(instance, run.run_id, 5)  # its events too: the observation 2 min after creation

    prune(instance, POLICY, now=NOW)

    assert state(instance, ref) == (0, 0, False)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("retention-sample") / "take.tar.zst"
    write_sample(out, SampleSpec(seconds=1.0, cameras=1))
    return out


@pytest.mark.integration
def test_a_redelivered_message_of_a_pruned_upload_gets_no_second_run(
    instance: DagsterInstance, stack: StackInfo, settings: Settings, archive: Path
) -> None:
    assert stack.s3_endpoint is not None
    name = f"retention-{uuid.uuid4().hex[:8]}"
    resources = aws_setup.ensure_resources(stack.s3_endpoint, bucket=name, queue_name=name)
    private = dataclasses.replace(
        settings, bucket=resources.bucket, sqs_queue_url=resources.queue_url
    )
    queue = UploadQueue(resources.queue_url, private.aws)
    resource = UploadQueueResource(queue_url=queue.queue_url, **aws_fields(queue.aws))
    pruned, fresh = new_ref(), new_ref()
    upload_episode(archive, pruned, private)
    sensor_resources = {
        "upload_queue": resource,
        "s3": S3BucketResource(bucket=resources.bucket, **aws_fields(queue.aws)),
    }
    context = build_sensor_context(instance=instance, resources=sensor_resources)
    first = sqs.episode_uploads(context)
    assert isinstance(first, SensorResult)
    (request,) = first.run_requests
    # Its run succeeded a week ago (the message was kept, as after a failed delete), and was
    # pruned since; then the message comes back (a redelivery, or a redrive from the DLQ).
    instance.add_dynamic_partitions(EPISODES_PARTITION_NAME, [pruned.partition_key])
    run = record_run(instance, pruned, DagsterRunStatus.SUCCESS, 7, upload=request.tags[UPLOAD_TAG])
    prune(instance, POLICY, now=NOW)
    assert state(instance, pruned) == (0, 0, False)
    queue.client.change_message_visibility(
        QueueUrl=queue.queue_url,
        ReceiptHandle=upload_runs.held_messages(request.tags)[0].receipt_handle,
        VisibilityTimeout=0,
    )
    upload_episode(archive, fresh, private)  # and a new upload in the same tick

    again = sqs.episode_uploads(build_sensor_context(instance=instance, resources=sensor_resources))

    assert isinstance(again, (SensorResult, SkipReason))
    requests = again.run_requests if isinstance(again, SensorResult) else []
    assert [r.partition_key for r in requests] == [fresh.partition_key]
    assert pruned_successes(instance, [request.tags[UPLOAD_TAG]]) == {
        request.tags[UPLOAD_TAG]: run.run_id
    }
    # The pruned upload's message is gone; only the fresh upload's is held by its run.
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attributes = queue.client.get_queue_attributes(QueueUrl=queue.queue_url, AttributeNames=names)
    assert [int(attributes["Attributes"][n]) for n in names] == [0, 1]


@pytest.mark.integration
def test_the_sensors_reasons_for_dead_letters_expire_with_the_upload_records(
    instance: DagsterInstance,
) -> None:
    """`dlq list`'s reasons (uploads.reasons) outlive any message, then go: no growing table."""
    old, new = (f"msg-{uuid.uuid4().hex[:8]}" for _ in range(2))
    days_ago = {old: POLICY.upload_record_days + 1, new: POLICY.upload_record_days - 1}
    app_state.record_dead_letter_reasons(
        instance,
        {
            m: RecordedReason("no_object", "no object at s3://b/k", 3, NOW - d * DAY_SECONDS)
            for m, d in days_ago.items()
        },
    )
    prune(instance, POLICY, now=NOW)
    assert set(app_state.recorded_dead_letter_reasons(instance, [old, new])) == {new}


@pytest.mark.integration
def test_a_pruned_episode_is_reprocessed_as_a_backfill_with_its_partition_back(
    instance: DagsterInstance, settings: Settings, db_conn: psycopg.Connection
) -> None:
    org = f"org-{uuid.uuid4().hex[:6]}"
    refs = [EpisodeRef(org, f"ep-{i}-{uuid.uuid4().hex[:6]}") for i in range(3)]
    for ref, status in zip(refs, ("failed", "failed", "processed"), strict=True):
        db_conn.execute(
            "INSERT INTO episodes (id, org_id, status) VALUES (%s, %s, %s)",
            (ref.episode_id, ref.org_id, status),
        )
        instance.add_dynamic_partitions(EPISODES_PARTITION_NAME, [ref.partition_key])
        record_run(instance, ref, DagsterRunStatus.FAILURE, 20)
    prune(instance, POLICY, now=NOW)
    assert not instance.get_existing_dynamic_partitions(
        EPISODES_PARTITION_NAME, [r.partition_key for r in refs]
    )

    outcome = reprocess(Selection(org=org, status="failed"), instance=instance, settings=settings)

    assert outcome["episodes"] == 2
    backfill = instance.get_backfill(outcome["backfill_id"])
    assert backfill is not None and backfill.status == BulkActionStatus.REQUESTED
    assert sorted(backfill.partition_names) == sorted(r.partition_key for r in refs[:2])
    assert backfill.partition_set_origin.partition_set_name == f"{EPISODE_JOB_NAME}_partition_set"
    assert instance.get_existing_dynamic_partitions(
        EPISODES_PARTITION_NAME, [r.partition_key for r in refs]
    ) == {r.partition_key for r in refs[:2]}

    # The backfill daemon's own iteration, against the code location as the workspace names it:
    # one queued run of the episode job per episode, with its org's tags.
    with backfill_daemon(instance) as iteration:
        iteration()
    runs = instance.get_runs(RunsFilter(tags={BACKFILL_ID_TAG: outcome["backfill_id"]}))
    assert sorted(run.tags[PARTITION_TAG] for run in runs) == sorted(
        r.partition_key for r in refs[:2]
    )
    assert {run.job_name for run in runs} == {EPISODE_JOB_NAME}
    assert {run.tags["org"] for run in runs} == {org}


@pytest.mark.integration
def test_an_episode_a_requested_backfill_will_run_is_not_pruned(
    instance: DagsterInstance, settings: Settings
) -> None:
    old = episode(instance, (DagsterRunStatus.SUCCESS, 5))
    before = state(instance, old)

    reprocess(Selection(episodes=(old,)), instance=instance, settings=settings)
    prune(instance, POLICY, now=NOW)

    assert state(instance, old) == before


def test_the_reprocess_command_reads_names_and_filters() -> None:
    from episode_pipeline.cli import build_parser

    args = build_parser().parse_args(["reprocess", "--status", "failed", "--since", "2026-12-01"])
    assert (args.status, args.since, args.episodes) == (
        "failed",
        datetime(2026, 12, 1, tzinfo=UTC),
        [],
    )
    named = build_parser().parse_args(["reprocess", "acme/ep-1", "acme/ep-2"])
    assert [ref.partition_key for ref in named.episodes] == ["acme/ep-1", "acme/ep-2"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["reprocess", "--since", "yesterday"])


def test_the_backfill_daemon_runs_while_its_heartbeat_is_fresh(instance: DagsterInstance) -> None:
    from episode_pipeline_tests.support.dagster_internals import BackfillDaemon, DaemonHeartbeat

    assert BackfillDaemon.daemon_type() == BACKFILL_DAEMON
    assert not backfill_daemon_running(instance)  # no daemon ever ran against it
    beat = time.time()
    instance.add_daemon_heartbeat(DaemonHeartbeat(beat, BACKFILL_DAEMON, "daemon-1"))
    assert backfill_daemon_running(instance, now=beat + DAEMON_FRESH_SECONDS)
    assert not backfill_daemon_running(instance, now=beat + DAEMON_FRESH_SECONDS + 1)


@pytest.mark.integration
def test_reprocess_says_when_nothing_matches_and_when_no_daemon_will_launch_it(
    stack: StackInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from episode_pipeline import cli
    from episode_pipeline_tests.support.dagster_internals import DaemonHeartbeat

    org = f"org-{uuid.uuid4().hex[:6]}"
    capsys.readouterr()
    assert cli.main(["reprocess", "--org", org, "--status", "failed"]) == 0  # not bad input
    out, err = capsys.readouterr()
    assert (out, err) == (f"no episodes match org {org}, status failed: nothing to reprocess\n", "")

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))  # an instance no daemon ever ran against
    assert cli.main(["reprocess", f"{org}/ep-1"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("backfill ") and "1 episode(s)" in out
    assert err == f"episode-pipeline: {NO_DAEMON}\n"
    assert "start `episode-pipeline dev`" in err

    # A daemon's backfill thread beats: the backfill will be launched, nothing more to say.
    DagsterInstance.get().add_daemon_heartbeat(
        DaemonHeartbeat(time.time(), BACKFILL_DAEMON, "daemon-1")
    )
    assert cli.main(["reprocess", f"{org}/ep-1"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("backfill ") and err == ""
