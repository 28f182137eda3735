"""infra/ Terraform: its own tests, the offline validators, and what only the text can tell.

No AWS account is reachable here. What gets created (queue numbers, the upload route of an adopted
or a created data bucket, IAM scopes, task sizes, log retention, ...) is asserted by Terraform
itself: `terraform test` runs infra/tests/*.tftest.hcl, real plans and applies against a mocked
AWS provider. This module runs them, with `terraform fmt -check` and `terraform validate` (the
AWS provider from the machine image's filesystem mirror, no registry), and checkov with every
suppression justified inline. It keeps the checks that need the configuration's text or other
parts of the project: suppressions say why, variables and outputs are documented, the tasks get
every variable the code and dagster.yaml read, and the deploy workflow rolls the services
Terraform names. What each upload route delivers is parsed in test_events_shapes.py (AWS's
samples) and test_sensor_routes.py (moto).

Missing tools: outside CI a test that needs terraform, the provider mirror or the checkov venv is
skipped with the reason; in CI (`CI=true`) it fails, so a green CI always means "validated".
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from episode_pipeline.config.env import variables
from episode_pipeline.config.settings import Settings
from episode_pipeline.runtime import metrics

# The repository, and where scripts/validate-infra.sh keeps checkov (outside the work tree).
from episode_pipeline_tests.support.deploy import PRODUCTION_ENV, ROOT, TOOLS_VENV, VALIDATE_SCRIPT

INFRA = ROOT / "infra"

# Variables the pipeline code reads that infra sets (declared on the settings).
CODE_ENV = {v.name for v in variables(Settings) if v.declaration.infra}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def unavailable(reason: str) -> None:
    """Skip on a laptop, fail in CI: CI must really run every validator."""
    if in_ci():
        pytest.fail(f"{reason} (required in CI)")
    pytest.skip(reason)


def _run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, **kwargs)


# --- The configuration's text --------------------------------------------------------------------


@cache
def tf_files() -> dict[str, str]:
    """Every .tf file of infra/ (modules included) by its path below infra/."""
    return {
        str(path.relative_to(INFRA)): path.read_text()
        for path in sorted(INFRA.rglob("*.tf"))
        if ".terraform" not in path.parts
    }


def top_level_blocks(kind: str) -> dict[str, str]:
    """`kind "label" ... { ... }` blocks of every file, by file and labels (terraform fmt closes
    a top-level block with `}` in column 0)."""
    pattern = re.compile(rf'^{kind}((?: "[^"]+")+) \{{\n(.*?)^\}}', re.M | re.S)
    return {
        f"{path}:{match.group(1)}": match.group(2)
        for path, text in tf_files().items()
        for match in pattern.finditer(text)
    }


def test_every_checkov_suppression_says_why() -> None:
    skips = [
        (name, line.strip())
        for name, text in tf_files().items()
        for line in text.splitlines()
        if "checkov:skip" in line
    ]
    assert skips, "expected the documented suppressions"
    for name, line in skips:
        match = re.fullmatch(r"#checkov:skip=(CKV2?_AWS_\d+):(.+)", line)
        assert match, f"infra/{name}: malformed suppression {line!r}"
        assert len(match.group(2).split()) >= 6, f"infra/{name}: reason too short in {line!r}"


def test_variables_and_outputs_are_documented() -> None:
    for kind in ("variable", "output"):
        blocks = top_level_blocks(kind)
        assert blocks, f"no {kind} blocks found in infra/"
        for name, body in blocks.items():
            description = re.search(r'^  description\s*=\s*"(.*)"$', body, re.M)
            assert description and len(description.group(1)) >= 15, f"{kind} {name}"


def _task_environment_names() -> set[str]:
    text = tf_files()["ecs.tf"]
    block = re.search(r"environment = \[\s*for name, value in \{(.*?)\} : \{", text, re.S)
    assert block, "infra/ecs.tf: locals.environment map not found"
    return set(re.findall(r"^\s*([A-Z][A-Z0-9_]+)\s*=", block.group(1), re.M))


def test_tasks_get_every_variable_the_code_and_dagster_read() -> None:
    """The names here, their values in infra/tests/queue_and_tasks.tftest.hcl."""
    names = _task_environment_names()
    missing = (CODE_ENV | set(PRODUCTION_ENV)) - names
    assert not missing, f"infra/ecs.tf locals.environment lacks {sorted(missing)}"
    assert "DB_PASSWORD" not in names  # a secret, never plain text
    assert "AWS_ENDPOINT_URL" not in names  # local stack only


# Every AWS API call the pipeline's code makes itself, by boto3 method, and the IAM action it
# needs. Dagster and dagster-aws (compute logs, PipesECSClient) call the rest on the run's
# behalf; infra/tests/iam.tftest.hcl pins each role's statements.
AWS_CALLS = {
    "delete_objects": "s3:DeleteObject",
    "download_file": "s3:GetObject",
    "get_object": "s3:GetObject",
    "head_object": "s3:GetObject",
    "get_paginator": "s3:ListBucket",  # list_objects_v2
    "put_object": "s3:PutObject",
    "upload_file": "s3:PutObject",
    "upload_fileobj": "s3:PutObject",
    "generate_db_auth_token": "rds-db:connect",
    "generate_presigned_url": None,  # signed locally, no request
    "run_task": "ecs:RunTask",
    "stop_task": "ecs:StopTask",
    # The queue, only through episode_pipeline/uploads/upload_queue.py (sensors and `dlq`).
    "change_message_visibility_batch": "sqs:ChangeMessageVisibility",
    "delete_message": "sqs:DeleteMessage",
    "get_queue_attributes": "sqs:GetQueueAttributes",  # health's depths
    "receive_message": "sqs:ReceiveMessage",
    "send_message": "sqs:SendMessage",
}
QUEUE_MODULES = {
    "uploads/upload_queue.py",
    "uploads/dead_letters.py",
    "cli.py",
    "orchestration/upload_runs.py",
    "uploads/intake.py",
}


def test_every_aws_call_of_the_code_is_known_and_the_run_never_touches_the_queue() -> None:
    """A new boto3 call fails here until its IAM action is granted where it runs (infra/iam.tf,
    pinned by iam.tftest.hcl) and listed above; the run worker's modules never reach SQS, which
    is why the run role has no SQS permission (docs/deploy-aws.md, "The run worker's role")."""
    package = ROOT / "episode_pipeline"
    call = re.compile(r"(?:client(?:\(\))?|\b(?:ecs|logs|s3|sqs))\.([a-z_]+)\(")
    seen: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        module = str(path.relative_to(package))
        if module.startswith("local/"):  # the laptop's stack, never deployed
            continue
        for method in call.findall(path.read_text()):
            if method not in {"get", "get_client"}:
                seen.setdefault(method, set()).add(module)
    assert {"get_object", "run_task", "stop_task", "receive_message"} <= set(seen), seen
    unknown = sorted(set(seen) - set(AWS_CALLS))
    assert not unknown, f"AWS calls without an IAM action listed here: {unknown} in {seen}"
    iam = tf_files()["iam.tf"]
    for method, action in AWS_CALLS.items():
        assert action is None or f'"{action}"' in iam, f"{action} ({method}) is granted nowhere"
    for method, modules in seen.items():
        if str(AWS_CALLS[method]).startswith("sqs:"):
            assert modules <= QUEUE_MODULES, f"{method} called from {modules - QUEUE_MODULES}"
    run_side = [
        path
        for path in (package / "defs").rglob("*.py")
        if path.parent.name in {"assets", "io_managers"} or path.name in {"checks.py", "jobs.py"}
    ]
    assert run_side
    for path in run_side:
        assert "upload_queue" not in path.read_text(), f"{path} reaches the upload queue"


def test_deploy_workflow_pushes_both_images_as_latest_and_sha_on_project_changes() -> None:
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "deploy.yml").read_text())
    push = workflow[True]["push"]  # YAML 1.1 reads the key `on` as True
    assert {"episode_pipeline/**", "pyproject.toml", "Dockerfile"} <= set(push["paths"])
    script = "\n".join(
        step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"]
    )
    assert 'docker push "$image:$GITHUB_SHA"' in script
    assert 'docker push "$image:latest"' in script
    # Both of the Dockerfile's targets, the webserver's to <prefix>-webserver (infra/ecr.tf).
    assert "for target in run webserver" in script and '--target "$target"' in script
    assert 'image="$image-webserver"' in script
    # The services infra/ecs.tf runs, named <prefix>-<key> on the cluster <prefix> (the names
    # are asserted by infra/tests/queue_and_tasks.tftest.hcl).
    services = re.search(r"^  services = \{\n(.*?)^  \}", tf_files()["ecs.tf"], re.M | re.S)
    assert services, "infra/ecs.tf: locals.services not found"
    keys = set(re.findall(r'^    "?([a-z-]+)"?\s*=\s*\{', services.group(1), re.M))
    assert keys == {"code-server", "webserver", "daemon"}
    for service in keys:
        assert service in script


# --- Alarms and the dashboard (infra/alarms.tf) --------------------------------------------------

# The metric contract the alarms and the dashboard read: the embedded-metric-format metrics the
# pipeline prints (namespace EpisodePipeline, dimension Deployment = METRICS_DEPLOYMENT) and the
# queue's own AWS/SQS metrics. infra/tests/alarms.tftest.hcl checks what each alarm does with them.
METRIC_NAMESPACE = metrics.NAMESPACE
EMF_METRICS = set(metrics.UNITS)  # every metric the code declares (runtime/metrics.py)
SQS_METRICS = {
    "ApproximateAgeOfOldestMessage",
    "ApproximateNumberOfMessagesVisible",
    "ApproximateNumberOfMessagesNotVisible",
    "NumberOfMessagesSent",
}
# CamelCase strings of the alarm files that are not metric names.
NOT_METRICS = {
    METRIC_NAMESPACE,
    "QueueName",
    "GreaterThanThreshold",
    "GreaterThanOrEqualToThreshold",
    "LessThanThreshold",
}


def _alarm_files_text() -> str:
    """alarms.tf and queue.tf (the dead-letter queue's alarm), without whole-line comments."""
    text = tf_files()["alarms.tf"] + tf_files()["queue.tf"]
    return re.sub(r"(?m)^\s*#.*$", "", text)


def test_every_metric_the_alarms_and_the_dashboard_read_is_one_that_exists() -> None:
    """A misspelt metric name would make an alarm that never fires: every CamelCase string of
    the alarm files is a metric of the contract (or a known non-metric word)."""
    text = _alarm_files_text()
    namespace = re.search(r'^\s*metric_namespace\s*=\s*"([^"]+)"', text, re.M)
    assert namespace and namespace.group(1) == METRIC_NAMESPACE
    referenced = set(re.findall(r'"([A-Z][a-z]+(?:[A-Z][a-z0-9]*)+)"', text)) - NOT_METRICS
    unknown = sorted(referenced - EMF_METRICS - SQS_METRICS)
    assert not unknown, f"infra/alarms.tf names metrics nobody emits: {unknown}"
    alarmed = {
        "ApproximateAgeOfOldestMessage",
        "NumberOfMessagesSent",
        "EpisodesProcessed",
        "EpisodesFailed",
        "SensorTicks",
        "SensorTickFailures",
        "LostUploadsFound",
        "CampaignsStalled",
    }
    shown = {"EpisodeLatencySeconds", "RunWallSeconds", "LivePartitions", "EpisodesPruned"}
    assert alarmed | shown <= referenced, sorted(alarmed | shown - referenced)


def test_every_sensor_has_an_alarm_at_its_own_interval() -> None:
    """infra/alarms.tf's sensor table is the code location's sensors, by name and interval, with
    production's settings (the tasks' environment sets none of the intervals)."""
    from episode_pipeline.definitions import build_definitions

    block = re.search(r"^  sensor_intervals = \{\n(.*?)^  \}", tf_files()["alarms.tf"], re.M | re.S)
    assert block, "infra/alarms.tf: locals.sensor_intervals not found"
    in_terraform = {
        name: int(seconds)
        for name, seconds in re.findall(r"^\s*(\w+)\s*=\s*(\d+)", block.group(1), re.M)
    }
    settings = Settings.from_env({**PRODUCTION_ENV, "DB_HOST": "db", "DATA_BUCKET": "bucket"})
    repository = build_definitions(settings).get_repository_def()
    in_code = {sensor.name: sensor.minimum_interval_seconds for sensor in repository.sensor_defs}
    assert in_terraform == in_code


def test_the_metrics_carry_the_dimension_the_alarms_select() -> None:
    """The tasks print their metrics with Deployment = METRICS_DEPLOYMENT, which Terraform sets
    to the name prefix the alarms select (its value: queue_and_tasks.tftest.hcl)."""
    assert "METRICS_DEPLOYMENT" in _task_environment_names()
    assert re.search(r"^\s*METRICS_DEPLOYMENT\s*=\s*local\.prefix$", tf_files()["ecs.tf"], re.M)
    assert re.search(
        r"^\s*deployment\s*=\s*\{ Deployment = local\.prefix \}", tf_files()["alarms.tf"], re.M
    )


def _section(path: Path, heading: str) -> str:
    text = path.read_text()
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_every_alarm_and_its_threshold_is_documented() -> None:
    """Each alarm has its runbook line in docs/operations.md (what it means, what to check, the
    command), and each threshold variable is in both documents."""
    names = {
        name.replace("${local.prefix}", "<prefix>").replace("${each.key}", "<sensor>")
        for text in tf_files().values()
        for name in re.findall(r'^\s*alarm_name\s*=\s*"([^"]+)"', text, re.M)
    }
    assert len(names) == 8, names
    runbook = _section(ROOT / "docs" / "operations.md", "## Alarms")
    reference = _section(ROOT / "docs" / "deploy-aws.md", "## Alarms and the dashboard")
    for name in names:
        assert f"**`{name}`**" in runbook, f"docs/operations.md, Alarms: no line for {name}"
    thresholds = re.findall(r'^variable "(alarm_\w+)"', tf_files()["variables.tf"], re.M)
    assert len(thresholds) == 8, thresholds
    for variable in thresholds:
        assert f"`{variable}`" in runbook and f"`{variable}`" in reference, variable


# --- Terraform -----------------------------------------------------------------------------------


@cache
def provider_mirror() -> Path | None:
    """The directory holding registry.terraform.io/ (the machine image's), or TF_PROVIDER_MIRROR."""
    if os.environ.get("TF_PROVIDER_MIRROR"):
        return Path(os.environ["TF_PROVIDER_MIRROR"])
    for pattern in ("*/registry.terraform.io", "*/*/registry.terraform.io"):
        for hit in sorted(Path("/").glob(pattern)):
            if hit.is_dir():
                return hit.parent
    return None


def pinned_provider_version() -> str:
    match = re.search(
        r'source\s*=\s*"hashicorp/aws"\s*\n\s*(?:#.*\n\s*)*version\s*=\s*"([^"]+)"',
        tf_files()["versions.tf"],
    )
    assert match, "infra/versions.tf: hashicorp/aws version pin not found"
    return match.group(1)


@pytest.fixture(scope="module")
def terraform_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if shutil.which("terraform") is None:
        unavailable("terraform is not on PATH (the machine image provides it)")
    mirror = provider_mirror()
    if mirror is None:
        unavailable("no Terraform provider mirror (registry.terraform.io directory) found")
    aws = mirror / "registry.terraform.io" / "hashicorp" / "aws"
    versions = sorted(p.name for p in aws.iterdir()) if aws.is_dir() else []
    pinned = pinned_provider_version()
    if pinned not in versions:
        pytest.fail(f"infra/versions.tf pins aws {pinned} but the mirror {aws} has {versions}")
    config = tmp_path_factory.mktemp("terraform") / "cli.tfrc"
    config.write_text(
        "provider_installation {\n"
        f'  filesystem_mirror {{\n    path    = "{mirror}"\n'
        '    include = ["registry.terraform.io/*/*"]\n  }\n'
        '  direct {\n    exclude = ["registry.terraform.io/*/*"]\n  }\n}\n'
    )
    return {
        **os.environ,
        "TF_CLI_CONFIG_FILE": str(config),
        "TF_IN_AUTOMATION": "1",
        "CHECKPOINT_DISABLE": "1",
    }


@pytest.fixture(scope="module")
def terraform_dir(terraform_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """infra/ copied and initialised (offline mirror), so init's .terraform/ and lock file never
    land in the repository."""
    work = tmp_path_factory.mktemp("infra") / "infra"
    shutil.copytree(INFRA, work, ignore=shutil.ignore_patterns(".terraform", ".terraform.lock.hcl"))
    init = _run(
        ["terraform", "init", "-backend=false", "-input=false", "-no-color"],
        cwd=work,
        env=terraform_env,
    )
    assert init.returncode == 0, f"terraform init (offline mirror) failed:\n{init.stderr}"
    return work


def test_terraform_fmt_check(terraform_env: dict[str, str]) -> None:
    result = _run(
        ["terraform", "fmt", "-check", "-recursive", "-diff", str(INFRA)], env=terraform_env
    )
    assert result.returncode == 0, f"terraform fmt would change:\n{result.stdout}{result.stderr}"


def test_terraform_validate_offline(terraform_env: dict[str, str], terraform_dir: Path) -> None:
    validate = _run(
        ["terraform", "validate", "-json", "-no-color"], cwd=terraform_dir, env=terraform_env
    )
    report = json.loads(validate.stdout)
    problems = [
        f"{d['severity']}: {d['summary']} ({d.get('range', {}).get('filename')}:"
        f"{d.get('range', {}).get('start', {}).get('line')}) {d.get('detail', '')}"
        for d in report["diagnostics"]
    ]
    assert report["valid"], "\n".join(problems)
    assert report["warning_count"] == 0, "\n".join(problems)


@pytest.mark.slow(seconds=110)
def test_terraform_test_offline(terraform_env: dict[str, str], terraform_dir: Path) -> None:
    """infra/tests/*.tftest.hcl: plans and applies against the mocked AWS provider."""
    result = _run(["terraform", "test", "-no-color"], cwd=terraform_dir, env=terraform_env)
    output = f"{result.stdout}\n{result.stderr}"
    assert result.returncode == 0, f"terraform test failed:\n{output}"
    summary = re.search(r"Success! (\d+) passed, 0 failed\.", result.stdout)
    assert summary, f"terraform test printed no success summary:\n{output}"
    files = sorted(p.name for p in (INFRA / "tests").glob("*.tftest.hcl"))
    assert files, "infra/tests/ has no .tftest.hcl files"
    for name in files:
        assert f"tests/{name}... pass" in result.stdout, f"{name} did not run:\n{output}"
    runs = sum(
        len(re.findall(r'^run "', (INFRA / "tests" / name).read_text(), re.M)) for name in files
    )
    assert int(summary.group(1)) == runs, f"expected {runs} runs to pass:\n{output}"


# --- checkov -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tools_venv() -> Path:
    """The checkov/hadolint venv (scripts/validate-infra.sh tools)."""
    result = _run(["bash", str(VALIDATE_SCRIPT), "tools"], cwd=ROOT)
    if result.returncode != 0 or not (TOOLS_VENV / "bin" / "checkov").exists():
        unavailable(f"could not install checkov into {TOOLS_VENV}: {result.stderr[-2000:]}")
    return TOOLS_VENV


@pytest.mark.slow(seconds=30)
def test_checkov_finds_nothing_unjustified(tools_venv: Path) -> None:
    result = _run(
        [
            str(tools_venv / "bin" / "checkov"),
            "-d",
            str(INFRA),
            "--framework",
            "terraform",
            "--compact",
            "--quiet",
            "--skip-download",
            "--skip-path",
            "infra/tests",  # terraform test files and mocks: nothing is deployed from them
            "-o",
            "json",
        ],
        cwd=ROOT,
    )
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"checkov printed no JSON (rc {result.returncode}): {result.stderr[-2000:]}")
    report = report[0] if isinstance(report, list) else report
    summary = report["summary"]
    # checkov exits 0 on files it cannot parse: make sure it saw the resources.
    resources = len(top_level_blocks("resource"))
    assert summary["parsing_errors"] == 0, summary
    assert summary["resource_count"] >= resources > 0, (summary, resources)
    failed = [
        f"{c['check_id']} {c['resource']} {c['file_path']}:{c['file_line_range']} {c['check_name']}"
        for c in report.get("results", {}).get("failed_checks", [])
    ]
    assert summary["failed"] == 0 and not failed, "\n".join(failed)
    assert result.returncode == 0, result.stderr[-2000:]
