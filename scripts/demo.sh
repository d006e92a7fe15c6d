#!/usr/bin/env bash
# The demo on a fresh Debian/Ubuntu machine: install healer and what it needs, then run it.
# Arguments go to `healer demo` (e.g. --duration 300 --headless).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v prometheus >/dev/null 2>&1; then
  echo "healer demo: installing Prometheus from the distribution's package ..."
  if ! command -v apt-get >/dev/null 2>&1 || ! bash scripts/apt-install.sh prometheus; then
    echo "healer demo: could not install Prometheus; install it (Debian/Ubuntu: apt-get install prometheus)" \
         "or put a prometheus binary on PATH, then run this again" >&2
    exit 1
  fi
fi

# The InfiniBand side comes from the real node_exporter reading simulated sysfs trees; without it
# the demo says so in one line and the simulator serves those series itself. Not fatal.
if ! command -v prometheus-node-exporter >/dev/null 2>&1 && ! command -v node_exporter >/dev/null 2>&1 \
   && command -v apt-get >/dev/null 2>&1; then
  echo "healer demo: installing prometheus-node-exporter (optional) ..."
  bash scripts/apt-install.sh prometheus-node-exporter 2>/dev/null || true
fi

if [ ! -x .venv/bin/healer ]; then
  echo "healer demo: creating .venv and installing healer and its libraries" \
    "(a few minutes on a fresh machine; pip prints nothing until it is done) ..."
  start=$SECONDS
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -e .
  echo "healer demo: installed in $((SECONDS - start)) s"
fi
exec .venv/bin/healer demo "$@"
