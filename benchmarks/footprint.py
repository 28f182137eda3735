"""Stage `footprint`: what the run worker's image installs, and how long it takes to load it.

Virtualenvs are made in the scratch directory with uv, offline from its cache, from a copy of
the sources (what the Dockerfile copies):

- ours: the run image's set (the Dockerfile's `run` target: what every episode's cold start
  pulls), `pip install .` (no extras), then `scripts/strip-libraries.sh` over it, as the
  Dockerfile runs them;
- baseline: today's full set before the extras existed: the package with `[local]` (the UI,
  pgserver, moto[server], pandas, pyarrow, numpy) and dagster-dg-cli, which were all main
  dependencies, unstripped.
- the webserver image's set (`[webserver]` added to ours, stripped) is in the details.

Figures:

- `installed_mib`: the bytes under each venv's site-packages (each file once; no bytecode on
  either side, uv compiles none). Target ≤ 50 % of today's. The details list ours' largest
  entries.
- `image_software_mib`: the same, with Debian's `ffmpeg` package added to today's side (the old
  image installed it besides imageio-ffmpeg's bundled build): the Installed-Size apt reports for
  the packages `apt-get install --no-install-recommends ffmpeg` would add on this machine, a
  lower bound of what it adds to python:3.11-slim (which lacks more of them); the details hold
  an upper bound too (its whole dependency closure less priority required/important). Only where
  apt-get is there.
- `run_image_mib`: the run image itself, built by `scripts/build-images.sh` (`make image`, podman)
  and measured by `podman image inspect`, against the one image of before on the same base: that
  base's size plus today's set and Debian's ffmpeg (lower bound) from the figures above. The
  details hold the webserver image's size, the base's (named, and whether it is the stand-in made
  from Debian's packages where no registry is reachable) and the venv's layer. Only where podman
  is there, and only with `--set footprint_images=1` (a build takes minutes on 2 shared cores:
  `make bench` leaves it out).
- `run_worker_import_s`: a fresh Python importing `episode_pipeline.definitions` and building
  the definitions from production-style settings (what `dagster api execute_run` loads before a
  run's first step), bytecode compiled by a first import, median of `repeats`, on each venv,
  the two taking turns.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from benchmarks.common import REPO_ROOT, BenchContext, Result, median, seconds_result

NAME = "footprint"
TARGET_FACTOR = 2.0  # production ≤ 50 % of today's
MiB = 1 << 20
PROCESS_TIMEOUT_SECONDS = 600
BUILD_DEFINITIONS = (
    "from episode_pipeline.definitions import build_definitions\n"
    "from episode_pipeline.config.settings import Settings\n"
    "build_definitions(Settings.from_env({'DB_HOST': 'db', 'DATA_BUCKET': 'data',"
    " 'SQS_QUEUE_URL': 'https://sqs.example/q'}))\n"
)


def _uv() -> str:
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.exists() else shutil.which("uv")
    if not found:
        raise RuntimeError(f"{NAME}: uv is needed (scripts/bootstrap.sh installs it into .venv)")
    return found


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=kwargs.pop("timeout", PROCESS_TIMEOUT_SECONDS),
        check=False,
        env={**env, "UV_PYTHON_DOWNLOADS": "never", **kwargs.pop("env", {})},
        **kwargs,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}:\n{(result.stdout + result.stderr)[-3000:]}")
    return result


def copy_sources(target: Path) -> Path:
    """What the Dockerfile copies, so a build never writes into the work tree."""
    target.mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, target / name)
    shutil.copytree(
        REPO_ROOT / "episode_pipeline",
        target / "episode_pipeline",
        ignore=shutil.ignore_patterns("__pycache__"),
        dirs_exist_ok=True,
    )
    return target


def install(venv: Path, source: Path, *extra: str) -> Path:
    """A fresh venv with the package at `source` (plus `extra` requirements), offline from uv's
    cache; returns its python."""
    _run([_uv(), "venv", "-q", "--python", sys.executable, str(venv)])
    python = venv / "bin" / "python"
    _run([_uv(), "pip", "install", "-q", "--offline", "--python", str(python), *extra])
    return python


def install_run_worker(venv: Path, source: Path, *extras: str) -> Path:
    """The Dockerfile's run target (with `extras`, its webserver target): the package without
    extras, its libraries stripped by the script the Dockerfile runs; returns its python."""
    target = f"{source}[{','.join(extras)}]" if extras else str(source)
    python = install(venv, source, target)
    (site,) = (venv / "lib").glob("python*/site-packages")
    _run(["sh", str(REPO_ROOT / "scripts" / "strip-libraries.sh"), str(site)])
    return python


def today_requirements(source: Path) -> list[str]:
    """Today's main dependencies before the extras: the package with `[local]`, and dg."""
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    dg = [req for req in extras["dev"] if req.startswith("dagster-dg-cli")]
    return [f"{source}[local]", *dg]


def entry_bytes(venv: Path) -> dict[str, int]:
    """Bytes of each top-level entry of the venv's site-packages, each inode counted once."""
    (site,) = (venv / "lib").glob("python*/site-packages")
    seen: set[tuple[int, int]] = set()
    sizes: dict[str, int] = {}
    for root, _dirs, files in os.walk(site):
        entry = Path(root).relative_to(site).parts[:1]
        for name in files:
            stat = os.lstat(os.path.join(root, name))
            if (stat.st_dev, stat.st_ino) not in seen:
                seen.add((stat.st_dev, stat.st_ino))
                key = entry[0] if entry else name
                sizes[key] = sizes.get(key, 0) + stat.st_size
    return sizes


def installed_bytes(venv: Path) -> int:
    """Bytes of the files under the venv's site-packages, each inode once."""
    return sum(entry_bytes(venv).values())


def largest_entries(venv: Path, count: int = 10) -> dict[str, float]:
    """The `count` largest top-level entries of site-packages, MiB."""
    sizes = sorted(entry_bytes(venv).items(), key=lambda item: -item[1])[:count]
    return {name: round(size / MiB, 1) for name, size in sizes}


def _apt(*args: str) -> str:
    return subprocess.run(
        list(args), capture_output=True, text=True, timeout=PROCESS_TIMEOUT_SECONDS, check=False
    ).stdout


def _installed_kib(packages: list[str], skip_priorities: tuple[str, ...] = ()) -> int:
    """The Installed-Size apt reports for `packages` (those of `skip_priorities` left out)."""
    total = 0
    for stanza in _apt("apt-cache", "show", "--no-all-versions", *packages).split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " "
        )
        if fields.get("Priority") not in skip_priorities and "Installed-Size" in fields:
            total += int(fields["Installed-Size"])
    return total


def apt_ffmpeg_bytes() -> tuple[int, int] | None:
    """What Debian's `ffmpeg` adds (no recommends), from apt's metadata, as (lower, upper) bytes:
    the packages `apt-get install` would add on this machine, and its whole dependency closure
    less the packages of priority required/important (roughly what a slim image holds)."""
    if shutil.which("apt-get") is None or shutil.which("apt-cache") is None:
        return None
    simulated = _apt("apt-get", "install", "-s", "--no-install-recommends", "ffmpeg")
    added = [line.split()[1] for line in simulated.splitlines() if line.startswith("Inst ")]
    closure = sorted(
        {
            line.strip()
            for line in _apt(
                "apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
                "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", "ffmpeg",
            ).splitlines()
            if line and not line.startswith(" ") and "<" not in line
        }
    )  # fmt: skip
    if not added or not closure:
        return None
    upper = _installed_kib(closure, skip_priorities=("required", "important"))
    return _installed_kib(added) * 1024, upper * 1024


BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-images.sh"
IMAGE_BUILD_TIMEOUT_SECONDS = 2400  # cold: every wheel downloaded; cached: seconds
IMAGE_LINE = re.compile(r"^build-images: image (\S+): \d+ MiB, base (\S+)$", re.M)


def _podman(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    conf = os.environ.get("CONTAINERS_CONF") or str(BUILD_SCRIPT.parent / "containers.conf")
    return _run(["podman", *args], env={"CONTAINERS_CONF": conf}, **kwargs)


def image_bytes(image: str) -> int:
    """An image's size as podman reports it: its uncompressed layers, what a task's disk holds."""
    return int(_podman("image", "inspect", "--format", "{{.Size}}", image).stdout)


def built_images() -> dict[str, tuple[str, str]] | None:
    """`make image`'s two images, built now (cached layers make it quick), as {target: (image,
    base)}; None without podman."""
    if shutil.which("podman") is None:
        return None
    built = _run(
        ["bash", str(BUILD_SCRIPT)], cwd=REPO_ROOT, timeout=IMAGE_BUILD_TIMEOUT_SECONDS
    ).stdout
    return {image.rsplit(":", 1)[1]: (image, base) for image, base in IMAGE_LINE.findall(built)}


def image_result(images: dict[str, tuple[str, str]], old_software: int) -> Result:
    """The run image's size against the one image of before on the same base: that base's size
    plus the software it installed (`old_software`, bytes)."""
    run_image, base = images["run"]
    base_bytes = image_bytes(base)
    layers = json.loads(_podman("history", "--format", "json", run_image).stdout)
    copied = [layer["size"] for layer in layers if "COPY dir:" in layer.get("CreatedBy", "")]
    return Result(
        stage=NAME,
        metric="run_image_mib",
        ours=round(image_bytes(run_image) / MiB, 1),
        baseline=round((base_bytes + old_software) / MiB, 1),
        unit="MiB",
        better="lower",
        baseline_name="the one image of before on the same base (the base + today's set + "
        "Debian's ffmpeg, lower bound)",
        details={
            "run_image": run_image,
            "webserver_image_mib": round(image_bytes(images["webserver"][0]) / MiB, 1),
            "base": base,
            "base_is_stand_in": "stand-in" in base,
            "base_mib": round(base_bytes / MiB, 1),
            "venv_layer_mib": round(max(copied, default=0) / MiB, 1),
        },
    )


def import_seconds(pythons: list[Path], workdir: Path, repeats: int) -> list[list[float]]:
    """Wall seconds of a fresh process building the definitions, per interpreter, after one run
    each that compiled the bytecode; the interpreters take turns, so both see the same load."""
    env = {"PYTHONDONTWRITEBYTECODE": ""}
    for python in pythons:
        _run([str(python), "-c", BUILD_DEFINITIONS], cwd=workdir, env=env)  # writes the bytecode
    times: list[list[float]] = [[] for _ in pythons]
    for _ in range(repeats):
        for index, python in enumerate(pythons):
            started = time.perf_counter()
            _run([str(python), "-c", BUILD_DEFINITIONS], cwd=workdir, env=env)
            times[index].append(time.perf_counter() - started)
    return times


def run(ctx: BenchContext) -> list[Result]:
    root = ctx.workdir / NAME
    with ctx.phase("install"):
        source = copy_sources(root / "app")
        lean = install_run_worker(root / "production", source)
        install_run_worker(root / "webserver", source, "webserver")
        full = install(root / "today", source, *today_requirements(source))
    ours, today = installed_bytes(root / "production"), installed_bytes(root / "today")
    size = Result(
        stage=NAME,
        metric="installed_mib",
        ours=round(ours / MiB, 1),
        baseline=round(today / MiB, 1),
        unit="MiB",
        better="lower",
        baseline_name="today's main dependencies (with the UI, moto[server], pgserver, pandas, "
        "pyarrow, numpy, dg)",
        details={
            "ours": "the run image's set: pip install . (no extras), stripped",
            "webserver_image_mib": round(installed_bytes(root / "webserver") / MiB, 1),
            "largest_mib": largest_entries(root / "production", count=16),
        },
    ).expect_factor(TARGET_FACTOR, "≤ 50 % of today's")
    results = [size]
    debian = apt_ffmpeg_bytes()
    if debian is not None:
        lower, upper = debian
        results.append(
            Result(
                stage=NAME,
                metric="image_software_mib",
                ours=round(ours / MiB, 1),
                baseline=round((today + lower) / MiB, 1),
                unit="MiB",
                better="lower",
                baseline_name="today's set + Debian's ffmpeg (apt Installed-Size, lower bound)",
                details={
                    "debian_ffmpeg_mib_lower": round(lower / MiB, 1),
                    "debian_ffmpeg_mib_upper": round(upper / MiB, 1),
                    "ratio_with_upper": round(ours / (today + upper), 3),
                },
            ).expect_factor(TARGET_FACTOR, "≤ 50 % of today's")
        )
    images = None
    if ctx.config.footprint_images:  # minutes of podman builds: on request, not in make bench
        with ctx.phase("images"):
            images = built_images()
    if images is not None:
        old_software = today + (debian[0] if debian is not None else 0)
        results.append(image_result(images, old_software))
    repeats = ctx.config.repeats
    with ctx.phase("imports"):
        lean_s, full_s = import_seconds([lean, full], root, repeats)
    results.append(
        seconds_result(
            NAME,
            "run_worker_import_s",
            lean_s,
            full_s,
            baseline_name="the same import in today's full set",
            details={"median_s": round(median(lean_s), 3)},
        )
    )
    return results
