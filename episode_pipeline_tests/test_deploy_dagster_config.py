"""The production dagster.yaml and workspace.yaml, checked against Dagster's own schemas.

The files are only read on AWS, so a typo would surface at the first deploy. Here they go through
the same validation the instance and workspace loaders apply, and the configured classes are built
from them (the ECS run launcher against a moto server's ECS API), so a field that Dagster renamed or
a value of the wrong type fails in the test suite instead.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from dagster import DagsterRun
from dagster_postgres.auth import AwsWifTokenProvider
from dagster_postgres.utils import get_token_provider_from_config, pg_url_from_config

from episode_pipeline.instance.storage import PooledPostgresRunStorage
from episode_pipeline_tests.support.dagster_internals import (
    ConfigurableClassData,
    dagster_instance_config,
    ensure_workspace_config,
    process_config,
)
from episode_pipeline_tests.support.deploy import PRODUCTION_ENV

ROOT = Path(__file__).resolve().parents[1]
DAGSTER_YAML = ROOT / "dagster.yaml"
WORKSPACE_YAML = ROOT / "workspace.yaml"


def env_names(node: Any) -> set[str]:
    """Every `{env: NAME}` source in a loaded YAML tree."""
    if isinstance(node, dict):
        if set(node) == {"env"} and isinstance(node["env"], str):
            return {node["env"]}
        return set().union(*(env_names(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(env_names(value) for value in node))
    return set()


@pytest.fixture
def production_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name, value in PRODUCTION_ENV.items():
        monkeypatch.setenv(name, value)
    return PRODUCTION_ENV


@pytest.fixture(scope="module")
def instance_yaml() -> dict[str, Any]:
    return yaml.safe_load(DAGSTER_YAML.read_text())


def test_every_variable_the_yaml_files_read_is_in_the_production_env() -> None:
    read = env_names(yaml.safe_load(DAGSTER_YAML.read_text())) | env_names(
        yaml.safe_load(WORKSPACE_YAML.read_text())
    )
    assert read, "no {env: ...} sources found: the walker or the files changed"
    assert read <= set(PRODUCTION_ENV), (
        f"not covered by PRODUCTION_ENV: {read - set(PRODUCTION_ENV)}"
    )


def test_instance_config_passes_dagsters_validation(tmp_path: Path, production_env) -> None:
    shutil.copy(DAGSTER_YAML, tmp_path / "dagster.yaml")
    config, custom_class = dagster_instance_config(str(tmp_path))
    assert custom_class is None
    assert config["run_coordinator"]["class"] == "EpisodeRunCoordinator"
    assert config["run_launcher"]["class"] == "EcsRunLauncher"
    assert config["compute_logs"]["class"] == "S3ComputeLogManager"
    assert config["telemetry"] == {"enabled": False}
    assert config["run_monitoring"]["enabled"] is True
    assert config["run_monitoring"]["max_resume_run_attempts"] > 0
    assert config["run_retries"]["enabled"] is True
    assert config["run_retries"]["max_retries"] > 0


def test_instance_validation_rejects_a_misspelled_field(tmp_path: Path, instance_yaml) -> None:
    """Guards the test above: the validator must really look at the fields."""
    broken = {**instance_yaml, "run_monitoring": {"enabled": True, "start_timeout": 60}}
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(broken))
    with pytest.raises(Exception, match="start_timeout"):
        dagster_instance_config(str(tmp_path))


def test_the_three_storages_share_one_database_and_the_event_log_is_ours(instance_yaml) -> None:
    from episode_pipeline.instance.event_log_storage import EpisodeEventLogStorage
    from episode_pipeline.instance.storage import PooledEpisodeEventLogStorage
    from episode_pipeline.local.dagster_home import POOLED_STORAGE_CLASSES

    for block, (module, cls) in POOLED_STORAGE_CLASSES.items():
        assert (instance_yaml[block]["module"], instance_yaml[block]["class"]) == (module, cls)
        assert instance_yaml[block]["config"] == instance_yaml["run_storage"]["config"]
    assert "storage" not in instance_yaml  # Dagster refuses `storage` beside the three
    assert issubclass(PooledEpisodeEventLogStorage, EpisodeEventLogStorage)


def test_storage_uses_psycopg2_and_an_rds_iam_token(production_env, instance_yaml) -> None:
    config_type = PooledPostgresRunStorage.config_type()
    result = process_config(config_type, instance_yaml["event_log_storage"]["config"])
    assert result.success, result.errors
    storage = result.value
    url = pg_url_from_config(storage)
    # psycopg2, not psycopg 3: the run storage's NOTIFY breaks under psycopg 3
    # (docs/platform-notes.md#dagster-storage-url).
    assert url == (
        "postgresql+psycopg2://dagster@aurora.cluster-abc.us-west-2.rds.amazonaws.com:5432/dagster"
        "?sslmode=require"
    )
    provider = get_token_provider_from_config(storage)
    assert isinstance(provider, AwsWifTokenProvider)
    assert provider._hostname == production_env["DAGSTER_PG_HOST"]
    assert provider._port == 5432
    assert provider._username == "dagster"
    assert provider._region == "us-west-2"


def test_documented_password_variant_is_valid(
    production_env, instance_yaml, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's password variant: no auth_provider, a password from DAGSTER_PG_PASSWORD."""
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", "p@ss word")
    postgres = dict(instance_yaml["event_log_storage"]["config"])
    del postgres["auth_provider"]
    postgres["postgres_db"] = {
        **postgres["postgres_db"],
        "password": {"env": "DAGSTER_PG_PASSWORD"},
    }
    result = process_config(PooledPostgresRunStorage.config_type(), postgres)
    assert result.success, result.errors
    assert get_token_provider_from_config(result.value) is None
    assert pg_url_from_config(result.value).startswith(
        "postgresql+psycopg2://dagster:p%40ss%20word@aurora."
    )


def _rehydrate(section: dict[str, Any]) -> Any:
    return ConfigurableClassData(
        section["module"], section["class"], yaml.safe_dump(section.get("config", {}))
    ).rehydrate(as_type=object)


def test_run_queue_limits_globally_and_per_org(production_env, instance_yaml) -> None:
    from episode_pipeline_tests.support.dagster_internals import QueuedRunCoordinator

    coordinator = _rehydrate(instance_yaml["run_coordinator"])
    assert isinstance(coordinator, QueuedRunCoordinator)
    queue = coordinator.get_run_queue_config()
    assert queue.max_concurrent_runs == 400
    limits = {limit["key"]: limit for limit in queue.tag_concurrency_limits}
    assert limits["org"]["value"] == {"applyLimitPerUniqueValue": True}
    assert 0 < limits["org"]["limit"] < queue.max_concurrent_runs
    assert limits["dagster/backfill"]["limit"] < queue.max_concurrent_runs
    # Campaign runs have a lane of their own inside the backfills', as wide as the governor's
    # maximum (docs/operations.md#reprocess-the-fleet).
    from episode_pipeline.config.settings import CampaignSettings
    from episode_pipeline.instance.run_tags import CAMPAIGN_TAG

    campaign = limits[CAMPAIGN_TAG]["limit"]
    assert CampaignSettings().concurrency_max <= campaign <= limits["dagster/backfill"]["limit"]


def test_the_static_run_limits_leave_room_for_each_campaigns(instance_yaml) -> None:
    """`concurrency: runs:` would replace the coordinator's limits, and with them each campaign's
    launch limit (instance/campaign_queue.py): production's and the laptop's keep theirs there."""
    from episode_pipeline.local.dagster_home import instance_config

    for config in (instance_yaml, instance_config("password", 5432)):
        assert "runs" not in config.get("concurrency", {})
        assert config["run_coordinator"]["config"]["tag_concurrency_limits"]


def test_compute_logs_go_to_the_dagster_bucket(production_env, instance_yaml) -> None:
    from dagster_aws.s3.compute_log_manager import S3ComputeLogManager

    manager = _rehydrate(instance_yaml["compute_logs"])
    assert isinstance(manager, S3ComputeLogManager)
    assert manager._s3_bucket == production_env["DAGSTER_COMPUTE_LOG_BUCKET"]
    # infra/storage.tf expires and grants exactly this prefix (local.compute_log_prefix).
    assert manager._s3_prefix == "compute-logs"
    assert manager.upload_interval == 30


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def aws_env(production_env, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return moto_endpoint


def _register(family: str, container: str) -> str:
    ecs = boto3.client("ecs")
    response = ecs.register_task_definition(
        family=family,
        requiresCompatibilities=["FARGATE"],
        networkMode="awsvpc",
        cpu="1024",
        memory="2048",
        containerDefinitions=[{"name": container, "image": "example/app:latest", "memory": 2048}],
    )
    return response["taskDefinition"]["taskDefinitionArn"]


def test_run_launcher_uses_the_terraform_task_definition(aws_env, instance_yaml) -> None:
    from dagster_aws.ecs import EcsRunLauncher
    from dagster_aws.ecs.container_context import EcsContainerContext

    arn = _register(PRODUCTION_ENV["DAGSTER_RUN_TASK_DEFINITION"], "run")
    launcher = _rehydrate(instance_yaml["run_launcher"])
    assert isinstance(launcher, EcsRunLauncher)
    assert launcher.task_definition == arn
    assert launcher.container_name == "run"
    assert launcher.include_sidecars is False
    assert launcher.secrets_tags == []  # no secretsmanager:ListSecrets needed

    def overrides(tags: dict[str, str]) -> dict[str, str]:
        run = DagsterRun(job_name="process_episode", run_id="r" * 32, tags=tags)
        context = EcsContainerContext.create_for_run(run, launcher)
        return dict(launcher.get_cpu_and_memory_overrides(context, run))

    # Enough to transcode by default; the uploads sensor sizes each run with these tags.
    assert overrides({}) == {"cpu": "2048", "memory": "4096"}
    assert overrides({"ecs/cpu": "4096", "ecs/memory": "8192"}) == {
        "cpu": "4096",
        "memory": "8192",
    }

    run = DagsterRun(
        job_name="process_episode",
        run_id="s" * 32,
        tags={"org": "acme", "dagster/partition": "acme/ep-1", "dagster/op_selection": "x"},
    )
    propagated = {
        tag["key"]: tag["value"]
        for tag in launcher.build_ecs_tags_for_run_task(
            run, EcsContainerContext.create_for_run(run, launcher)
        )
    }
    assert propagated["org"] == "acme"
    assert propagated["dagster/partition"] == "acme/ep-1"
    assert propagated["app"] == "episode-pipeline"
    assert "dagster/op_selection" not in propagated


def test_run_launcher_refuses_a_task_definition_without_the_container(
    aws_env, instance_yaml, monkeypatch: pytest.MonkeyPatch
) -> None:
    _register("episode-pipeline-wrong", "worker")
    monkeypatch.setenv("DAGSTER_RUN_TASK_DEFINITION", "episode-pipeline-wrong")
    with pytest.raises(Exception, match="container is not defined"):
        _rehydrate(instance_yaml["run_launcher"])


def test_workspace_points_at_the_code_server(production_env) -> None:
    config = ensure_workspace_config(
        yaml.safe_load(WORKSPACE_YAML.read_text()), str(WORKSPACE_YAML)
    )
    [entry] = config["load_from"]
    server = entry["grpc_server"]
    assert server == {
        "host": "code-server.episode-pipeline.internal",
        "port": 4000,
        "location_name": "episode_pipeline",
    }
