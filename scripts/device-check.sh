#!/usr/bin/env bash
# The node agent on a real NVIDIA GPU, in one command: its NVML reader and exporter read the GPUs,
# and each fact the default rules read is printed beside the simulator's assumption for the same
# field (healer_dev/device_check.py says what is compared). Offline: it needs this checkout and a
# virtual environment with healer's dependencies and nvidia-ml-py (`pip install -e '.[agent]'`),
# which may have been made on another machine and copied here (its editable install's paths need
# not match: the checkout is put on PYTHONPATH).
#
#   bash scripts/device-check.sh                        # the GPUs of this machine
#   bash scripts/device-check.sh --out DIR              # also DIR/nvml-recording.json, metrics.prom,
#                                                       # log-bundle.txt (what a ticket would carry)
#   bash scripts/device-check.sh --recorded FILE        # a recorded device instead (the tests' fixture)
#
# HEALER_VENV names the virtual environment (default: .venv in the checkout). Exit 0: NVML
# answered (the table says what differs); 2: NVML not available (the reason printed).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${HEALER_VENV:-$repo/.venv}"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
python="$venv/bin/python"
if ! "$python" -c '' 2>/dev/null; then
  # The venv's interpreter is a link to the Python of the machine that made it: use this machine's
  # python3 with the venv's packages instead (same minor version needed for compiled packages).
  site="$(ls -d "$venv"/lib/python3*/site-packages 2>/dev/null | head -n1 || true)"
  if [ -z "$site" ]; then
    echo "error: no virtual environment at $venv (set HEALER_VENV)" >&2
    exit 2
  fi
  python=python3
  export PYTHONPATH="$PYTHONPATH:$site"
fi
exec "$python" -m healer_dev.device_check "$@"
