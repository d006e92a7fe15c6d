#!/usr/bin/env bash
# Build `helm` from its Go module (no prebuilt download) into a cache reused across runs, and print
# its path. The chart tests (tests/integration/test_helm_chart.py) and .ci/run use it.
#
#   bash deploy/scripts/build-helm.sh           build if missing, print the binary's path
#   bash deploy/scripts/build-helm.sh --path    print where the binary is (or would be); build nothing
#
# Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/healer-tools/helm-<version>/helm. Needs Go 1.24 or newer
# and the Go module proxy. HELM_VERSION overrides the pinned version.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
dir="${XDG_CACHE_HOME:-$HOME/.cache}/healer-tools/helm-${HELM_VERSION}"
helm="${dir}/helm"

if [ "${1:-}" = "--path" ]; then
  echo "${helm}"
  exit 0
fi

if [ ! -x "${helm}" ]; then
  if ! command -v go >/dev/null; then
    echo "build-helm.sh: 'go' is not installed; install Go (https://go.dev/doc/install) to build helm ${HELM_VERSION}" >&2
    exit 1
  fi
  mkdir -p "${dir}"
  start=$(date +%s)
  # A temporary GOBIN, then a rename: an interrupted build never leaves a half-written binary.
  tmp="$(mktemp -d "${dir}/build.XXXXXX")"
  trap 'rm -rf "${tmp}"' EXIT
  GOBIN="${tmp}" GOFLAGS=-buildvcs=false CGO_ENABLED=0 go install "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
  mv "${tmp}/helm" "${helm}"
  echo "build-helm.sh: built helm ${HELM_VERSION} in $(( $(date +%s) - start )) s" >&2
fi
echo "${helm}"
