#!/usr/bin/env bash
# Build (or reuse) Prometheus 3's `prometheus` and `promtool` from the Go module pinned in go.mod
# (github.com/prometheus/prometheus v0.3MM.P is Prometheus 3.MM.P), for the tests that run beside
# Debian's Prometheus 2.42. Built with `remove_all_sd` (only static and file service discovery, which
# is all healer's tests use) and without the web UI's assets (the API is all the tests read).
# Binaries are cached under ${XDG_CACHE_HOME:-$HOME/.cache}/healer-prometheus3/<version>-<hash>/; a
# second run only checks they are there. Prints the directory holding them (`--dir`: only print it,
# build nothing). Needs Go (the version go.mod names, or a toolchain download) and the module proxy.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
module=github.com/prometheus/prometheus
gover="$(awk -v m="$module" '$1 == m && $2 ~ /^v/ {print $2; exit}' "$here/go.mod")"
# v0.316.0 -> 3.16.0, the release the module version stands for.
release="3.$(echo "${gover#v0.3}" | sed 's/^0*\([0-9]\)/\1/')"
# The key also covers the sources, so an edit to go.mod, go.sum or this script rebuilds.
sum="$(cat "$here/go.mod" "$here/go.sum" "$here/build.sh" | sha256sum | cut -c1-10)"
out="${HEALER_PROMETHEUS3_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/healer-prometheus3/$release-$sum}"
if [ "${1:-}" = "--dir" ]; then echo "$out"; exit 0; fi
if [ -x "$out/prometheus" ] && [ -x "$out/promtool" ]; then echo "$out"; exit 0; fi
command -v go >/dev/null || { echo "tests/prometheus3/build.sh: Go is not installed (https://go.dev/dl)" >&2; exit 1; }
mkdir -p "$out"
# What Prometheus's release build stamps in (Makefile.common's promu): the version the servers
# report in /api/v1/status/buildinfo and `--version`.
stamp="-X github.com/prometheus/common/version.Version=$release"
stamp="$stamp -X github.com/prometheus/common/version.Branch=HEAD"
stamp="$stamp -X github.com/prometheus/common/version.BuildUser=healer-tests"
start=$SECONDS
tmp="$(mktemp -d "$out/.build.XXXXXX")"
# One `go build` for both: the packages they share compile once.
(cd "$here" && go build -trimpath -tags remove_all_sd -ldflags="-s -w $stamp" -o "$tmp/" \
  "$module/cmd/prometheus" "$module/cmd/promtool")
mv "$tmp/prometheus" "$tmp/promtool" "$out/"
rmdir "$tmp"
echo "built prometheus and promtool $release in $((SECONDS - start)) s" >&2
echo "$out"
