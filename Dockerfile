# One image for every production process of the episode pipeline (see README.md, "Deploying to AWS"):
#   default CMD        the Dagster code server (gRPC, port 4000)
#   run workers        started by EcsRunLauncher with `dagster api execute_run ...` as the command
#   transcode task     `python -m episode_pipeline.transcode` (PipesECSClient)
#   webserver, daemon  `dagster-webserver ...` / `dagster-daemon run ...` (commands set in infra/ecs.tf)
# No Docker engine runs on the development machines: episode_pipeline_tests/test_deploy_dockerfile.py
# lints this file (hadolint) and checks the essentials.
FROM python:3.11-slim-bookworm

# FFmpeg transcodes to HLS, zstd unpacks the uploads. Unpinned Debian versions on purpose: the
# bookworm security updates are wanted, and the base tag fixes the Debian release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ffmpeg zstd \
    && rm -rf /var/lib/apt/lists/*

# MALLOC_ARENA_MAX: a run worker's upload threads would each get a glibc malloc arena holding
# freed part buffers; two arenas keep an extraction's peak RSS ≤ 300 MiB (benchmarks/extraction.py).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MALLOC_ARENA_MAX=2 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DAGSTER_HOME=/opt/dagster/dagster_home \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# The package and its pinned dependency set (pyproject.toml pins the Dagster family exactly),
# precompiled: PYTHONDONTWRITEBYTECODE (above) means nothing is cached at run time, so a missing
# .pyc would be compiled again in every process (~3 s of CPU per start; docs/platform-notes.md).
WORKDIR /opt/dagster/app
COPY pyproject.toml README.md ./
COPY episode_pipeline ./episode_pipeline
RUN python -m venv /opt/venv \
    && pip install --no-cache-dir --compile . \
    && rm -rf build ./*.egg-info

# The production instance and workspace (PostgreSQL storage, ECS run launcher, S3 compute logs).
COPY dagster.yaml workspace.yaml /opt/dagster/dagster_home/

RUN groupadd --system --gid 10001 dagster \
    && useradd --system --uid 10001 --gid dagster --home-dir /opt/dagster --shell /usr/sbin/nologin dagster \
    && mkdir -p /tmp/dagster-compute-logs \
    && chown -R dagster:dagster /opt/dagster/dagster_home /tmp/dagster-compute-logs
USER 10001:10001

EXPOSE 4000
CMD ["dagster", "code-server", "start", "-h", "0.0.0.0", "-p", "4000", "-m", "episode_pipeline.definitions", "--location-name", "episode_pipeline"]
