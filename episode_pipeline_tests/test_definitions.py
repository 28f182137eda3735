"""The code location loads, as Dagster's own tooling sees it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_definitions_load_with_the_whole_graph(stack):
    from episode_pipeline.definitions import defs as load_defs

    defs = load_defs()  # what Dagster does when it loads the code location
    repository = defs.get_repository_def()
    assets = {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"raw_archive", "extracted_files", "frames", "episode_metadata", "episode"} <= assets
    assert repository.has_job("process_episode")
    sensors = {sensor.name for sensor in repository.sensor_defs}
    assert {
        "episode_uploads",
        "episode_upload_done",
        "episode_upload_heartbeat",
        "episode_failed_on_run_failure",
        "orphaned_runs",
        "waiting_uploads",
    } <= sensors
    checks = {key.name for key in defs.resolve_asset_graph().asset_check_keys}
    assert "frames_match_parquet_rows" in checks


def test_dg_check_defs_passes_against_the_local_instance(stack):
    dg = Path(sys.executable).parent / "dg"
    result = subprocess.run(
        [str(dg), "check", "defs"],
        cwd=Path(__file__).parents[1],
        env={**os.environ, "DAGSTER_HOME": stack.dagster_home},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All definitions loaded successfully" in result.stdout + result.stderr


def test_the_sync_check_warns_unless_the_setting_makes_it_blocking():
    from episode_pipeline.config.settings import Settings
    from episode_pipeline.definitions import build_definitions

    for env, blocking in (({}, False), ({"SYNC_CHECK_BLOCKING": "1"}, True)):
        settings = Settings.from_env({"DB_HOST": "db", "DATA_BUCKET": "bucket", **env})
        (spec,) = [
            spec
            for checks in build_definitions(settings).asset_checks or []
            for spec in checks.check_specs
            if spec.name == "video_frames_in_sync"
        ]
        assert spec.blocking is blocking
        assert spec.asset_key.to_user_string() == "hls_renditions"
