#!/usr/bin/env bash
# `make image`: builds the Dockerfile's two targets with podman, as production's CI builds them
# with Docker (docs/deploy-aws.md#the-images-here):
#   run        -> ${IMAGE}:run         (the default target: code server, daemon, run workers, tasks)
#   webserver  -> ${IMAGE}:webserver   (the UI)
# The base is the Dockerfile's own (ARG BASE, python:3.11-slim-bookworm) when it is present or
# can be pulled. Where no registry is reachable, a STAND-IN is built once from Debian's packages
# (debootstrap bookworm minbase + Debian's python3 3.11; scripts/stand-in-base.Containerfile)
# and reused; the output says loudly which base was used. BASE=image forces one.
# pip inside the build reaches PyPI through this machine's TLS proxy: the host's CA bundle is
# mounted for the build only (a pip.conf naming it at /etc/pip.conf); no image carries either.
# Prints `build-images: base: <image>` and, last, one `build-images: image ...` line per target.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "build-images: $*"; }
die() { echo "build-images: $*" >&2; exit 1; }

command -v podman >/dev/null 2>&1 || die "podman is not installed (scripts/bootstrap.sh installs it with apt)"
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/scripts/containers.conf}
# podman stages layers under TMPDIR; a test session's TMPDIR is checked for leftovers.
export TMPDIR=/var/tmp

IMAGE=${IMAGE:-localhost/episode-pipeline}
PRODUCTION_BASE=$(sed -n 's/^ARG BASE=//p' Dockerfile)
[ -n "$PRODUCTION_BASE" ] || die "Dockerfile: no 'ARG BASE=<image>' line"
# Named after their recipes, so a changed recipe builds anew and an unchanged one is reused.
ROOTFS_RECIPE=3  # debootstrap's minbase, trimmed as debian:bookworm-slim is (below)
STAND_IN_RECIPE=$({ echo "$ROOTFS_RECIPE"; cat scripts/stand-in-base.Containerfile; } | sha256sum | cut -c1-10)
STAND_IN=localhost/episode-pipeline-base:bookworm-stand-in-$STAND_IN_RECIPE
ROOTFS_IMAGE=localhost/episode-pipeline-debian:bookworm-minbase-$ROOTFS_RECIPE
# Outside the work tree, so every clone on the machine reuses one debootstrap.
CACHE=${EPISODE_PIPELINE_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/episode-pipeline/images}
PULL_TIMEOUT_SECONDS=${PULL_TIMEOUT_SECONDS:-120}
BUILD_TIMEOUT_SECONDS=${BUILD_TIMEOUT_SECONDS:-1800}
mkdir -p "$CACHE"

stand_in_base() {
  # One builder at a time per machine: a second waits and then finds the image.
  exec 9>"$CACHE/stand-in.lock"
  timeout 900 flock 9 || die "waited 900 s for another build's stand-in base ($CACHE/stand-in.lock)"
  if podman image exists "$STAND_IN"; then
    say "stand-in base $STAND_IN already built: reused"
    return
  fi
  local tarball="$CACHE/bookworm-minbase-$ROOTFS_RECIPE.tar"
  if [ ! -s "$tarball" ]; then
    command -v debootstrap >/dev/null 2>&1 ||
      die "debootstrap is not installed (scripts/bootstrap.sh installs it with apt)"
    local rootfs="$CACHE/rootfs.partial"
    rm -rf "$rootfs" "$CACHE"/bookworm-minbase-*.tar  # and the rootfs of an older recipe
    say "debootstrap --variant=minbase bookworm (about 3 min, once per machine) into $rootfs"
    timeout 1200 debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian \
      >"$CACHE/debootstrap.log" 2>&1 || die "debootstrap failed: see $CACHE/debootstrap.log"
    # What debian:bookworm-slim leaves out: the downloaded packages, apt's lists, the docs
    # (copyright files kept), man pages and translations; and its dpkg and apt settings, so
    # later installs leave them out too.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
      "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/*
    find "$rootfs/usr/share/doc" -depth -type f ! -name copyright -delete
    find "$rootfs/usr/share/doc" -depth -type d -empty -delete
    printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
      'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' \
      'path-exclude /usr/share/locale/*' >"$rootfs/etc/dpkg/dpkg.cfg.d/docker-slim"
    printf '%s\n' 'APT::Install-Recommends "false";' \
      'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb || true"; };' \
      'Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";' \
      >"$rootfs/etc/apt/apt.conf.d/docker-clean"
    tar -C "$rootfs" -c . >"$tarball.partial"
    mv "$tarball.partial" "$tarball"
    rm -rf "$rootfs"
  fi
  podman import --quiet "$tarball" "$ROOTFS_IMAGE" >/dev/null
  timeout "$BUILD_TIMEOUT_SECONDS" podman build --network host --build-arg ROOTFS="$ROOTFS_IMAGE" \
    -t "$STAND_IN" -f scripts/stand-in-base.Containerfile scripts/ ||
    die "the stand-in base could not be built"
}

if [ -n "${BASE:-}" ]; then
  base=$BASE
  say "base: $base (BASE given)"
elif podman image exists "$PRODUCTION_BASE" ||
  timeout "$PULL_TIMEOUT_SECONDS" podman pull --quiet "docker.io/library/$PRODUCTION_BASE" >/dev/null 2>&1; then
  base=$PRODUCTION_BASE
  say "base: $base (the Dockerfile's, as in production)"
else
  stand_in_base
  base=$STAND_IN
  say "=================================================================================="
  say "base: $base -- A STAND-IN, NOT PRODUCTION'S BASE"
  say "  $PRODUCTION_BASE could not be pulled (no registry reachable); the images are built on"
  say "  Debian bookworm minbase with Debian's python3 ($(podman run --rm "$base" python --version 2>&1))"
  say "=================================================================================="
fi

mounts=()
host_ca=/etc/ssl/certs/ca-certificates.crt
if [ -s "$host_ca" ]; then
  printf '[global]\ncert = /etc/ssl/certs/host-ca.crt\n' >"$CACHE/pip.conf"
  mounts=(-v "$host_ca:/etc/ssl/certs/host-ca.crt:ro" -v "$CACHE/pip.conf:/etc/pip.conf:ro")
fi

for target in run webserver; do
  say "building target $target on $base"
  started=$SECONDS
  timeout "$BUILD_TIMEOUT_SECONDS" podman build --network host --layers \
    --build-arg BASE="$base" --label episode-pipeline.base="$base" "${mounts[@]}" \
    --target "$target" -t "$IMAGE:$target" . ||
    die "target $target did not build"
  say "target $target built in $((SECONDS - started)) s"
done
for target in run webserver; do
  size=$(podman image inspect --format '{{.Size}}' "$IMAGE:$target")
  say "image $IMAGE:$target: $((size / 1048576)) MiB, base $base"
done
