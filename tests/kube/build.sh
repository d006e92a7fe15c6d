#!/usr/bin/env bash
# Build (or reuse) the Kubernetes control plane the tests run on: one multi-call binary `kube`
# (kube-apiserver, kube-controller-manager, kube-scheduler, etcd, from the Go modules pinned in
# kube/go.mod) and `kwok` (fake kubelets, kwok/go.mod). Binaries are cached by version under
# ${XDG_CACHE_HOME:-$HOME/.cache}/healer-kube/<key>/; a second run only checks they are there.
# Prints the directory holding them (`--dir`: only print it, build nothing). Needs Go (1.24 or
# newer) and the Go module proxy.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version() { awk -v m="$2" '$1 == m && $2 ~ /^v/ {print $2; exit}' "$here/$1/go.mod"; }
k8s="$(version kube k8s.io/kubernetes)"
kwok="$(version kwok sigs.k8s.io/kwok)"
# The key also covers the sources, so an edit to main.go or go.sum rebuilds.
sum="$(cat "$here"/kube/go.mod "$here"/kube/go.sum "$here"/kube/*.go "$here"/kwok/go.mod "$here"/kwok/go.sum \
  "$here"/build.sh | sha256sum | cut -c1-10)"
out="${HEALER_KUBE_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/healer-kube/k8s-$k8s-kwok-$kwok-$sum}"
if [ "${1:-}" = "--dir" ]; then echo "$out"; exit 0; fi
mkdir -p "$out"
# The servers report the version they are built from (`/version`; helm checks a chart's kubeVersion
# against it), as the Kubernetes release build stamps it; unstamped they say v0.0.0-master.
minor="${k8s#v1.}"; minor="${minor%%.*}"
stamp="-X k8s.io/component-base/version.gitVersion=$k8s -X k8s.io/component-base/version.gitMajor=1"
stamp="$stamp -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
build() {  # build NAME MODULE-DIR PACKAGE [LDFLAGS]
  if [ -x "$out/$1" ]; then return; fi
  local start=$SECONDS
  (cd "$here/$2" && go build -trimpath -ldflags="-s -w ${4:-}" -o "$out/$1.tmp" "$3")
  mv "$out/$1.tmp" "$out/$1"
  echo "built $1 in $((SECONDS - start)) s" >&2
}
command -v go >/dev/null || { echo "tests/kube/build.sh: Go is not installed (https://go.dev/dl)" >&2; exit 1; }
build kube kube . "$stamp"
build kwok kwok sigs.k8s.io/kwok/cmd/kwok
# KWOK's "fast" stages (nodes Ready with Lease heartbeats; pods Ready at once, deletions
# confirmed), from the same module version: kwok reads them with --config.
if [ ! -s "$out/kwok-stages.yaml" ]; then
  stages="$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    echo "---"; cat "$stages/$f"
  done > "$out/kwok-stages.yaml.tmp"
  mv "$out/kwok-stages.yaml.tmp" "$out/kwok-stages.yaml"
fi
echo "$out"
