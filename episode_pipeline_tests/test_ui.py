"""The Dagster UI as an operator sees it, on a real `dagster dev` against the session's stack.

Two uploads reach Dagster the production way (S3 event → SQS → the daemon's sensor → a run).
Then the tests read what the UI's pages read, through the same GraphQL API: staleness (fresh
after the run; a re-upload of new bytes makes exactly that episode stale until it is reprocessed;
a new code version makes exactly that asset stale), metadata types, owners, kinds and groups;
a backfill over both episodes launched as the UI launches it; and a real headless browser
(Debian's chromium driven by Playwright) renders the asset graph and an episode's partition page.

One `dagster dev` and one pair of episodes serve the whole module (starting it costs ~15 s).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from episode_pipeline.defs.asset_keys import RAW_ARCHIVE_KEY
from episode_pipeline.defs.jobs import EPISODE_ASSETS
from episode_pipeline.defs.partitions import EPISODE_GROUP, EPISODE_OWNERS
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.instance.run_tags import EPISODE_JOB_NAME
from episode_pipeline.local.dev import WORKSPACE_FILE
from episode_pipeline.local.stack import StackInfo
from episode_pipeline.local.upload import upload_episode
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline_tests.dagster_ui import DagsterDev, running_dagster_dev
from episode_pipeline_tests.support import new_ref
from episode_pipeline_tests.support.browser import chromium_or_skip, screenshots

pytestmark = pytest.mark.integration

RUN_SECONDS = 240
PARTITION_TAG = "dagster/partition"
ASSET_JOB = "__ASSET_JOB"
UPLOADS_SENSOR = "episode_uploads"
LOCATION = "episode_pipeline"
NUX_KEY = "communityNux"  # the UI's localStorage flag for "community modal dismissed"

BACKFILL_SECONDS = 180
BACKFILL_TAG = "dagster/backfill"
DONE_STATUSES = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}
# The UI's LAUNCH_PARTITION_BACKFILL_MUTATION (ui-core), minus its error fragment's stack.
LAUNCH_BACKFILL_MUTATION = """
mutation LaunchPartitionBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId launchedRunIds }
    ... on PartitionSetNotFoundError { message }
    ... on PartitionKeysNotFoundError { message }
    ... on InvalidSubsetError { message }
    ... on UnauthorizedError { message }
    ... on PythonError { message stack }
  }
}
"""
BACKFILL_QUERY = """
query Backfill($backfillId: String!) {
  partitionBackfillOrError(backfillId: $backfillId) {
    __typename
    ... on PartitionBackfill { id status numPartitions partitionNames }
    ... on PythonError { message }
  }
}
"""


ASSET_NODES_QUERY = """
fragment Entry on MetadataEntry {
  __typename label
  ... on UrlMetadataEntry { url }
  ... on IntMetadataEntry { intValue }
  ... on TextMetadataEntry { text }
  ... on MarkdownMetadataEntry { mdStr }
  ... on TableMetadataEntry { table { records schema { columns { name type } } } }
  ... on TableSchemaMetadataEntry { schema { columns { name type } } }
  ... on TableColumnLineageMetadataEntry {
    lineage { columnName columnDeps { assetKey { path } columnName } }
  }
}
query AssetNodes($partitions: [String!]) {
  assetNodes {
    assetKey { path }
    groupName
    description
    opVersion
    kinds
    isObservable
    tags { key value }
    owners { __typename ... on TeamAssetOwner { team } ... on UserAssetOwner { email } }
    metadataEntries { ...Entry }
    staleStatusByPartition(partitions: $partitions)
    staleCausesByPartition(partitions: $partitions) { key { path } reason category }
    latestMaterializationByPartition(partitions: $partitions) { metadataEntries { ...Entry } }
  }
}
"""
SENSOR_QUERY = """
query Sensor($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    __typename ... on Sensor { id sensorState { status ticks(limit: 1) { status } } }
  }
}
"""
STOP_SENSOR = """
mutation Stop($id: String!) {
  stopSensor(id: $id) { __typename ... on StopSensorMutationResult { instigationState { status } } }
}
"""
START_SENSOR = """
mutation Start($selector: SensorSelector!) {
  startSensor(sensorSelector: $selector) { __typename ... on Sensor { sensorState { status } } }
}
"""
# The UI's LAUNCH_PIPELINE_EXECUTION_MUTATION, as its "Observe" button on raw_archive sends it.
LAUNCH_RUN = """
mutation Launch($executionParams: ExecutionParams!) {
  launchPipelineExecution(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on InvalidSubsetError { message }
  }
}
"""


def runs_of(ref: EpisodeRef) -> list[Any]:
    return list(DagsterInstance.get().get_runs(RunsFilter(tags={PARTITION_TAG: ref.partition_key})))


def wait_for_runs(dev: DagsterDev, refs: list[EpisodeRef], succeeded: int) -> None:
    """Until each episode has `succeeded` successful runs and none in flight or failed."""
    deadline = time.monotonic() + RUN_SECONDS
    while True:
        runs = {ref: runs_of(ref) for ref in refs}
        failed = [r.run_id for rs in runs.values() for r in rs if r.status.value == "FAILURE"]
        assert not failed, f"runs failed: {failed}\n{dev.tail()}"
        done = all(
            sum(r.status == DagsterRunStatus.SUCCESS for r in rs) >= succeeded
            and all(r.is_finished for r in rs)
            for rs in runs.values()
        )
        if done:
            return
        states = {str(ref): [r.status.value for r in rs] for ref, rs in runs.items()}
        assert time.monotonic() < deadline, f"runs not done: {states}\n{dev.tail()}"
        time.sleep(1)


def upload_sample(tmp: Path, ref: EpisodeRef, seconds: float) -> None:
    archive = tmp / f"{ref.episode_id}-{seconds}.tar.zst"
    write_sample(archive, SampleSpec(seconds=seconds, cameras=1))
    upload_episode(archive, ref)


@pytest.fixture(scope="module")
def ui(stack: StackInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagsterDev]:
    with running_dagster_dev(stack, tmp_path_factory.mktemp("ui")) as dev:
        dev.wait_until_up()
        yield dev


@pytest.fixture(scope="module")
def episodes(
    ui: DagsterDev, stack: StackInfo, tmp_path_factory: pytest.TempPathFactory
) -> list[EpisodeRef]:
    """Two episodes processed by the daemon's sensor: `[shown, reuploaded]`."""
    tmp = tmp_path_factory.mktemp("ui-uploads")
    # Two orgs: the local run queue runs one run per org at a time, two at once.
    refs = [new_ref("ui-org-a"), new_ref("ui-org-b")]
    for ref in refs:
        upload_sample(tmp, ref, seconds=1.0)
    wait_for_runs(ui, refs, succeeded=1)
    return refs


def asset_nodes(dev: DagsterDev, partition: str) -> dict[str, dict[str, Any]]:
    nodes = dev.graphql(ASSET_NODES_QUERY, {"partitions": [partition]})["assetNodes"]
    return {"/".join(node["assetKey"]["path"]): node for node in nodes}


def stale_statuses(dev: DagsterDev, ref: EpisodeRef) -> dict[str, str]:
    nodes = asset_nodes(dev, ref.partition_key)
    return {name: nodes[name]["staleStatusByPartition"][0] for name in EPISODE_ASSETS}


def sensor_selector(dev: DagsterDev) -> dict[str, str]:
    repository = dev.repository_of("process_episode")
    return {**repository, "sensorName": UPLOADS_SENSOR}


def observe_uploads(dev: DagsterDev) -> None:
    """Click *Observe* on raw_archive: every known episode's upload is listed again."""
    repository = dev.repository_of("process_episode")
    params = {
        "mode": "default",
        "runConfigData": "{}",
        "executionMetadata": {"tags": []},
        "selector": {
            **repository,
            "pipelineName": ASSET_JOB,
            "assetSelection": [{"path": RAW_ARCHIVE_KEY.path}],
            "assetCheckSelection": [],
        },
    }
    launched = dev.graphql(LAUNCH_RUN, {"executionParams": params})["launchPipelineExecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]
    deadline = time.monotonic() + RUN_SECONDS
    while not (run := DagsterInstance.get().get_run_by_id(run_id)).is_finished:
        assert time.monotonic() < deadline, f"observation run {run_id} not done\n{dev.tail()}"
        time.sleep(1)
    assert run.status == DagsterRunStatus.SUCCESS, dev.tail()


def wait_for_no_tick_in_progress(ui: DagsterDev, selector: dict[str, str]) -> None:
    """A tick the daemon started just before the sensor was stopped still receives messages:
    wait until the latest tick has ended, twice in a row (the daemon may have checked the
    sensor's state a moment before the stop and not yet recorded its tick)."""
    deadline = time.monotonic() + 60
    quiet = 0
    while quiet < 2:
        assert time.monotonic() < deadline, "a tick of the stopped sensor never ended"
        state = ui.graphql(SENSOR_QUERY, {"selector": selector})["sensorOrError"]["sensorState"]
        ended = all(tick["status"] != "STARTED" for tick in state["ticks"])
        quiet = quiet + 1 if ended else 0
        time.sleep(1)


def test_staleness_is_true_after_a_run_and_after_a_reupload(
    ui: DagsterDev, episodes: list[EpisodeRef], tmp_path: Path
) -> None:
    shown, reuploaded = episodes
    every_asset_fresh = dict.fromkeys(EPISODE_ASSETS, "FRESH")
    # A run that processed the current upload leaves every asset of its episode fresh.
    assert stale_statuses(ui, shown) == every_asset_fresh
    assert stale_statuses(ui, reuploaded) == every_asset_fresh

    # New bytes for one episode, seen before any run (the sensor is paused, as in the UI). The
    # sensor's state lives in the instance, shared with the other tests: it is always resumed.
    selector = sensor_selector(ui)
    sensor = ui.graphql(SENSOR_QUERY, {"selector": selector})["sensorOrError"]
    stopped = ui.graphql(STOP_SENSOR, {"id": sensor["id"]})["stopSensor"]
    try:
        assert stopped["instigationState"]["status"] == "STOPPED", stopped
        wait_for_no_tick_in_progress(ui, selector)
        upload_sample(tmp_path, reuploaded, seconds=2.0)
        observe_uploads(ui)

        # ... exactly that episode's extracted_files is stale, because of raw_archive.
        assert stale_statuses(ui, shown) == every_asset_fresh
        statuses = stale_statuses(ui, reuploaded)
        assert statuses == {**every_asset_fresh, "extracted_files": "STALE"}, statuses
        nodes = asset_nodes(ui, reuploaded.partition_key)
        (cause,) = nodes["extracted_files"]["staleCausesByPartition"][0]
        assert cause["key"]["path"] == RAW_ARCHIVE_KEY.path, cause  # the root cause: the upload
        assert cause["category"] == "DATA" and "new data version" in cause["reason"], cause
    finally:
        started = ui.graphql(START_SENSOR, {"selector": selector})["startSensor"]
    assert started["sensorState"]["status"] == "RUNNING", started

    # Reprocessing it (the resumed sensor hands the waiting upload to a run) makes it fresh.
    wait_for_runs(ui, [reuploaded], succeeded=2)
    assert stale_statuses(ui, reuploaded) == every_asset_fresh


def test_a_new_transcode_preset_marks_only_hls_renditions_stale(
    episodes: list[EpisodeRef], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The code location as deployed with another preset, read through the UI's GraphQL API."""
    from dagster_graphql.test.utils import define_out_of_process_context, execute_dagster_graphql

    shown = episodes[0]
    monkeypatch.setenv("TRANSCODE_PRESET", "ultrafast")  # the code server inherits it
    with define_out_of_process_context(str(WORKSPACE_FILE), None, DagsterInstance.get()) as context:
        result = execute_dagster_graphql(
            context, ASSET_NODES_QUERY, {"partitions": [shown.partition_key]}
        )
    assert not result.errors, result.errors
    nodes = {"/".join(n["assetKey"]["path"]): n for n in result.data["assetNodes"]}
    statuses = {name: nodes[name]["staleStatusByPartition"][0] for name in EPISODE_ASSETS}
    assert statuses == {**dict.fromkeys(EPISODE_ASSETS, "FRESH"), "hls_renditions": "STALE"}
    (cause,) = nodes["hls_renditions"]["staleCausesByPartition"][0]
    assert cause["category"] == "CODE", cause
    assert "preset=ultrafast," in nodes["hls_renditions"]["opVersion"]


def entries_of(node: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (materialization,) = node["latestMaterializationByPartition"]
    assert materialization is not None, node["assetKey"]
    return {entry["label"]: entry for entry in materialization["metadataEntries"]}


def test_metadata_owners_kinds_and_group_as_the_ui_shows_them(
    ui: DagsterDev, episodes: list[EpisodeRef]
) -> None:
    shown = episodes[0]
    nodes = asset_nodes(ui, shown.partition_key)
    assert set(nodes) == {*EPISODE_ASSETS, "raw_archive"}
    for name, node in nodes.items():
        assert node["groupName"] == EPISODE_GROUP, name
        # Descriptions begin with a plain sentence, not with code.
        assert node["description"][0].isupper(), (name, node["description"])
        if not node["isObservable"]:
            assert node["opVersion"], name
            teams = [owner.get("team") for owner in node["owners"]]
            assert teams == [owner.removeprefix("team:") for owner in EPISODE_OWNERS], name
    assert nodes["raw_archive"]["kinds"] == ["s3"]
    assert set(nodes["frames"]["kinds"]) == {"postgres", "polars"}
    assert {"key": "layer", "value": "serving"} in nodes["episode"]["tags"]

    extracted = entries_of(nodes["extracted_files"])
    assert extracted["files"]["__typename"] == "TableMetadataEntry"
    files_table = extracted["files"]["table"]
    assert [c["name"] for c in files_table["schema"]["columns"]][:2] == ["path", "kind"]
    assert len(files_table["records"]) >= 3  # the video, the data parquet, info.json, ...
    assert extracted["skipped_files"]["__typename"] == "TableMetadataEntry"
    for label in ("archive", "processed_prefix"):
        assert extracted[label]["__typename"] == "UrlMetadataEntry", label
        assert extracted[label]["url"].startswith("http"), extracted[label]
    # The link opens: locally it is the moto endpoint itself.
    with urllib.request.urlopen(extracted["archive"]["url"], timeout=30) as response:
        assert response.status == 200 and response.read(4) == b"\x28\xb5\x2f\xfd"  # zstd magic

    definition = {entry["label"]: entry for entry in nodes["frames"]["metadataEntries"]}
    assert definition["dagster/table_name"]["text"] == "public.frames"
    frames = entries_of(nodes["frames"])
    assert frames["dagster/row_count"]["intValue"] > 0
    columns = [c["name"] for c in frames["dagster/column_schema"]["schema"]["columns"]]
    assert {"episode_id", "timestamp_ms", "observation", "action"} <= set(columns)
    lineage = {
        item["columnName"]: [(d["assetKey"]["path"], d["columnName"]) for d in item["columnDeps"]]
        for item in frames["dagster/column_lineage"]["lineage"]
    }
    assert lineage["timestamp_ms"] == [(["extracted_files"], "timestamp")]
    assert lineage["observation"] == [(["extracted_files"], "observation.state")]

    episode = entries_of(nodes["episode"])
    assert episode["processed_at"]["__typename"] == "TimestampMetadataEntry"
    assert episode["playlists"]["__typename"] == "MarkdownMetadataEntry"
    assert "(http" in episode["playlists"]["mdStr"]
    assert episode["mp4_s3_path"]["__typename"] == "UrlMetadataEntry"

    values = entries_of(nodes["episode_metadata"])["values"]
    assert values["__typename"] == "TableMetadataEntry"
    assert len(values["table"]["records"]) == 12


def test_the_asset_graph_and_an_episode_page_render_in_a_browser(
    ui: DagsterDev, episodes: list[EpisodeRef], tmp_path: Path
) -> None:
    executable = chromium_or_skip()
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=90_000)  # a cold UI on a busy 2-core machine is slow

    shots = screenshots()
    shown = episodes[0]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            # The first visit to a local UI asks to join the community in a modal: not today.
            context.add_init_script(f"localStorage.setItem('{NUX_KEY}', JSON.stringify('1'))")
            page = context.new_page()
            page.set_default_timeout(90_000)

            page.goto(f"{ui.url}/locations/{LOCATION}/asset-groups/{EPISODE_GROUP}")
            for name in ("raw_archive", *EPISODE_ASSETS):
                expect(page.get_by_text(name, exact=True).first).to_be_visible()
            page.screenshot(path=shots / "ui-asset-graph.png")

            partition = quote(shown.partition_key, safe="")
            page.goto(f"{ui.url}/assets/extracted_files?view=partitions&partition={partition}")
            # The metadata table renders as a table: its column headers and a skipped-file row.
            expect(page.get_by_text("skipped_files", exact=True).first).to_be_visible()
            expect(page.locator("th", has_text="reason").first).to_be_visible()
            expect(page.locator("td", has_text="meta/stats.json").first).to_be_visible()
            page.screenshot(path=shots / "ui-episode-partition.png")

            # The poster of each camera, when the HLS step records posters (inline JPEGs in
            # the `posters` markdown; a long one opens from its "[Show Markdown]" link).
            page.goto(f"{ui.url}/assets/hls_renditions?view=partitions&partition={partition}")
            expect(page.get_by_text("cameras", exact=True).first).to_be_visible()
            row = page.locator("tr", has=page.get_by_text("posters", exact=True))
            if row.count():
                shown_in = row.first
                if shown_in.get_by_text("[Show Markdown]").count():
                    shown_in.get_by_text("[Show Markdown]").click()
                    shown_in = page.get_by_role("dialog")
                poster = shown_in.locator("img").first
                expect(poster).to_be_visible()
                width = poster.evaluate("image => image.complete && image.naturalWidth")
                assert width, "the poster image did not load"
                page.screenshot(path=shots / "ui-poster.png")
        finally:
            browser.close()


def episode_state(conn: psycopg.Connection, ref: EpisodeRef) -> tuple[str, datetime | None]:
    row = conn.execute(
        "SELECT status, processed_at FROM episodes WHERE id = %s AND org_id = %s",
        (ref.episode_id, ref.org_id),
    ).fetchone()
    assert row is not None, f"no episodes row for {ref}"
    return row[0], row[1]


def counts(conn: psycopg.Connection, ref: EpisodeRef) -> dict[str, int]:
    return {
        table: conn.execute(
            f"SELECT count(*) FROM {table} WHERE episode_id = %s", (ref.episode_id,)
        ).fetchone()[0]
        for table in ("frames", "episode_metadata")
    }


def settled_counts(
    conn: psycopg.Connection, refs: list[EpisodeRef], timeout: float
) -> dict[EpisodeRef, dict[str, int]]:
    """Row counts once each episode's metadata is there: it is written after `processed`."""
    deadline = time.monotonic() + timeout
    while True:
        found = {ref: counts(conn, ref) for ref in refs}
        if all(c["episode_metadata"] for c in found.values()) or time.monotonic() > deadline:
            return found
        time.sleep(1)


def wait_processed(
    conn: psycopg.Connection, refs: list[EpisodeRef], dev: DagsterDev, timeout: float
) -> dict[EpisodeRef, datetime]:
    deadline = time.monotonic() + timeout
    while True:
        states = {ref: episode_state(conn, ref) for ref in refs}
        if all(status == "processed" for status, _ in states.values()):
            return {ref: processed_at for ref, (_, processed_at) in states.items()}
        failed = {ref: status for ref, (status, _) in states.items() if status == "failed"}
        assert not failed, f"uploads failed: {failed}\n{dev.tail()}"
        assert time.monotonic() < deadline, f"uploads not processed: {states}\n{dev.tail()}"
        time.sleep(1)


def backfill_runs(backfill_id: str) -> list[Any]:
    return list(DagsterInstance.get().get_runs(RunsFilter(tags={BACKFILL_TAG: backfill_id})))


def wait_backfill(dev: DagsterDev, id_: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        backfill = dev.graphql(BACKFILL_QUERY, {"backfillId": id_})
        backfill = backfill["partitionBackfillOrError"]
        assert backfill["__typename"] == "PartitionBackfill", backfill
        if backfill["status"] in DONE_STATUSES:
            return backfill
        runs = [(run.tags.get(PARTITION_TAG), run.status.value) for run in backfill_runs(id_)]
        assert time.monotonic() < deadline, f"backfill {backfill}, runs {runs}\n{dev.tail()}"
        time.sleep(2)


def test_a_backfill_over_several_episodes_from_the_ui(
    ui: DagsterDev, episodes: list[EpisodeRef], db_conn: psycopg.Connection
) -> None:
    """A backfill of both episodes launched exactly as the UI does (*Jobs → process_episode →
    Materialize*, pick partitions, *Launch backfill*: the same GraphQL mutation with the same
    parameters). The backfill daemon runs one run per partition, and the re-runs replace what
    the first runs wrote, not add to it."""
    refs = list(episodes)
    wait_for_runs(ui, refs, succeeded=1)  # nothing of the earlier tests still in flight
    first_processed = wait_processed(db_conn, refs, ui, BACKFILL_SECONDS)
    first_counts = settled_counts(db_conn, refs, BACKFILL_SECONDS)
    assert all(written["frames"] > 0 for written in first_counts.values()), first_counts

    # What the UI sends from the job's Materialize dialog when several partitions are picked.
    repository = ui.repository_of(EPISODE_JOB_NAME)
    partitions = [ref.partition_key for ref in refs]
    params = {
        "selector": {
            "partitionSetName": f"{EPISODE_JOB_NAME}_partition_set",
            "repositorySelector": repository,
        },
        "assetSelection": [{"path": [name]} for name in EPISODE_ASSETS],
        "partitionNames": partitions,
        "fromFailure": False,
        "tags": [{"key": "dagster/from_ui", "value": "true"}],
    }
    launched = ui.graphql(LAUNCH_BACKFILL_MUTATION, {"backfillParams": params})
    launched = launched["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    backfill_id = launched["backfillId"]

    backfill = wait_backfill(ui, backfill_id, BACKFILL_SECONDS)
    runs = backfill_runs(backfill_id)
    assert backfill["status"] == "COMPLETED_SUCCESS", (backfill, runs, ui.tail())
    assert sorted(backfill["partitionNames"]) == sorted(partitions)
    assert sorted(run.tags[PARTITION_TAG] for run in runs) == sorted(partitions)
    assert all(run.status.value == "SUCCESS" for run in runs), [
        (run.run_id, run.status.value) for run in runs
    ]
    assert {run.job_name for run in runs} == {EPISODE_JOB_NAME}
    # The per-org run limit applies to backfills too: the job tags every run with its org.
    assert {run.tags.get("org") for run in runs} == {ref.org_id for ref in refs}

    for ref in refs:
        status, processed_at = episode_state(db_conn, ref)
        assert status == "processed"
        assert processed_at is not None and processed_at > first_processed[ref]
        assert counts(db_conn, ref) == first_counts[ref]  # replaced, not duplicated
