"""A family of checks is one step, and each check still behaves as its own (defs/checks/family.py).

On toy assets of the episode partitions in an ephemeral instance: no stack is needed to prove
how Dagster runs the family's op.
"""

from dagster import (
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    DagsterEventType,
    DagsterInstance,
    Definitions,
)

from episode_pipeline.defs.checks.family import EpisodeCheckContext, EpisodeCheckFamily
from episode_pipeline.defs.partitions import EPISODES_PARTITION_NAME, episode_asset
from episode_pipeline.orchestration.run_errors import step_error

EPISODE = "org/ep"
UPSTREAM, DOWNSTREAM = AssetKey("upstream"), AssetKey("downstream")


@episode_asset()
def upstream() -> int:
    return 1


@episode_asset(deps=[UPSTREAM])
def downstream() -> None:
    return None


def family_of(blocking_passes: bool, warn_raises: bool = False) -> EpisodeCheckFamily:
    family = EpisodeCheckFamily("toy_checks")

    @family.check(
        asset=UPSTREAM, severity=AssetCheckSeverity.ERROR, blocking=True, description="blocks"
    )
    def must_hold(context: EpisodeCheckContext) -> AssetCheckResult:
        assert context.partition_key == EPISODE
        return AssetCheckResult(passed=blocking_passes)

    @family.check(asset=UPSTREAM, severity=AssetCheckSeverity.WARN, description="warns")
    def may_warn(context: EpisodeCheckContext) -> AssetCheckResult:
        if warn_raises:
            raise ValueError("no such row")
        return AssetCheckResult(passed=False, metadata={"rows": 3})

    return family


def run(family: EpisodeCheckFamily, only: AssetCheckKey | None = None):
    """The toy graph's run for the episode; `only`: that check alone, as `run_checks` runs it."""
    defs = Definitions(assets=[upstream, downstream], asset_checks=[family.definition()])
    job = defs.resolve_implicit_global_asset_job_def()
    if only is not None:
        job = job.get_subset(asset_selection=set(), asset_check_selection={only})
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(EPISODES_PARTITION_NAME, [EPISODE])
        return job.execute_in_process(
            partition_key=EPISODE, instance=instance, raise_on_error=False
        )


def evaluations(result) -> dict[str, tuple[bool, str]]:
    return {
        e.check_name: (e.passed, e.severity.value) for e in result.get_asset_check_evaluations()
    }


def check_steps(result) -> set[str]:
    return {
        e.step_key
        for e in result.all_events
        if e.event_type == DagsterEventType.ASSET_CHECK_EVALUATION
    }


def test_both_checks_run_in_one_step_with_their_declared_severity() -> None:
    result = run(family_of(blocking_passes=True))
    assert result.success  # a failed WARN check fails nothing
    assert evaluations(result) == {"must_hold": (True, "ERROR"), "may_warn": (False, "WARN")}
    assert check_steps(result) == {"toy_checks"}
    assert result.asset_materializations_for_node("downstream")


def test_a_failed_blocking_check_stops_the_downstream_asset_and_fails_the_run() -> None:
    result = run(family_of(blocking_passes=False))
    assert not result.success
    assert evaluations(result) == {"must_hold": (False, "ERROR"), "may_warn": (False, "WARN")}
    assert not result.asset_materializations_for_node("downstream")


def test_a_check_that_raises_fails_the_step_after_its_siblings_are_recorded() -> None:
    result = run(family_of(blocking_passes=True, warn_raises=True))
    assert not result.success
    assert evaluations(result) == {"must_hold": (True, "ERROR")}
    (failure,) = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    error = step_error(failure.step_key, failure.step_failure_data.error, "failed")
    assert (error.step, error.error_type, error.message) == (
        "toy_checks",
        "ValueError",
        "no such row",
    )


def test_one_check_runs_alone_when_it_alone_is_selected() -> None:
    key = AssetCheckKey(UPSTREAM, "may_warn")
    result = run(family_of(blocking_passes=False), only=key)
    assert evaluations(result) == {"may_warn": (False, "WARN")}
    assert not result.asset_materializations_for_node("upstream")


def test_every_check_of_the_code_location_can_be_executed_alone() -> None:
    # What the UI's "Execute" on one check needs (its execution set is itself), and that the
    # families share steps: one per module of defs/checks/.
    from episode_pipeline.config.settings import Settings
    from episode_pipeline.definitions import build_definitions

    settings = Settings.from_env({"DB_HOST": "db", "DATA_BUCKET": "bucket"})
    graph = build_definitions(settings).resolve_asset_graph()
    keys = graph.asset_check_keys
    assert all(graph.get_execution_set_asset_and_check_keys(key) == {key} for key in keys)
    steps = {graph.assets_def_for_key(key).node_def.name for key in keys}
    assert len(steps) == 5 < len(keys)
