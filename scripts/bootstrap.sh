#!/usr/bin/env bash
# Creates .venv with uv and installs the project with the local stack and the dev tools (the
# extras [local] and [dev]; the production image installs neither). Idempotent and quick when
# nothing changed. On a bare Debian/Ubuntu, python3's venv module comes from apt (python3-venv).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "bootstrap: Python 3.11+ is required ($PYTHON is $("$PYTHON" -V 2>&1))" >&2
  exit 1
fi
if ! "$PYTHON" -m venv --help >/dev/null 2>&1 || ! "$PYTHON" -c 'import ensurepip' 2>/dev/null; then
  echo "bootstrap: installing python3-venv with apt-get" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq python3-venv python3-pip
fi

if [ ! -x .venv/bin/uv ]; then
  "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check uv
fi
# Precompiled: these machines set PYTHONDONTWRITEBYTECODE, so without .pyc files every Python
# process would compile Dagster's source again (~3 s of CPU each; docs/platform-notes.md).
stamp=.venv/.installed-compiled
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  UV_PYTHON_DOWNLOADS=never .venv/bin/uv pip install -q --python .venv/bin/python -e '.[local,dev]'
  # A few packages ship files that do not compile (templates, other Pythons' tests): not ours.
  .venv/bin/python -m compileall -q -j 0 \
    "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    >/dev/null 2>&1 || true
  touch "$stamp"
fi

# Tools some tests need, from apt: under CI=true they must install; elsewhere they are installed
# when apt can do it, and the tests that need them skip without them.
# Usage: apt_for_tests "WHY" PROGRAM... -- PACKAGE...
apt_for_tests() {
  local why=$1 programs=() missing=""
  shift
  while [ "$1" != "--" ]; do programs+=("$1"); shift; done
  shift
  for program in "${programs[@]}"; do command -v "$program" >/dev/null 2>&1 || missing=1; done
  [ -n "$missing" ] || return 0
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo -n"
  if command -v apt-get >/dev/null 2>&1 && $SUDO true 2>/dev/null; then
    echo "bootstrap: installing $* with apt-get (for $why)" >&2
    if ! { $SUDO apt-get update -qq &&
      $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; } >/dev/null; then
      [ "${CI:-}" != "true" ] || { echo "bootstrap: $* could not be installed" >&2; exit 1; }
      echo "bootstrap: $* not installed; $why will skip" >&2
    fi
  elif [ "${CI:-}" = "true" ]; then
    echo "bootstrap: CI=true needs $* (for $why), and apt-get is not usable here" >&2
    exit 1
  fi
}

# A real browser for the UI smoke test: Debian's chromium, driven by Playwright's Python package
# (never `playwright install`, which downloads a browser).
apt_for_tests "the browser smoke test" chromium -- chromium
# podman and runc (with scripts/containers.conf) and debootstrap (a stand-in base where no
# container registry is reachable) for `make image` and the image test (test_images.py).
apt_for_tests "the image test" podman runc debootstrap -- podman runc debootstrap
# The episode viewer's browser libraries (hls.js, uPlot: `episode-pipeline view`), from the npm
# registry at the versions its package-lock.json pins; served by the command, never a CDN.
# Installed again only when the lockfile changes (npm ci writes node_modules/.package-lock.json).
apt_for_tests "the episode viewer and its browser test" npm -- nodejs npm
web=episode_pipeline/viewer/web
if command -v npm >/dev/null 2>&1 &&
  { [ ! -f "$web/node_modules/.package-lock.json" ] ||
    [ "$web/package-lock.json" -nt "$web/node_modules/.package-lock.json" ]; }; then
  npm ci --prefix "$web" --no-audit --no-fund --loglevel=error
fi
