"""The deployment's files and the production environment the deploy tests share."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# Where scripts/validate-infra.sh keeps checkov and hadolint (outside the work tree).
TOOLS_VENV = Path(
    os.environ.get("EPISODE_PIPELINE_TOOLS_VENV")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / "episode-pipeline"
    / "venv-checkov"
)


VALIDATE_SCRIPT = ROOT / "scripts" / "validate-infra.sh"


# What the ECS task definitions in infra/ecs.tf set (test_deploy_infra checks the names match).
PRODUCTION_ENV = {
    "AWS_REGION": "us-west-2",
    "AWS_DEFAULT_REGION": "us-west-2",
    "DAGSTER_PG_HOST": "aurora.cluster-abc.us-west-2.rds.amazonaws.com",
    "DAGSTER_PG_PORT": "5432",
    "DAGSTER_PG_DB": "dagster",
    "DAGSTER_PG_USER": "dagster",
    "DAGSTER_RUN_TASK_DEFINITION": "episode-pipeline-run",
    "DAGSTER_RUN_CONTAINER_NAME": "run",
    "DAGSTER_COMPUTE_LOG_BUCKET": "episode-pipeline-dagster-123456789012",
    "DAGSTER_CODE_SERVER_HOST": "code-server.episode-pipeline.internal",
    "DAGSTER_CODE_SERVER_PORT": "4000",
}
