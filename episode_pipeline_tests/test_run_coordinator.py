"""Every run of an episode carries its `org`/`episode` tags once queued, however it was
launched: the run queue (`EpisodeRunCoordinator`, configured as in dagster.yaml) adds them to a
run of Dagster's implicit asset job, which carries only its partition. It also places and sizes
every run nobody placed (a UI launch, a backfill, a retry) from its archive, as the uploads
sensor does, and never overrides a placement someone chose."""

from __future__ import annotations

import logging
import uuid

import pytest
from dagster import DagsterEvent, DagsterEventType, DagsterRun, DagsterRunStatus, RunsFilter

from episode_pipeline.config.settings import ECS, SUBPROCESS
from episode_pipeline.db.batches import create_batch
from episode_pipeline.episodes.batches import batch_key
from episode_pipeline.instance.app_state import (
    CAMPAIGN_LIMITS_KEY,
    publish_limits,
    published_limits,
)
from episode_pipeline.instance.run_coordinator import (
    PLACEMENT_TAGS,
    batch_queue_config,
    is_placed,
    missing_episode_tags,
)
from episode_pipeline.instance.run_tags import (
    BATCH_JOB_NAME,
    CAMPAIGN_TAG,
    ECS_CPU_TAG,
    ECS_MEMORY_TAG,
    EPISODE_JOB_NAME,
    EPISODE_LOCK_TAG_PREFIX,
    ORG_TAG,
    PARTITION_TAG,
    TRANSCODER_TAG,
    batch_child_tags,
    episode_lock_tags,
    episode_tags,
)
from episode_pipeline.orchestration.run_errors import run_error
from episode_pipeline.reprocess import Selection, reprocess
from episode_pipeline.runtime.failure_causes import NO_CAPACITY as NO_CAPACITY_CLASS
from episode_pipeline.runtime.failure_causes import THROTTLED as THROTTLED_CLASS
from episode_pipeline.runtime.failure_causes import classify_error
from episode_pipeline.transcode.placement import RUN_WITHOUT_TRANSCODE
from episode_pipeline_tests.support import new_ref
from episode_pipeline_tests.support.dagster_internals import (
    BACKFILL_ID_TAG,
    PRIORITY_TAG,
    EmptyWorkspaceTarget,
    QueuedRunCoordinatorDaemon,
    RunQueueConfig,
    SubmitRunContext,
    create_run_for_test,
    create_test_daemon_workspace_context,
    instance_for_test,
)
from episode_pipeline_tests.support.ecs import (
    ECS_RUN_LAUNCHER,
    NO_CAPACITY,
    THROTTLED,
    StubEcs,
    dequeue_with_ecs,
    queued_run,
)
from episode_pipeline_tests.support.runs import JOB_ORIGIN, backfill_daemon

COORDINATOR = {
    "module": "episode_pipeline.instance.run_coordinator",
    "class": "EpisodeRunCoordinator",
    "config": {
        "tag_concurrency_limits": [
            {"key": "org", "value": {"applyLimitPerUniqueValue": True}, "limit": 1}
        ]
    },
}


def test_missing_tags_come_from_the_partition_and_never_override() -> None:
    assert missing_episode_tags({PARTITION_TAG: "acme/ep-1"}) == {
        "org": "acme",
        "episode": "ep-1",
    }
    assert missing_episode_tags({PARTITION_TAG: "acme/ep-1", "org": "acme"}) == {"episode": "ep-1"}
    assert missing_episode_tags({"dagster/backfill": "x"}) == {}  # not an episode run
    assert missing_episode_tags({PARTITION_TAG: "2026-12-01"}) == {}  # another partitioning


def test_an_asset_job_run_is_queued_with_the_episode_tags() -> None:
    with instance_for_test(overrides={"run_coordinator": COORDINATOR}) as instance:
        assert type(instance.run_coordinator).__name__ == "EpisodeRunCoordinator"
        run = create_run_for_test(
            instance,
            job_name="__ASSET_JOB",
            tags={PARTITION_TAG: "acme/ep-42"},
            status=DagsterRunStatus.NOT_STARTED,
            remote_job_origin=JOB_ORIGIN._replace(job_name="__ASSET_JOB"),
        )
        queued = instance.run_coordinator.submit_run(SubmitRunContext(run, None))
        assert queued.status == DagsterRunStatus.QUEUED
        stored = instance.get_run_by_id(run.run_id)
        assert stored.tags[ORG_TAG] == "acme" and stored.tags["episode"] == "ep-42"
        # The queue's per-org limit now sees it.
        limits = instance.run_coordinator.get_run_queue_config().tag_concurrency_limits
        assert limits[0]["key"] == ORG_TAG


# -- placement of the runs nobody placed --------------------------------------------------------


def test_a_run_with_any_placement_tag_is_placed_already() -> None:
    assert not is_placed({PARTITION_TAG: "acme/ep-1", ORG_TAG: "acme"})
    assert is_placed({PARTITION_TAG: "acme/ep-1", ECS_CPU_TAG: "4096"})
    assert is_placed({PARTITION_TAG: "acme/ep-1", TRANSCODER_TAG: "subprocess"})


def submitted(instance, partition_key: str, **tags: str) -> DagsterRun:
    """An `__ASSET_JOB` run (a UI launch, a backfill's run) through the queue, as stored."""
    run = create_run_for_test(
        instance,
        job_name="__ASSET_JOB",
        tags={PARTITION_TAG: partition_key, **tags},
        status=DagsterRunStatus.NOT_STARTED,
        remote_job_origin=JOB_ORIGIN._replace(job_name="__ASSET_JOB"),
    )
    instance.run_coordinator.submit_run(SubmitRunContext(run, None))
    return instance.get_run_by_id(run.run_id)


def engine_messages(instance, run: DagsterRun) -> list[str]:
    return [
        record.event_log_entry.dagster_event.message or ""
        for record in instance.get_records_for_run(run.run_id).records
        if record.event_log_entry.dagster_event is not None
    ]


def test_runs_nobody_placed_are_sized_from_their_archive_on_the_stack(
    stack, s3_client, monkeypatch
) -> None:
    """The coordinator reads the daemon's environment (here the stack's, as `dev` exports it)
    and lists the episode's prefix in the stack's S3 (moto): the newest archive decides."""
    for name, value in stack.env.items():
        monkeypatch.setenv(name, value)
    threshold = 150_000
    for name, value in {
        "TRANSCODE_TASK_ABOVE_BYTES": str(threshold),
        "TRANSCODE_TASK_DEFINITION": "pipe-transcode",
        "ECS_CLUSTER": "pipe",
        "ECS_SUBNETS": "subnet-1",
    }.items():
        monkeypatch.setenv(name, value)
    small, large = new_ref(), new_ref()
    archives = [(small, "take-1", threshold // 2), (large, "take-1", threshold // 2)]
    archives.append((large, "take-2", threshold + 1))  # a re-upload: the newest decides
    for ref, name, size in archives:
        s3_client.put_object(
            Bucket=stack.bucket, Key=f"{ref.prefix}{name}.tar.zst", Body=b"\0" * size
        )
    s3_client.put_object(  # the episode's own outputs are never taken for its archive
        Bucket=stack.bucket, Key=small.processed_key("z.tar.zst"), Body=b"\0" * (threshold * 2)
    )

    with instance_for_test(overrides={"run_coordinator": COORDINATOR}) as instance:
        in_its_task = submitted(instance, small.partition_key)
        own_task = submitted(instance, large.partition_key)
        chosen = submitted(instance, large.partition_key, **{ECS_CPU_TAG: "4096"})
        no_archive = submitted(instance, new_ref().partition_key)

        assert {tag: in_its_task.tags.get(tag) for tag in PLACEMENT_TAGS} == {
            TRANSCODER_TAG: SUBPROCESS,
            ECS_CPU_TAG: "1024",
            ECS_MEMORY_TAG: "2048",
        }
        assert in_its_task.tags[ORG_TAG] == small.org_id  # the episode tags too
        assert own_task.tags[TRANSCODER_TAG] == ECS
        expected = RUN_WITHOUT_TRANSCODE
        assert (own_task.tags[ECS_CPU_TAG], own_task.tags[ECS_MEMORY_TAG]) == (
            str(expected.cpu),
            str(expected.memory),
        )
        # A user's choice stands, whole: nothing added beside it.
        assert chosen.tags[ECS_CPU_TAG] == "4096"
        assert TRANSCODER_TAG not in chosen.tags and ECS_MEMORY_TAG not in chosen.tags
        # No archive: transcoded in its task, at the launcher's default size.
        assert no_archive.tags[TRANSCODER_TAG] == SUBPROCESS
        assert ECS_CPU_TAG not in no_archive.tags
        # Each says in its event log (the UI's run page) why it got its size.
        [placed] = [m for m in engine_messages(instance, own_task) if m.startswith("Placed")]
        assert f"{large.prefix}take-2.tar.zst" in placed and "TRANSCODE_TASK_ABOVE_BYTES" in placed
        assert all(queued.status == DagsterRunStatus.QUEUED for queued in (own_task, chosen))


def test_a_bucket_it_cannot_list_leaves_the_default_size_and_says_why(stack, monkeypatch) -> None:
    for name, value in {**stack.env, "DATA_BUCKET": "no-such-bucket"}.items():
        monkeypatch.setenv(name, value)
    with instance_for_test(overrides={"run_coordinator": COORDINATOR}) as instance:
        run = submitted(instance, new_ref().partition_key)
        assert run.status == DagsterRunStatus.QUEUED
        assert not is_placed(run.tags) and run.tags[ORG_TAG]
        [why] = [m for m in engine_messages(instance, run) if m.startswith("Not sized")]
        assert "s3://no-such-bucket/orgs/" in why


def test_the_runs_of_a_reprocess_backfill_are_sized_by_the_queue(
    stack, s3_client, settings, monkeypatch
) -> None:
    """`episode-pipeline reprocess` launches a backfill; the backfill daemon's own iteration,
    against the code location as the workspace names it, submits its runs through the queue
    (configured as in dagster.yaml), which sizes each from its archive in the stack's S3."""
    for name, value in stack.env.items():
        monkeypatch.setenv(name, value)
    uploaded, missing = new_ref(), new_ref()
    s3_client.put_object(
        Bucket=stack.bucket, Key=f"{uploaded.prefix}take-1.tar.zst", Body=b"\0" * 1000
    )
    with instance_for_test(overrides={"run_coordinator": COORDINATOR}) as instance:
        outcome = reprocess(
            Selection(episodes=(uploaded, missing)), instance=instance, settings=settings
        )
        with backfill_daemon(instance) as iteration:
            iteration()
        runs = instance.get_runs(RunsFilter(tags={BACKFILL_ID_TAG: outcome["backfill_id"]}))

    by_episode = {run.tags[PARTITION_TAG]: run.tags for run in runs}
    assert set(by_episode) == {uploaded.partition_key, missing.partition_key}
    sized = by_episode[uploaded.partition_key]
    assert (sized[TRANSCODER_TAG], sized[ECS_CPU_TAG], sized[ECS_MEMORY_TAG]) == (
        SUBPROCESS,
        "1024",
        "2048",
    )
    assert by_episode[missing.partition_key][TRANSCODER_TAG] == SUBPROCESS
    assert ECS_CPU_TAG not in by_episode[missing.partition_key]  # the launcher's default


# -- each campaign's launch limit ---------------------------------------------------------------


def queued_campaign_run(instance, campaign_id: str) -> DagsterRun:
    return create_run_for_test(
        instance,
        job_name=EPISODE_JOB_NAME,
        tags={CAMPAIGN_TAG: campaign_id, PARTITION_TAG: new_ref().partition_key},
        status=DagsterRunStatus.QUEUED,
        remote_job_origin=JOB_ORIGIN,
    )


def test_the_queue_launches_a_campaigns_runs_up_to_the_limit_its_driver_published() -> None:
    """Dagster's own dequeue, with the campaign lane of 4 as dagster.yaml's: a campaign held to
    2 launches 2 of its 5 queued runs, one held to 0 (paused) none, and a campaign with no limit
    published (the benchmark's ceiling) the lane's rest. The launcher records launches only."""
    coordinator = {
        **COORDINATOR,
        "config": {"tag_concurrency_limits": [{"key": CAMPAIGN_TAG, "limit": 4}]},
    }
    launcher = {"module": "dagster._core.test_utils", "class": "MockedRunLauncher"}
    overrides = {"run_coordinator": coordinator, "run_launcher": launcher}
    with instance_for_test(overrides=overrides) as instance:
        for campaign_id, runs in (("held-to-2", 5), ("paused", 3), ("unlimited", 5)):
            for _ in range(runs):
                queued_campaign_run(instance, campaign_id)
        publish_limits(instance, {"held-to-2": 2, "paused": 0})
        assert published_limits(instance) == {"held-to-2": 2, "paused": 0}
        with create_test_daemon_workspace_context(EmptyWorkspaceTarget(), instance) as workspace:
            list(QueuedRunCoordinatorDaemon(interval_seconds=1).run_iteration(workspace))
        launched: dict[str, int] = {}
        for run in instance.get_runs():
            if run.status != DagsterRunStatus.QUEUED:
                launched[run.tags[CAMPAIGN_TAG]] = launched.get(run.tags[CAMPAIGN_TAG], 0) + 1
    assert launched == {"held-to-2": 2, "unlimited": 2}


# -- launch failures ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ecs", "expected", "text"),
    [
        (StubEcs(error=THROTTLED), THROTTLED_CLASS, "(ThrottlingException)"),
        (StubEcs(response=NO_CAPACITY), NO_CAPACITY_CLASS, "RESOURCE:CPU"),
    ],
    ids=["runtask-throttled", "no-capacity"],
)
def test_an_ecs_launch_failure_reaches_the_governor(
    ecs: StubEcs, expected: str, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 32, finding 2: Dagster's run queue daemon dequeues a campaign's run and launches it
    with production's `EcsRunLauncher`, whose ECS client is a STUB answering RunTask as ECS does
    when throttled or out of capacity (support/ecs.py). The daemon records the launcher's
    exception in an engine event and fails the run with a generic message; the driver's
    `run_error` reads the engine event's error, which classifies as backpressure."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    monkeypatch.setenv("RUN_TASK_RETRIES", "0")  # dagster-aws's own retries of RunTask
    overrides = {"run_coordinator": COORDINATOR, "run_launcher": ECS_RUN_LAUNCHER}
    with instance_for_test(overrides=overrides) as instance:
        run = queued_run(instance, {CAMPAIGN_TAG: "c1", PARTITION_TAG: new_ref().partition_key})
        dequeue_with_ecs(instance, ecs)
        failed = instance.get_run_by_id(run.run_id)
        assert failed is not None and failed.status == DagsterRunStatus.FAILURE
        assert len(ecs.calls) == 1  # the launcher did call RunTask
        error = run_error(instance, failed)
    assert text in error
    assert classify_error(error) == expected


# -- a batch run (K > 1) in the queue -----------------------------------------------------------


def ended(instance, run: DagsterRun) -> None:
    """The run succeeded (what its worker would report)."""
    event = DagsterEvent(DagsterEventType.RUN_SUCCESS.value, job_name=run.job_name)
    instance.report_dagster_event(event, run_id=run.run_id)


QUEUED = DagsterRunStatus.QUEUED


def dequeue(instance) -> set[str]:
    """One iteration of Dagster's run queue daemon; the ids of the runs it launched."""
    queued = {run.run_id for run in instance.get_runs(RunsFilter(statuses=[QUEUED]))}
    with create_test_daemon_workspace_context(EmptyWorkspaceTarget(), instance) as workspace:
        list(QueuedRunCoordinatorDaemon(interval_seconds=1).run_iteration(workspace))
    still = {run.run_id for run in instance.get_runs(RunsFilter(statuses=[QUEUED]))}
    return queued - still


def test_a_batch_takes_one_slot_and_holds_its_episodes_against_their_uploads(
    stack, settings, db_conn, monkeypatch
) -> None:
    """Issue 32, finding 8, on Dagster's own dequeue with dagster.yaml's limits (scaled) and the
    stack's database: a batch run (K = 2) waits while an upload of one of its episodes runs (and
    loses to it when both are queued), and holds its episodes while it runs, so a fresh upload
    of one waits; its episode run in progress inside it (started outside the queue, with the
    campaign's tags) takes no second slot of the deployment, the lane or the campaign."""
    for name, value in stack.env.items():
        monkeypatch.setenv(name, value)
    campaign = f"c{uuid.uuid4().hex[:8]}"
    first, second, other = new_ref(), new_ref(), new_ref()
    key = batch_key(campaign, 0, 0)
    create_batch(db_conn, key, [first, second])
    coordinator = {
        **COORDINATOR,
        "config": {
            "max_concurrent_runs": 2,
            "tag_concurrency_limits": [
                {"key": ORG_TAG, "value": {"applyLimitPerUniqueValue": True}, "limit": 4},
                {"key": PARTITION_TAG, "value": {"applyLimitPerUniqueValue": True}, "limit": 1},
                {"key": CAMPAIGN_TAG, "limit": 8},
            ],
        },
    }
    launcher = {"module": "dagster._core.test_utils", "class": "MockedRunLauncher"}
    overrides = {"run_coordinator": coordinator, "run_launcher": launcher}
    with instance_for_test(overrides=overrides) as instance:
        publish_limits(instance, {campaign: 2})

        def submit(job_name: str, partition: str, priority: str, **tags: str) -> DagsterRun:
            run = create_run_for_test(
                instance,
                job_name=job_name,
                tags={PARTITION_TAG: partition, PRIORITY_TAG: priority, **tags},
                status=DagsterRunStatus.NOT_STARTED,
                remote_job_origin=JOB_ORIGIN._replace(job_name=job_name),
            )
            instance.run_coordinator.submit_run(SubmitRunContext(run, None))
            return instance.get_run_by_id(run.run_id)

        # An upload of the batch's first episode and the batch, queued together: the upload
        # (priority 0) goes first, and the batch waits for it (both hold the first episode).
        upload = submit(EPISODE_JOB_NAME, first.partition_key, "0")
        batch = submit(BATCH_JOB_NAME, key, "-10", **{CAMPAIGN_TAG: campaign})
        assert set(episode_lock_tags([first.partition_key, second.partition_key])) <= set(
            batch.tags
        )
        assert set(episode_lock_tags([first.partition_key])) <= set(upload.tags)
        assert dequeue(instance) == {upload.run_id}
        assert dequeue(instance) == set()  # the upload still runs: the batch waits
        ended(instance, upload)
        assert dequeue(instance) == {batch.run_id}

        # The batch runs its second episode in its own task, outside the queue.
        child_tags = {
            **batch_child_tags(key, batch.run_id, batch.tags),
            **episode_tags(second.partition_key),
            PARTITION_TAG: second.partition_key,
        }
        child = create_run_for_test(
            instance, job_name=EPISODE_JOB_NAME, tags=child_tags, status=DagsterRunStatus.STARTED
        )
        # A fresh upload of the batch's first episode waits for the batch; another run of the
        # same campaign starts: the batch and its episode run take one of the deployment's 2
        # slots and one of the campaign's 2, not two.
        fresh = submit(EPISODE_JOB_NAME, first.partition_key, "0")
        campaign_run = submit(
            EPISODE_JOB_NAME, other.partition_key, "-10", **{CAMPAIGN_TAG: campaign}
        )
        assert dequeue(instance) == {campaign_run.run_id}
        assert instance.get_run_by_id(fresh.run_id).status == QUEUED
        ended(instance, child)
        ended(instance, batch)
        assert dequeue(instance) == {fresh.run_id}


def test_the_queue_config_counts_a_batch_once_and_holds_its_episodes() -> None:
    """The rule alone: each limit a batch's episode run counts against is raised by it (not a
    per-unique-value one); each episode a batch in flight holds may have one run in progress."""
    config = RunQueueConfig(
        max_concurrent_runs=2,
        tag_concurrency_limits=[
            {"key": ORG_TAG, "value": {"applyLimitPerUniqueValue": True}, "limit": 1},
            {"key": CAMPAIGN_TAG, "limit": 8},
            {"key": CAMPAIGN_TAG, "value": "c1", "limit": 0},
            {"key": "dagster/backfill", "limit": 10},
        ],
    )
    batch = DagsterRun(
        job_name=BATCH_JOB_NAME,
        run_id="b",
        tags={CAMPAIGN_TAG: "c1", **episode_lock_tags(["o/e1", "o/e2"])},
        status=DagsterRunStatus.STARTED,
    )
    child = DagsterRun(
        job_name=EPISODE_JOB_NAME,
        run_id="e2",
        tags={CAMPAIGN_TAG: "c1", ORG_TAG: "o", PARTITION_TAG: "o/e2"},
        status=DagsterRunStatus.STARTED,
    )
    counted = batch_queue_config(config, [batch], [child])
    assert counted.max_concurrent_runs == 3
    assert [entry["limit"] for entry in counted.tag_concurrency_limits] == [1, 9, 1, 10, 1, 1]
    assert [entry["key"] for entry in counted.tag_concurrency_limits[-2:]] == [
        f"{EPISODE_LOCK_TAG_PREFIX}o/e1",
        f"{EPISODE_LOCK_TAG_PREFIX}o/e2",
    ]
    unlimited = config._replace(max_concurrent_runs=-1)
    assert batch_queue_config(unlimited, [batch], [child]).max_concurrent_runs == -1


def test_unreadable_limits_launch_no_campaign_run_and_say_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Finding 10: the published limits cannot be read (a corrupt value here; a storage error
    alike): Dagster's own dequeue launches no campaign run, a paused one included, never the
    lane's 4; an upload's run still launches. The daemon's log says why."""
    coordinator = {
        **COORDINATOR,
        "config": {"tag_concurrency_limits": [{"key": CAMPAIGN_TAG, "limit": 4}]},
    }
    launcher = {"module": "dagster._core.test_utils", "class": "MockedRunLauncher"}
    overrides = {"run_coordinator": coordinator, "run_launcher": launcher}
    with instance_for_test(overrides=overrides) as instance:
        for _ in range(3):
            queued_campaign_run(instance, "paused")
        upload = create_run_for_test(
            instance,
            job_name=EPISODE_JOB_NAME,
            tags={PARTITION_TAG: new_ref().partition_key},
            status=DagsterRunStatus.QUEUED,
            remote_job_origin=JOB_ORIGIN,
        )
        instance.run_storage.set_cursor_values({CAMPAIGN_LIMITS_KEY: "{not json"})
        with (
            caplog.at_level(logging.WARNING),
            create_test_daemon_workspace_context(EmptyWorkspaceTarget(), instance) as workspace,
        ):
            list(QueuedRunCoordinatorDaemon(interval_seconds=1).run_iteration(workspace))
        launched = [run for run in instance.get_runs() if run.status != DagsterRunStatus.QUEUED]
        assert [run.run_id for run in launched] == [upload.run_id]
        assert published_limits(instance) is None
    assert "no campaign run launches" in caplog.text
