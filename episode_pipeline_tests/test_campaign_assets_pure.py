"""Which assets a campaign runs (campaign/assets.py): the changed set and its downstream closure
over the episode graph, an unknown record meaning the whole graph."""

from __future__ import annotations

from episode_pipeline.campaign.assets import (
    MISSING_OUTPUTS,
    UNKNOWN_RECORD,
    assets_to_run,
    changed_assets,
    downstream_closure,
    is_missing_stored_output,
    plan_assets,
    stored_inputs,
    with_missing_outputs,
)

# The episode graph as `defs/code_versions.asset_children` reads it from the definitions.
CHILDREN = {
    "extracted_files": {"hls_renditions", "frames", "episode", "episode_metadata"},
    "hls_renditions": {"episode"},
    "frames": {"episode"},
    "episode": {"episode_metadata"},
    "episode_metadata": set(),
}
ORDER = ("extracted_files", "hls_renditions", "frames", "episode_metadata", "episode")
CURRENT = {"extracted_files": "1", "hls_renditions": "2|ladder=720", "frames": "3"} | {
    "episode": "1",
    "episode_metadata": "1",
}
OLD_LADDER = {**CURRENT, "hls_renditions": "2|ladder=480"}
OLD_FRAMES = {**CURRENT, "frames": "2"}


def test_a_ladder_change_closes_over_what_depends_on_hls() -> None:
    assert changed_assets(OLD_LADDER, CURRENT) == {"hls_renditions"}
    assert assets_to_run(OLD_LADDER, CURRENT, CHILDREN) == {
        "hls_renditions",
        "episode",
        "episode_metadata",
    }


def test_a_frames_change_leaves_extraction_and_hls() -> None:
    assert assets_to_run(OLD_FRAMES, CURRENT, CHILDREN) == {"frames", "episode", "episode_metadata"}


def test_an_extraction_change_is_the_whole_graph() -> None:
    old = {**CURRENT, "extracted_files": "0"}
    assert assets_to_run(old, CURRENT, CHILDREN) == set(CURRENT)


def test_no_record_or_an_old_one_is_the_whole_graph() -> None:
    assert assets_to_run(None, CURRENT, CHILDREN) == set(CURRENT)
    assert assets_to_run({}, CURRENT, CHILDREN) == set(CURRENT)
    # An asset the record does not name (added since) changed, and with it what is below it.
    partial = {k: v for k, v in CURRENT.items() if k != "frames"}
    assert assets_to_run(partial, CURRENT, CHILDREN) == {"frames", "episode", "episode_metadata"}


def test_nothing_changed_runs_nothing_for_that_episode() -> None:
    assert assets_to_run(CURRENT, CURRENT, CHILDREN) == set()


def test_the_closure_follows_every_path() -> None:
    chain = {"a": {"b"}, "b": {"c"}, "c": set(), "d": {"c"}}
    assert downstream_closure(["a"], chain) == {"a", "b", "c"}
    assert downstream_closure([], chain) == set()


def test_the_stored_inputs_are_the_unselected_parents() -> None:
    selected = {"hls_renditions", "episode", "episode_metadata"}
    assert stored_inputs(selected, CHILDREN) == {"extracted_files", "frames"}
    assert stored_inputs(set(ORDER), CHILDREN) == set()


def test_the_campaign_selection_is_the_union_of_known_groups() -> None:
    plan = plan_assets([(OLD_LADDER, 900), (OLD_FRAMES, 50)], CURRENT, CHILDREN, ORDER)
    assert plan.assets == ("hls_renditions", "frames", "episode_metadata", "episode")
    assert (plan.episodes_whole_graph, plan.reasons) == (0, {})


def test_unknown_records_run_the_whole_graph_counted() -> None:
    plan = plan_assets(
        [(OLD_LADDER, 900), (None, 7), ({"episode": "0"}, 3)], CURRENT, CHILDREN, ORDER
    )
    assert plan.assets == ("hls_renditions", "episode_metadata", "episode")
    assert plan.episodes_whole_graph == 10 and plan.reasons == {UNKNOWN_RECORD: 10}
    plan = with_missing_outputs(plan, 4)
    assert plan.episodes_whole_graph == 14
    assert plan.reasons == {UNKNOWN_RECORD: 10, MISSING_OUTPUTS: 4}
    assert plan.as_json()["whole_graph"] is False


def test_a_whole_graph_or_empty_union_is_the_whole_graph_for_all() -> None:
    extraction = {**CURRENT, "extracted_files": "0"}
    assert plan_assets([(OLD_LADDER, 5), (extraction, 1)], CURRENT, CHILDREN, ORDER).assets is None
    # A plain reprocess of episodes already current, or of episodes with no record at all.
    assert plan_assets([(CURRENT, 5)], CURRENT, CHILDREN, ORDER).assets is None
    whole = plan_assets([(None, 5)], CURRENT, CHILDREN, ORDER)
    assert whole.assets is None and whole.as_json()["assets"] == list(ORDER)
    assert with_missing_outputs(whole, 3).episodes_whole_graph == 0  # all of them already


def test_a_missing_stored_output_error_is_recognised() -> None:
    error = "hls_renditions: MissingStoredOutput: no stored output for asset 'extracted_files'"
    assert is_missing_stored_output(error)
    assert not is_missing_stored_output("hls_renditions: Failure: transcode failed")
    assert not is_missing_stored_output(None)
