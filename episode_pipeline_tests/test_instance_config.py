"""The local instance is production's dagster.yaml but for the differences it names (issue 32).

Pure: no server. `local/dagster_home.py` loads the repository's dagster.yaml and applies
`local_differences`; any other difference, in the local instance or the crash tests' daemon,
fails here with its path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from episode_pipeline.local import dagster_home
from episode_pipeline.local.dagster_home import (
    REMOVED,
    Difference,
    apply_differences,
    config_differences,
    env_references,
    instance_config,
    local_differences,
    production_config,
    unnamed_differences,
)
from episode_pipeline_tests.support.daemon import (
    CRASH_STAGE_DIFFERENCES,
    QUEUE_PAUSED_DIFFERENCES,
    SOAK_DIFFERENCES,
    crash_stage_config,
    soak_config,
)
from episode_pipeline_tests.support.dagster_internals import dagster_instance_config

REPO = Path(__file__).resolve().parents[1]
URL = dagster_home.storage_url("pw", 5432, "dagster")


def test_the_local_instance_differs_from_production_only_where_named() -> None:
    production, local = production_config(), instance_config("pw", 5432)
    named = local_differences(URL)
    assert unnamed_differences(production, local, named) == []
    # Every named difference is one (a stale entry would hide nothing, but says something false).
    found = config_differences(production, local)
    assert [name for name in named if not any(p.startswith(name) for p in found)] == []


def test_run_retries_and_run_monitoring_are_production_s() -> None:
    production, local = production_config(), instance_config("pw", 5432)
    assert local["run_retries"] == production["run_retries"]
    assert local["run_retries"] == {
        "enabled": True,
        "max_retries": 2,
        "retry_on_asset_or_op_failure": False,
    }
    resume = "max_resume_run_attempts"  # a named difference: a worker process cannot resume
    monitoring = {k: v for k, v in local["run_monitoring"].items() if k != resume}
    assert monitoring == {k: v for k, v in production["run_monitoring"].items() if k != resume}
    assert monitoring["enabled"] is True
    assert local["run_monitoring"]["max_runtime_seconds"] == dagster_home.RUN_MAX_RUNTIME_SECONDS


def test_a_difference_not_named_fails_with_its_path() -> None:
    production = production_config()
    named = local_differences(URL)
    local = instance_config("pw", 5432)
    del local["run_retries"]
    local["run_monitoring"]["poll_interval_seconds"] = 30
    partition = local["run_coordinator"]["config"]["tag_concurrency_limits"][1]
    assert partition["key"] == "dagster/partition"
    partition["limit"] = 2
    local["concurrency"] = {"pools": {"default_limit": 2}}
    assert unnamed_differences(production, local, named) == [
        "run_coordinator.config.tag_concurrency_limits[key=dagster/partition].limit",
        "run_monitoring.poll_interval_seconds",
        "run_retries",
        "concurrency",
    ]


def test_production_s_environment_is_replaced_by_named_differences_only() -> None:
    """Every `env:` reference of production's is under a named difference, and none is left
    in the local instance (the local stack sets none of production's variables)."""
    production = production_config()
    named = local_differences(URL)
    references = env_references(production)
    assert "run_launcher.config.task_definition" in references
    assert [r for r in references if not any(r.startswith(name) for name in named)] == []
    assert env_references(instance_config("pw", 5432)) == []


def test_dagster_accepts_the_local_instance(tmp_path: Path) -> None:
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(instance_config("pw", 5432)))
    config, _ = dagster_instance_config(str(tmp_path))
    assert config["run_launcher"]["class"] == "LocalRunLauncher"
    assert config["run_retries"]["enabled"] is True


def test_a_difference_applies_to_exactly_what_it_names() -> None:
    config = {"a": {"b": 1, "c": 2}, "limits": [{"key": "org", "limit": 4}]}
    changed = apply_differences(
        config,
        {
            "a.b": Difference(REMOVED, "gone"),
            "a.d.e": Difference(5, "added"),
            "limits[key=org].limit": Difference(1, "smaller"),
        },
    )
    assert changed == {"a": {"c": 2, "d": {"e": 5}}, "limits": [{"key": "org", "limit": 1}]}
    assert config["limits"][0]["limit"] == 4  # the input is left alone
    with pytest.raises(KeyError, match="0 items with key=campaign"):
        apply_differences(config, {"limits[key=campaign].limit": Difference(1, "")})


def test_the_crash_tests_daemon_differs_only_where_named() -> None:
    production = production_config()
    crash = crash_stage_config("pw", 5432, "dagster")
    named = {**local_differences(URL), **CRASH_STAGE_DIFFERENCES}
    assert unnamed_differences(production, crash, named) == []
    assert crash["run_retries"] == production["run_retries"]
    paused = apply_differences(crash, QUEUE_PAUSED_DIFFERENCES)
    assert unnamed_differences(production, paused, {**named, **QUEUE_PAUSED_DIFFERENCES}) == []


def test_the_campaign_soak_s_daemon_differs_only_where_named() -> None:
    production = production_config()
    soak = soak_config(URL)
    named = {**local_differences(URL), **SOAK_DIFFERENCES}
    assert unnamed_differences(production, soak, named) == []
    assert soak["run_retries"] == production["run_retries"]


def test_the_documented_differences_are_the_code_s() -> None:
    doc = (REPO / dagster_home.DOC).read_text()
    stale = "stale: run `python -m episode_pipeline.local.dagster_home`"
    assert dagster_home.documented(doc) == doc, stale
