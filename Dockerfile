# One image for every production process of the episode pipeline (see README.md, "Deploying to AWS"):
#   default CMD        the Dagster code server (gRPC, port 4000)
#   run workers        started by EcsRunLauncher with `dagster api execute_run ...` as the command;
#                      each transcodes its episode in a `python -m episode_pipeline.transcode` child
#   transcode task     the same program as a task of its own, for large archives (PipesECSClient)
#   webserver, daemon  `dagster-webserver ...` / `dagster-daemon run ...` (commands set in infra/ecs.tf)
# No Docker engine runs on the development machines: episode_pipeline_tests/test_deploy_dockerfile.py
# lints this file (hadolint) and checks the essentials.
FROM python:3.11-slim-bookworm

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

# The package and its production dependencies only (no extras: the local stack and the test
# tools stay out; pyproject.toml pins the Dagster family exactly), precompiled:
# PYTHONDONTWRITEBYTECODE (above) means nothing is cached at run time, so a missing .pyc would be
# compiled again in every process (~3 s of CPU per start; docs/platform-notes.md). No apt
# packages: the one FFmpeg is imageio-ffmpeg's bundled static build (libx264, AV1 decoders, the
# hls muxer), the one the tests run; PyAV, psycopg and the rest bring their own libraries
# (docs/deploy-aws.md#one-ffmpeg). The last step fails the build if the definitions or FFmpeg
# cannot be loaded from this install.
WORKDIR /opt/dagster/app
COPY pyproject.toml README.md ./
COPY episode_pipeline ./episode_pipeline
RUN python -m venv /opt/venv \
    && pip install --no-cache-dir --compile . \
    && rm -rf build ./*.egg-info \
    && python -c "import episode_pipeline.definitions; from episode_pipeline.video import ffmpeg_exe; print(ffmpeg_exe())"

# The production instance and workspace (PostgreSQL storage, ECS run launcher, S3 compute logs).
COPY dagster.yaml workspace.yaml /opt/dagster/dagster_home/

RUN groupadd --system --gid 10001 dagster \
    && useradd --system --uid 10001 --gid dagster --home-dir /opt/dagster --shell /usr/sbin/nologin dagster \
    && mkdir -p /tmp/dagster-compute-logs \
    && chown -R dagster:dagster /opt/dagster/dagster_home /tmp/dagster-compute-logs
USER 10001:10001

EXPOSE 4000
CMD ["dagster", "code-server", "start", "-h", "0.0.0.0", "-p", "4000", "-m", "episode_pipeline.definitions", "--location-name", "episode_pipeline"]
