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

# Reuse the cached binary when it is the pinned version (an older build of this script left one
# without its version stamped in).
if [ ! -x "${helm}" ] || [ "$("${helm}" version --template '{{.Version}}' 2>/dev/null)" != "${HELM_VERSION}" ]; then
  if ! command -v go >/dev/null; then
    echo "build-helm.sh: 'go' is not installed; install Go 1.24 or newer (https://go.dev/doc/install) to build helm ${HELM_VERSION}" >&2
    exit 1
  fi
  mkdir -p "${dir}"
  start=$(date +%s)
  module="helm.sh/helm/v3@${HELM_VERSION}"
  # What helm's own Makefile stamps in: its version, and the Kubernetes version of its client-go
  # (v0.N.x is Kubernetes 1.N), the default for `helm template` and `helm lint` without --kube-version.
  gomod="$(go mod download -json "${module}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')"
  k8s_minor="$(sed -n 's/^[[:space:]]*k8s.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "${gomod}" | head -n1)"
  ldflags="-w -s -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
  if [ -n "${k8s_minor}" ]; then
    for pkg in pkg/chartutil pkg/lint/rules; do
      ldflags="${ldflags} -X helm.sh/helm/v3/${pkg}.k8sVersionMajor=1 -X helm.sh/helm/v3/${pkg}.k8sVersionMinor=${k8s_minor}"
    done
  fi
  # A temporary GOBIN, then a rename: an interrupted build never leaves a half-written binary.
  tmp="$(mktemp -d "${dir}/build.XXXXXX")"
  trap 'rm -rf "${tmp}"' EXIT
  GOBIN="${tmp}" GOFLAGS=-buildvcs=false CGO_ENABLED=0 go install -trimpath -ldflags "${ldflags}" "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
  mv "${tmp}/helm" "${helm}"
  echo "build-helm.sh: built helm ${HELM_VERSION} in $(( $(date +%s) - start )) s" >&2
fi
echo "${helm}"
