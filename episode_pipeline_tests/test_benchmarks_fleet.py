"""The `fleet` stage's pure parts: how a template row becomes a synthetic episode's, how the
growth factors and their targets are read, how statements are folded for its profile.

The stage itself (a stack, a real run, thousands of runs, a webserver, a browser) is left to
`make bench`, as `startup` and `end_to_end` are (test_benchmarks_smoke.py); what its daemon part
queues is checked against the uploads sensor here, on the session's stack.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
from dagster import DagsterInstance, SensorResult

from benchmarks import fleet, fleet_daemon, fleet_state, sensor
from benchmarks.fleet_probe import normalize
from episode_pipeline.local.stack import StackInfo
from episode_pipeline_tests.support.queues import PrivateQueue, depth, tick


def template(run_id: str = "0f0f0f0f-aaaa-bbbb-cccc-000000000001") -> fleet_state.Template:
    return fleet_state.Template(
        run_id=run_id,
        partition_key="fleettpl/ep-fleettpl-1234abcd",
        episode_id="ep-fleettpl-1234abcd",
        dagster_run=None,
        events=[],
        event_tags=[],
        check_executions=[],
        start=1_000.0,
    )


def test_a_template_event_becomes_the_synthetic_episodes_own() -> None:
    tpl = template()
    text = (
        '{"run_id": "0f0f0f0f-aaaa-bbbb-cccc-000000000001", "timestamp": 1000.5, '
        '"partition": "fleettpl/ep-fleettpl-1234abcd", "path": "C:\\\\x\\ty", '
        '"uri": "s3://b/orgs/fleettpl/episodes/ep-fleettpl-1234abcd/x.mp4"}'
    )
    compiled = fleet_state.compile_template_text(tpl, text)
    new = compiled.render({"run": "new-run", "episode": fleet_state.episode_id(42)}, shift=10.0)
    assert '"run_id": "new-run"' in new
    assert '"partition": "fleet/ep-0000042"' in new
    assert "orgs/fleet/episodes/ep-0000042/x.mp4" in new
    assert '"timestamp": 1010.5' in new
    assert "fleettpl" not in new
    # COPY's text format: the JSON's backslashes doubled, a tab escaped, nothing else touched
    assert '"path": "C:\\\\\\\\x\\\\ty"' in new


def test_a_compiled_run_is_dagsters_own_serialisation_of_the_sensors_run() -> None:
    from dagster import DagsterRun, DagsterRunStatus

    from episode_pipeline_tests.support.dagster_internals import serialize_value

    tpl = template()
    tpl.dagster_run = DagsterRun(job_name="episode_job", run_id=tpl.run_id, tags={"a": "b"})
    state = fleet_state.FleetState(
        env={}, instance=None, settings=None, template=tpl, uuid_database=None, s3_objects=0,
        archive_version="v-1",
    )  # fmt: skip
    compiled = fleet_state.CompiledRuns.of(state)
    run_id = "11111111-2222-3333-4444-555555555555"
    key = fleet_state.partition_key(7)
    values = {
        "run": run_id,
        "episode": fleet_state.episode_id(7),
        "message": fleet_state.message_id(key),
        "receipt": fleet_state.receipt(key),
    }
    run = tpl.dagster_run._replace(
        run_id=run_id, tags=state.run_tags(7, run_id), status=DagsterRunStatus.SUCCESS
    )
    # rendered as COPY text: Dagster's JSON with its backslashes escaped once more
    assert compiled.run_body.render(values, 0.0) == fleet_state.copy_escape(serialize_value(run))
    tags = {name: value.render(values, 0.0) for name, value in compiled.tags}
    assert tags == {k: fleet_state.copy_escape(v) for k, v in run.tags_for_storage().items()}
    assert compiled._mapped(500, None) == "\\N"


def test_episode_ids_sort_in_the_order_they_were_made_and_uuid_ids_are_stable() -> None:
    ids = [fleet_state.episode_id(i) for i in (9, 10, 999_999)]
    assert ids == sorted(ids)
    assert fleet_state.uuid_id(5) == fleet_state.uuid_id(5) != fleet_state.uuid_id(6)
    assert len(fleet_state.receipt("fleet/ep-0000001")) == 380


def test_growth_factors_are_against_the_first_size_and_targets_follow_their_kind() -> None:
    small, large = fleet.Sample(1_000), fleet.Sample(10_000)
    for value in (1.0, 1.1, 0.9):
        small.add("uploads_tick", value)
        large.add("uploads_tick", value * 2)
        small.add("ui_partitions_view", value)
        large.add("ui_partitions_view", value * 2)
    small.add("reconcile_lost_upload", 1_500.0)
    large.add("reconcile_lost_upload", math.inf)
    results = {r.metric: r for r in fleet.figures([small, large])}
    tick = results["uploads_tick@10,000"]
    assert (tick.ours, tick.baseline, tick.ratio) == (2.0, 1.0, 2.0)
    assert tick.met is False  # 2x its N = 1,000 cost, over 1.5x
    assert results["ui_partitions_view@10,000"].met is True  # 2 s, under 3 s
    assert results["reconcile_lost_upload@10,000"].met is False


def test_fleet_sizes_0_builds_no_fleet() -> None:
    # `--set fleet_sizes=0`: the stage measures the one real episode's storage alone.
    from types import SimpleNamespace

    assert fleet.sizes(SimpleNamespace(fleet_sizes="0")) == []
    assert fleet.sizes(SimpleNamespace(fleet_sizes="1_000, 10000")) == [1_000, 10_000]


def test_statements_fold_their_parameters_and_literals() -> None:
    statement = (
        "SELECT runs.run_body FROM runs WHERE runs.run_id IN (%(run_id_1_1)s, %(run_id_1_2)s,\n"
        "   %(run_id_1_3)s) AND status = 'SUCCESS'"
    )
    assert normalize(statement) == (
        "SELECT runs.run_body FROM runs WHERE runs.run_id IN (%(run_id)s, ...) AND status = '?'"
    )


def test_the_index_age_spreads_runs_at_the_fleets_daily_rate() -> None:
    spacing = 86_400 / fleet_state.EPISODES_PER_DAY
    assert fleet_state.index_age(99, spacing, 100) == spacing
    assert fleet_state.index_age(0, spacing, 10_001) == 86_400 + spacing


def test_a_settled_store_holds_the_window_and_the_records_of_what_was_pruned() -> None:
    from episode_pipeline.config.settings import RetentionSettings

    retention = RetentionSettings(episode_days=3, failed_episode_days=19, upload_record_days=21)
    plan = fleet_state.SettledPlan.of(100_000, 1_000_000, 10_000, retention)
    assert plan.window == range(970_000, 1_000_000)  # 3 days of 10,000
    assert plan.new_runs == plan.window  # the 100,000 already built are all older
    assert plan.pruned == range(0, 100_000)
    assert plan.record_start == 790_000  # 18 more days of records
    assert plan.new_records == range(790_000, 970_000)
    # growing within the window: nothing pruned, the runs already built are kept
    small = fleet_state.SettledPlan.of(20_000, 40_000, 10_000, retention)
    assert small.pruned == range(0, 10_000) and small.new_runs == range(20_000, 40_000)
    assert small.new_records == range(10_000, 10_000)  # the pruned ones' records are kept


def test_the_campaign_figures_hold_their_targets_and_the_rate_runs_from_the_canarys_end() -> None:
    from types import SimpleNamespace

    from benchmarks import fleet_campaign

    def sample_at(t: float, succeeded: int, wave: int, live: int) -> dict:
        return {"t": t, "load": 1.0, "live_partitions": live,
                "counts": {"succeeded": succeeded}, "next_wave": wave}  # fmt: skip

    from episode_pipeline.config.settings import CampaignSettings

    wave_size = CampaignSettings().wave_size  # the summary's: the window + one wave is the limit
    integrity = {"counts": {"succeeded": 10}, "standin_runs": 12, "episodes_run_twice": 0,
                 "succeeded_without_its_run": 0,
                 "run_but_not_succeeded_nor_in_flight": 0}  # fmt: skip
    details = {
        "standin": "stand-in", "episodes": 1000,
        "samples": [sample_at(0, 0, 1, 30_000), sample_at(10, 4, 2, 30_004),
                    sample_at(50, 8, 3, 30_100 + wave_size), sample_at(110, 20, 5, 30_002)],
        "kill": {"killed_at": 60.0, "before": {**integrity, "counts": {"succeeded": 8}},
                 "after": integrity},
        "ceiling": {"runs_per_second": 0.25},
        "upload_idle": [{"seconds": 10.0}] * 3, "upload_during": [{"seconds": 16.0}] * 3,
        "ui": {"asset_page": {"warm_seconds": [2.0], "cold_seconds": 9.0,
                              "after_add_seconds": 4.0}},
    }  # fmt: skip
    state = SimpleNamespace(size=100_000, settled={"window_episodes": 30_000})
    asked: list[tuple[float, float]] = []

    def runs_ended(start: float, end: float) -> float:  # the stand-in's run ends, per second
        asked.append((start, end))
        return 0.16

    fleet_campaign.summarise(details, SimpleNamespace(state=state), runs_ended)
    assert asked == [(10, 60.0)]  # the canary's end (a full queue) to the kill
    assert details["summary"]["steady_rate_episodes_per_second"] == 0.16
    assert details["ledger_rate_before_the_kill"] == 0.1  # (8 - 4) / 40 s
    assert details["rate_with_the_kill"] == 0.16  # (20 - 4) / 100 s
    assert details["summary"]["extrapolated_hours_to_finish"] == round(980 / 0.16 / 3600, 1)
    sample = fleet.Sample(100_000, details={"campaign": details})
    met = {r.metric.split("@")[0]: r.met for r in fleet_campaign.figures([sample])}
    assert met == {
        "campaign_live_partitions_max": False,  # 30,100 + a wave > 30,000 + a wave
        "campaign_ui_asset_page": True,
        "campaign_ui_asset_page_after_add": False,
        "campaign_throughput": False,  # 0.16 < 0.9 x 0.25
        "campaign_upload_to_launch": False,  # 16 > 1.5 x 10
        "campaign_kill_lost_or_doubled": True,
    }


def test_at_the_plans_rate_the_campaign_is_held_to_a_million_a_day_and_a_steady_queue() -> None:
    """Issue 33: the stand-in runs batches of the default plan's K at its run rate, and the
    figures are the steady rate against a million a day and the queue's depth not growing."""
    from types import SimpleNamespace

    from benchmarks import fleet_campaign
    from episode_pipeline.config.settings import Settings

    plan = fleet_campaign.default_plan(Settings.from_env({"DATA_BUCKET": "b", "DB_HOST": "h"}))
    assert (plan["episodes_per_run"], plan["concurrency"]) == (25, 340)  # the defaults
    assert plan["day_needs_episodes_per_second"] == round(1_000_000 / 86_400, 3)
    assert plan["episodes_per_second"] >= plan["day_needs_episodes_per_second"]
    # 30 s batches of 25 at ~12.5 episodes/s: 15 at once, the plan's 0.5 runs/s; 18 with
    # the slot each batch leaves empty until the run queue's next dequeue (5 s)
    assert fleet_campaign.paced_concurrency(plan["episodes_per_second"], 25, 30.0) == 15
    assert fleet_campaign.dequeue_interval_seconds() == 5.0
    assert fleet_campaign.paced_concurrency(plan["episodes_per_second"], 25, 30.0, 5.0) == 18
    assert fleet_campaign.paced_concurrency(0.01, 25, 1.0) == 1

    def at(t: float, succeeded: int, queued: int) -> dict:
        return {"t": t, "load": 1.0, "live_partitions": 30_000, "counts": {"succeeded": succeeded},
                "next_wave": 3, "limit": 15, "runs": {"queued": queued}}  # fmt: skip

    integrity = {"counts": {"succeeded": 10}, "standin_runs": 10, "episodes_run_twice": 0,
                 "succeeded_without_its_run": 0,
                 "run_but_not_succeeded_nor_in_flight": 0}  # fmt: skip
    state = SimpleNamespace(size=100_000, settled={"window_episodes": 30_000})
    met = {}
    # Each campaign drains its queue once in the warm-up (the driver's first budget reaches
    # the queue a lead after the canary), which the steady state leaves out. Then kept: the
    # queue full (the launch limit queued) and steady; grows: it deepens (the queue's not
    # keeping up); drained: it empties.
    lead = fleet_campaign.campaign_lead_seconds()
    assert lead == 95.0  # two 30 s ticks and the backfill daemon's lead
    warm_up = [30, 30, 10, 0, 0, 0, 5, 20, 30, 30]
    cases = (("kept", [30] * 6, 12.0), ("grows", [15, 20, 30, 40, 50, 60], 12.0),
             ("drained", [5, 3, 2, 1, 0, 0], 9.0))  # fmt: skip
    for name, queued, rate in cases:
        details = {
            "standin": "stand-in", "episodes": 100_000, "episodes_per_run": 25, "plan": plan,
            "samples": [at(10.0 * i, 100 * i, q) for i, q in enumerate(warm_up + queued)],
            "kill": {"killed_at": 1_000.0, "before": integrity, "after": integrity},
            "upload_idle": [{"seconds": 10.0}], "upload_during": [{"seconds": 11.0}],
        }  # fmt: skip
        fleet_campaign.summarise(details, SimpleNamespace(state=state), lambda a, b, r=rate: r)
        assert details["summary"]["plan"]["measured_runs_per_second"] == round(rate / 25, 4)
        assert details["steady_from"].startswith("the canary's end and the driver's lead")
        assert details["warm_up"] == warm_up  # t < 95 s: named, not in the steady state
        sample = fleet.Sample(100_000, details={"campaign": details})
        met[name] = {
            r.metric.split("@")[0]: r.met
            for r in fleet_campaign.figures([sample])
            if r.metric.startswith(("campaign_rate", "campaign_queue"))
        }
    assert met["kept"] == {"campaign_rate_vs_plan": True, "campaign_queue_depth": True}
    assert met["grows"] == {"campaign_rate_vs_plan": True, "campaign_queue_depth": False}
    assert met["drained"] == {"campaign_rate_vs_plan": False, "campaign_queue_depth": False}


@pytest.mark.integration
def test_the_daemon_parts_burst_is_of_uploads_the_uploads_sensor_starts(
    stack: StackInfo, private_queue: Callable[..., PrivateQueue], instance: DagsterInstance
) -> None:
    """The uploads sensor HEADs each upload (issue 27) and refuses one of no object: a burst of
    events for objects never put requested no run, and the stage waited out its deadline. The
    private bucket notifies its queue as the stack's data bucket does: each upload must arrive
    once, in the burst, not also as its object's own notification."""
    private = private_queue()
    info = dataclasses.replace(
        stack, bucket=private.storage.name, sqs_queue_url=private.queue.queue_url
    )
    count = 12
    requested: list[str] = []
    with fleet_daemon.staged_uploads(info, "test-burst", count) as uploads:
        assert depth(private.queue) == (0, 0)  # the objects' notifications are purged
        sensor.send_events(private.queue, *uploads)  # as measure_runs_exist sends the burst
        while isinstance(result := tick(instance, private), SensorResult):
            requested += [request.partition_key or "" for request in result.run_requests or []]
        assert "no messages" in str(result.skip_message)
    assert sorted(requested) == sensor.upload_partitions("test-burst", count)
    assert private.storage.list_keys("orgs/") == []  # the objects are deleted afterwards
