#!/usr/bin/env bash
# Build (or reuse) `vk`, a virtual-kubelet node for the tests (vk/main.go on the virtual-kubelet
# library pinned in vk/go.mod), cached by version beside the control plane under
# ${XDG_CACHE_HOME:-$HOME/.cache}/healer-kube/<key>/; a second run only checks it is there.
# Prints the directory holding it (`--dir`: only print it, build nothing). Needs Go (1.26 or newer:
# virtual-kubelet's module asks for it) and the Go module proxy. Go's module and build caches are
# the user's, shared with tests/kube/build.sh.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
vk="$(awk '$1 == "github.com/virtual-kubelet/virtual-kubelet" && $2 ~ /^v/ {print $2; exit}' "$here/vk/go.mod")"
# The key also covers the sources, so an edit to main.go or go.sum rebuilds.
sum="$(cat "$here"/vk/go.mod "$here"/vk/go.sum "$here"/vk/*.go "$here"/build-vk.sh | sha256sum | cut -c1-10)"
out="${HEALER_VK_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/healer-kube/vk-$vk-$sum}"
if [ "${1:-}" = "--dir" ]; then echo "$out"; exit 0; fi
if [ ! -x "$out/vk" ]; then
  command -v go >/dev/null || { echo "tests/kube/build-vk.sh: Go is not installed (https://go.dev/dl)" >&2; exit 1; }
  mkdir -p "$out"
  start=$SECONDS
  (cd "$here/vk" && go build -trimpath -ldflags="-s -w" -o "$out/vk.tmp" .)
  mv "$out/vk.tmp" "$out/vk"
  echo "built vk in $((SECONDS - start)) s" >&2
fi
echo "$out"
