# Two images of the episode pipeline (see docs/deploy-aws.md#image-size), built from one file:
#   run (the default target)  the code server (default CMD, gRPC on 4000), the daemon, the run
#                              workers EcsRunLauncher starts with `dagster api execute_run ...`
#                              (each transcodes its episode in a `python -m episode_pipeline.transcode`
#                              child), the transcode task for large archives and the dlq task.
#                              What every episode's cold start pulls: no UI, stripped libraries.
#   webserver                  the same plus the UI (`[webserver]` extra): `dagster-webserver`.
# The commands are set in infra/ecs.tf. episode_pipeline_tests/test_deploy_dockerfile.py lints
# this file (hadolint) and checks the essentials; scripts/build-images.sh (`make image`) builds
# both targets with podman, and test_images.py runs their commands against the local stack.
# BASE is production's; where no registry is reachable that script passes a stand-in made from
# Debian's packages (and says so).
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE} AS base

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

RUN groupadd --system --gid 10001 dagster \
    && useradd --system --uid 10001 --gid dagster --home-dir /opt/dagster --shell /usr/sbin/nologin dagster \
    && mkdir -p /opt/dagster/dagster_home /tmp/dagster-compute-logs \
    && chown -R dagster:dagster /opt/dagster/dagster_home /tmp/dagster-compute-logs

# The build stage alone has binutils (strip); no image that runs carries it.
FROM base AS build
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends binutils \
    && rm -rf /var/lib/apt/lists/*

# The package and its production dependencies only (no extras: the UI, the local stack and the
# test tools stay out; pyproject.toml pins the Dagster family exactly), precompiled:
# PYTHONDONTWRITEBYTECODE (above) means nothing is cached at run time, so a missing .pyc would be
# compiled again in every process (~3 s of CPU per start; docs/platform-notes.md). No apt
# packages in the images: the one FFmpeg is imageio-ffmpeg's bundled static build (libx264, AV1
# decoders, the hls muxer), the one the tests run; PyAV, psycopg and the rest bring their own
# libraries (docs/deploy-aws.md#one-ffmpeg). The shared objects that ship their symbol tables are
# stripped. The last step fails the build if the definitions or FFmpeg cannot be loaded.
WORKDIR /opt/dagster/app
COPY pyproject.toml README.md ./
COPY episode_pipeline ./episode_pipeline
COPY scripts/strip-libraries.sh /usr/local/bin/strip-libraries
RUN python -m venv /opt/venv \
    && pip install --no-cache-dir --compile . \
    && strip-libraries /opt/venv/lib/python3.11/site-packages \
    && python -c "import episode_pipeline.definitions; from episode_pipeline.video import ffmpeg_exe; print(ffmpeg_exe())"

FROM build AS build-webserver
# The extra's pins are in pyproject.toml (DL3013 sees only a quoted path with an extra).
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --compile ".[webserver]" \
    && strip-libraries /opt/venv/lib/python3.11/site-packages \
    && python -c "import dagster_webserver, episode_pipeline.definitions"

# The UI: the webserver service only (infra/ecs.tf, image tag webserver-<sha>).
FROM base AS webserver
COPY --from=build-webserver /opt/venv /opt/venv
COPY --chown=10001:10001 dagster.yaml workspace.yaml /opt/dagster/dagster_home/
WORKDIR /opt/dagster
USER 10001:10001
EXPOSE 3000
CMD ["dagster-webserver", "-h", "0.0.0.0", "-p", "3000", "-w", "/opt/dagster/dagster_home/workspace.yaml"]

# Everything else (the default target, tag <sha>): the production instance and workspace
# (PostgreSQL storage, ECS run launcher, S3 compute logs) and the code server by default.
FROM base AS run
COPY --from=build /opt/venv /opt/venv
COPY --chown=10001:10001 dagster.yaml workspace.yaml /opt/dagster/dagster_home/
WORKDIR /opt/dagster
USER 10001:10001
EXPOSE 4000
CMD ["dagster", "code-server", "start", "-h", "0.0.0.0", "-p", "4000", "-m", "episode_pipeline.definitions", "--location-name", "episode_pipeline"]
