"""infra/ Terraform: the seed's numbers, least-privilege IAM, and the offline validators.

No AWS account is reachable here, so nothing is planned or applied. What can be checked is:
the parsed configuration (python-hcl2) against the seed's contract, `terraform fmt -check` and
`terraform validate` with the AWS provider from the machine image's filesystem mirror (no
registry), and checkov with every suppression justified inline.

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

import hcl2
import pytest

from episode_pipeline_tests.test_deploy_dagster_config import PRODUCTION_ENV

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "infra"
# Where scripts/validate-infra.sh keeps checkov and hadolint (outside the work tree).
TOOLS_VENV = Path(
    os.environ.get("EPISODE_PIPELINE_TOOLS_VENV")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / "episode-pipeline"
    / "venv-checkov"
)
VALIDATE_SCRIPT = ROOT / "scripts" / "validate-infra.sh"

# The seed ("When it fails", "Deploy"): visibility 15 min, retention 4 days / 14 days,
# 3 receives before the dead-letter queue, 3 images kept, logs 7 days.
SEED = {
    "visibility_timeout_seconds": 15 * 60,
    "message_retention_seconds": 4 * 24 * 3600,
    "dlq_message_retention_seconds": 14 * 24 * 3600,
    "max_receive_count": 3,
    "images_kept": 3,
    "log_retention_days": 7,
}

# Variables the pipeline code reads (settings.py and the list); local-only ones excluded.
CODE_ENV = {
    "DB_HOST",
    "DB_PORT",
    "DB_NAME",
    "DB_USER",
    "DB_SSL",
    "DB_IAM_AUTH",
    "DATA_BUCKET",
    "SQS_QUEUE_URL",
    "SQS_DLQ_URL",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def unavailable(reason: str) -> None:
    """Skip on a laptop, fail in CI: CI must really run every validator."""
    if in_ci():
        pytest.fail(f"{reason} (required in CI)")
    pytest.skip(reason)


# --- Parsed configuration ------------------------------------------------------------------------


def _one(value: Any) -> Any:
    """python-hcl2 wraps each attribute value (and a lone block) in a one-element list."""
    if isinstance(value, list) and len(value) == 1:
        return value[0]
    return value


@cache
def parsed() -> dict[str, Any]:
    """All of infra/*.tf: resources and data sources by type and name, locals, variables..."""
    result: dict[str, Any] = {
        "resource": {},
        "data": {},
        "locals": {},
        "variable": {},
        "output": {},
        "text": {},
        "source": {},
    }
    for path in sorted(INFRA.glob("*.tf")):
        text = path.read_text()
        result["text"][path.name] = text
        try:
            tree = hcl2.loads(text)
        except Exception as error:  # pragma: no cover - the message is the point
            pytest.fail(f"{path}: python-hcl2 cannot parse it: {error}")
        for kind in ("resource", "data"):
            for block in tree.get(kind, []):
                for rtype, by_name in block.items():
                    for name, body in by_name.items():
                        result[kind].setdefault(rtype, {})[name] = body
                        lines = text.splitlines()[body["__start_line__"] - 1 : body["__end_line__"]]
                        result["source"][f"{kind}.{rtype}.{name}"] = "\n".join(lines)
        for block in tree.get("locals", []):
            result["locals"].update({k: _one(v) for k, v in block.items()})
        for kind in ("variable", "output"):
            for block in tree.get(kind, []):
                result[kind].update(block)
    return result


def resource(rtype: str, name: str) -> dict[str, Any]:
    try:
        return parsed()["resource"][rtype][name]
    except KeyError:
        pytest.fail(f"infra/: resource {rtype}.{name} is missing")


def attr(body: dict[str, Any], name: str) -> Any:
    """An attribute's value with `${local.x}` references resolved."""
    assert name in body, f"attribute {name!r} missing (have {sorted(body)})"
    value = _one(body[name])
    match = re.fullmatch(r"\$\{local\.(\w+)\}", value) if isinstance(value, str) else None
    if match:
        return parsed()["locals"][match.group(1)]
    return value


def source(rtype: str, name: str) -> str:
    """The HCL text of a resource block, for expressions python-hcl2 renders poorly."""
    resource(rtype, name)
    return parsed()["source"][f"resource.{rtype}.{name}"]


def local_value(name: str) -> Any:
    return parsed()["locals"][name]


def test_queue_matches_the_seed() -> None:
    queue = resource("aws_sqs_queue", "uploads")
    assert attr(queue, "visibility_timeout_seconds") == SEED["visibility_timeout_seconds"]
    assert attr(queue, "message_retention_seconds") == SEED["message_retention_seconds"]
    assert attr(queue, "receive_wait_time_seconds") == 20
    assert attr(queue, "sqs_managed_sse_enabled") is True

    text = source("aws_sqs_queue", "uploads")
    assert re.search(r"deadLetterTargetArn\s*=\s*aws_sqs_queue\.dlq\.arn", text), text
    count = re.search(r"maxReceiveCount\s*=\s*(?:local\.(\w+)|(\d+))", text)
    assert count, f"infra/queue.tf: no maxReceiveCount in the redrive policy:\n{text}"
    value = local_value(count.group(1)) if count.group(1) else int(count.group(2))
    assert value == SEED["max_receive_count"]


def test_dead_letter_queue_matches_the_seed() -> None:
    dlq = resource("aws_sqs_queue", "dlq")
    assert attr(dlq, "message_retention_seconds") == SEED["dlq_message_retention_seconds"]
    assert attr(dlq, "sqs_managed_sse_enabled") is True
    allow = source("aws_sqs_queue_redrive_allow_policy", "dlq")
    assert '"byQueue"' in allow and "[aws_sqs_queue.uploads.arn]" in allow


def test_bucket_notification_sends_zst_archives_under_orgs_to_the_queue() -> None:
    notification = resource("aws_s3_bucket_notification", "data")
    assert attr(notification, "bucket") == "${aws_s3_bucket.data.id}"
    queue = _one(notification["queue"])
    assert attr(queue, "queue_arn") == "${aws_sqs_queue.uploads.arn}"
    assert attr(queue, "events") == ["s3:ObjectCreated:*"]
    assert attr(queue, "filter_prefix") == "orgs/"
    assert attr(queue, "filter_suffix") == ".zst"
    # S3 may only send from this bucket.
    policy = parsed()["data"]["aws_iam_policy_document"]["uploads_queue"]
    statement = _one(policy["statement"])
    assert attr(statement, "actions") == ["sqs:SendMessage"]
    conditions = {attr(c, "variable"): attr(c, "values") for c in statement["condition"]}
    assert conditions["aws:SourceArn"] == ["${aws_s3_bucket.data.arn}"]


def test_alarm_emails_when_the_dead_letter_queue_is_not_empty() -> None:
    alarm = resource("aws_cloudwatch_metric_alarm", "dlq_not_empty")
    assert attr(alarm, "namespace") == "AWS/SQS"
    assert attr(alarm, "metric_name") == "ApproximateNumberOfMessagesVisible"
    assert attr(alarm, "dimensions") == {"QueueName": "${aws_sqs_queue.dlq.name}"}
    assert attr(alarm, "comparison_operator") == "GreaterThanThreshold"
    assert attr(alarm, "threshold") == 0
    assert attr(alarm, "alarm_actions") == ["${aws_sns_topic.alerts.arn}"]
    subscription = resource("aws_sns_topic_subscription", "alert_email")
    assert attr(subscription, "protocol") == "email"
    assert attr(subscription, "topic_arn") == "${aws_sns_topic.alerts.arn}"
    assert "alert_emails" in parsed()["variable"]


def test_data_bucket_is_versioned_encrypted_and_private() -> None:
    versioning = resource("aws_s3_bucket_versioning", "data")
    assert attr(_one(versioning["versioning_configuration"]), "status") == "Enabled"
    sse = resource("aws_s3_bucket_server_side_encryption_configuration", "data")
    default = _one(_one(sse["rule"])["apply_server_side_encryption_by_default"])
    assert attr(default, "sse_algorithm") in {"AES256", "aws:kms"}
    block = resource("aws_s3_bucket_public_access_block", "data")
    for flag in (
        "block_public_acls",
        "block_public_policy",
        "ignore_public_acls",
        "restrict_public_buckets",
    ):
        assert attr(block, flag) is True, flag


def test_ecr_keeps_the_three_most_recent_images() -> None:
    policy = source("aws_ecr_lifecycle_policy", "app")
    assert re.search(r'countType\s*=\s*"imageCountMoreThan"', policy), policy
    kept = re.findall(r"countNumber\s*=\s*(\d+)", policy)
    assert [int(n) for n in kept] == [SEED["images_kept"]]
    assert re.search(r'tagStatus\s*=\s*"any"', policy)
    assert re.search(r'type\s*=\s*"expire"', policy)


def test_log_groups_keep_seven_days() -> None:
    assert _one(parsed()["variable"]["log_retention_days"]["default"]) == SEED["log_retention_days"]
    groups = resource("aws_cloudwatch_log_group", "ecs")
    assert attr(groups, "retention_in_days") == "${var.log_retention_days}"
    assert set(local_value("log_groups")) == {
        "webserver",
        "daemon",
        "code-server",
        "run",
        "transcode",
    }


@pytest.mark.parametrize("name", ["code_server", "webserver", "daemon", "run", "transcode"])
def test_every_task_logs_with_awslogs_and_a_stream_prefix(name: str) -> None:
    """PipesECSClient reads the transcode task's messages from its awslogs stream."""
    text = source("aws_ecs_task_definition", name)
    assert re.search(r'logDriver\s*=\s*"awslogs"', text), text
    assert re.search(r'awslogs-stream-prefix\s*=\s*"[a-z-]+"', text), text
    assert "merge(local.container_base," in text  # image, env, secrets, non-root user
    assert attr(resource("aws_ecs_task_definition", name), "requires_compatibilities") == [
        "FARGATE"
    ]


def test_services_run_webserver_daemon_and_code_server() -> None:
    services = parsed()["resource"]["aws_ecs_service"]
    assert set(services) == {"webserver", "daemon", "code_server"}
    daemon = services["daemon"]
    # Never two daemons at once.
    assert attr(daemon, "desired_count") == 1
    assert attr(daemon, "deployment_maximum_percent") == 100
    assert "service_registries" in services["code_server"]


def test_transcode_task_runs_the_transcode_module() -> None:
    text = source("aws_ecs_task_definition", "transcode")
    assert 'command = ["python", "-m", "episode_pipeline.transcode"]' in text


def _task_environment_names() -> set[str]:
    text = parsed()["text"]["ecs.tf"]
    block = re.search(r"environment = \[\s*for name, value in \{(.*?)\} : \{", text, re.S)
    assert block, "infra/ecs.tf: locals.environment map not found"
    return set(re.findall(r"^\s*([A-Z][A-Z0-9_]+)\s*=", block.group(1), re.M))


def test_tasks_get_every_variable_the_code_and_dagster_read() -> None:
    names = _task_environment_names()
    missing = (CODE_ENV | set(PRODUCTION_ENV)) - names
    assert not missing, f"infra/ecs.tf locals.environment lacks {sorted(missing)}"
    assert "DB_PASSWORD" not in names  # a secret, never plain text
    assert "'DB_PASSWORD'" in str(local_value("secrets"))
    assert "AWS_ENDPOINT_URL" not in names  # local stack only


# --- IAM -----------------------------------------------------------------------------------------


def _statements(document: str) -> list[dict[str, Any]]:
    body = parsed()["data"]["aws_iam_policy_document"][document]
    return [s for s in body.get("statement", []) if isinstance(s, dict)]


def _by_sid(document: str) -> dict[str, dict[str, Any]]:
    return {attr(s, "sid"): s for s in _statements(document) if "sid" in s}


def test_runs_read_orgs_and_write_only_processed() -> None:
    assert local_value("raw_objects_arn") == "${aws_s3_bucket.data.arn}/orgs/*"
    assert (
        local_value("processed_objects_arn")
        == "${aws_s3_bucket.data.arn}/orgs/*/episodes/*/processed/*"
    )
    for document in ("episode_objects", "run", "transcode"):
        if document not in parsed()["data"]["aws_iam_policy_document"]:
            continue
        for statement in _statements(document):
            actions = attr(statement, "actions")
            writes = [a for a in actions if re.match(r"s3:(Put|Delete|Abort)", a)]
            if writes and "${local.compute_logs_arn}" not in attr(statement, "resources"):
                assert attr(statement, "resources") == ["${local.processed_objects_arn}"], statement
    statements = _by_sid("episode_objects")
    assert attr(statements["ReadEpisodeObjects"], "resources") == ["${local.raw_objects_arn}"]
    run = parsed()["data"]["aws_iam_policy_document"]["run"]
    assert attr(run, "source_policy_documents") == [
        "${data.aws_iam_policy_document.episode_objects.json}"
    ]


def test_ecs_run_task_only_for_the_launched_families() -> None:
    daemon = _by_sid("daemon")
    assert attr(daemon["LaunchRunTasks"], "actions") == ["ecs:RunTask"]
    assert attr(daemon["LaunchRunTasks"], "resources") == ["${local.run_task_definition_arns}"]
    run = _by_sid("run")
    assert attr(run["LaunchTranscodeTasks"], "resources") == [
        "${local.transcode_task_definition_arns}"
    ]
    for document, sid in (("daemon", "PassRunRoles"), ("run", "PassTranscodeRoles")):
        statement = _by_sid(document)[sid]
        condition = _one(statement["condition"])
        assert attr(condition, "variable") == "iam:PassedToService"
        assert attr(condition, "values") == ["ecs-tasks.amazonaws.com"]
    assert local_value("run_task_definition_arns").endswith(
        ":task-definition/${local.run_family}:*"
    )
    # Nobody else may start tasks.
    for document in ("webserver", "code_server", "episode_objects"):
        for statement in _statements(document):
            assert "ecs:RunTask" not in attr(statement, "actions"), document


def test_the_sensor_process_consumes_the_queue() -> None:
    consume = _by_sid("code_server")["ConsumeUploadQueue"]
    assert {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"} <= set(
        attr(consume, "actions")
    )
    assert attr(consume, "resources") == ["${aws_sqs_queue.uploads.arn}"]


def test_database_access_uses_rds_iam_connect() -> None:
    assert "dbuser:${var.db_cluster_resource_id}/${var.db_user}" in local_value("rds_db_user_arn")
    for document in ("webserver", "daemon", "code_server", "run"):
        actions = [a for s in _statements(document) for a in attr(s, "actions")]
        assert "rds-db:connect" in actions, document


# Actions AWS offers no resource-level permissions for; "*" is the only possible resource.
UNSCOPABLE = {
    "ecr:GetAuthorizationToken",
    "ecs:DescribeTaskDefinition",
    "ec2:DescribeNetworkInterfaces",
}


def test_no_allow_statement_uses_wildcards_beyond_unscopable_actions() -> None:
    wildcard_statements = 0
    for document in parsed()["data"]["aws_iam_policy_document"]:
        if document == "kms":  # key policies must say "*" (= this key)
            continue
        for statement in _statements(document):
            if "effect" in statement and attr(statement, "effect") == "Deny":
                continue
            actions = attr(statement, "actions")
            assert not any(a.endswith(":*") or a == "*" for a in actions), (document, actions)
            if "resources" in statement and attr(statement, "resources") == ["*"]:
                wildcard_statements += 1
                assert set(actions) <= UNSCOPABLE, (document, actions)
    assert wildcard_statements > 0, "the walker saw no Resource '*' at all: parsing changed?"


def test_secrets_come_from_secrets_manager() -> None:
    assert "secretsmanager:GetSecretValue" in parsed()["text"]["iam.tf"]
    assert "valueFrom" in parsed()["text"]["ecs.tf"]


def test_variables_and_outputs_are_documented() -> None:
    for kind in ("variable", "output"):
        for name, body in parsed()[kind].items():
            description = _one(body.get("description", ""))
            assert isinstance(description, str) and len(description) >= 15, f"{kind} {name}"


# --- Validators ----------------------------------------------------------------------------------


@cache
def provider_mirror() -> Path | None:
    """The directory holding registry.terraform.io/ (platform-notes), or TF_PROVIDER_MIRROR."""
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
        parsed()["text"]["versions.tf"],
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


def _run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, **kwargs)


def test_terraform_fmt_check(terraform_env: dict[str, str]) -> None:
    result = _run(
        ["terraform", "fmt", "-check", "-recursive", "-diff", str(INFRA)], env=terraform_env
    )
    assert result.returncode == 0, f"terraform fmt would change:\n{result.stdout}{result.stderr}"


def test_terraform_validate_offline(terraform_env: dict[str, str], tmp_path: Path) -> None:
    # A copy, so init's .terraform/ and lock file never land in the repository.
    for tf in INFRA.glob("*.tf"):
        shutil.copy(tf, tmp_path / tf.name)
    init = _run(
        ["terraform", "init", "-backend=false", "-input=false", "-no-color"],
        cwd=tmp_path,
        env=terraform_env,
    )
    assert init.returncode == 0, f"terraform init (offline mirror) failed:\n{init.stderr}"
    validate = _run(
        ["terraform", "validate", "-json", "-no-color"], cwd=tmp_path, env=terraform_env
    )
    report = json.loads(validate.stdout)
    problems = [
        f"{d['severity']}: {d['summary']} ({d.get('range', {}).get('filename')}:"
        f"{d.get('range', {}).get('start', {}).get('line')}) {d.get('detail', '')}"
        for d in report["diagnostics"]
    ]
    assert report["valid"], "\n".join(problems)
    assert report["warning_count"] == 0, "\n".join(problems)


@pytest.fixture(scope="module")
def tools_venv() -> Path:
    """The checkov/hadolint venv (scripts/validate-infra.sh tools)."""
    result = _run(["bash", str(VALIDATE_SCRIPT), "tools"], cwd=ROOT)
    if result.returncode != 0 or not (TOOLS_VENV / "bin" / "checkov").exists():
        unavailable(f"could not install checkov into {TOOLS_VENV}: {result.stderr[-2000:]}")
    return TOOLS_VENV


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
    resources = sum(len(by_name) for by_name in parsed()["resource"].values())
    assert summary["parsing_errors"] == 0, summary
    assert summary["resource_count"] >= resources > 0, (summary, resources)
    failed = [
        f"{c['check_id']} {c['resource']} {c['file_path']}:{c['file_line_range']} {c['check_name']}"
        for c in report.get("results", {}).get("failed_checks", [])
    ]
    assert summary["failed"] == 0 and not failed, "\n".join(failed)
    assert result.returncode == 0, result.stderr[-2000:]


def test_every_checkov_suppression_says_why() -> None:
    skips = [
        (name, line.strip())
        for name, text in parsed()["text"].items()
        for line in text.splitlines()
        if "checkov:skip" in line
    ]
    assert skips, "expected the documented suppressions"
    for name, line in skips:
        match = re.fullmatch(r"#checkov:skip=(CKV2?_AWS_\d+):(.+)", line)
        assert match, f"infra/{name}: malformed suppression {line!r}"
        assert len(match.group(2).split()) >= 6, f"infra/{name}: reason too short in {line!r}"


def test_deploy_workflow_pushes_latest_and_sha_on_project_changes() -> None:
    import yaml

    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "deploy.yml").read_text())
    push = workflow[True]["push"]  # YAML 1.1 reads the key `on` as True
    assert {"episode_pipeline/**", "pyproject.toml", "Dockerfile"} <= set(push["paths"])
    script = "\n".join(
        step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"]
    )
    assert 'docker push "$image:$GITHUB_SHA"' in script
    assert 'docker push "$image:latest"' in script
    # Service names as infra/ecs.tf builds them: <cluster>-<service>.
    for service in ("code-server", "webserver", "daemon"):
        assert service in script
        assert f'"${{local.prefix}}-{service}"' in parsed()["text"]["ecs.tf"]
    assert attr(resource("aws_ecs_cluster", "main"), "name") == "${var.name_prefix}"
