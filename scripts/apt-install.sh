#!/usr/bin/env bash
# Install Debian/Ubuntu packages with apt-get (quiet, no recommends), for .ci/run and scripts/demo.sh.
#
#   bash scripts/apt-install.sh PACKAGE...
#
# Another apt or dpkg may be running (a fresh cloud machine's unattended upgrades): this waits for
# it, up to HEALER_APT_WAIT seconds (default 600), instead of failing at once. apt-get install waits
# for the dpkg lock itself (DPkg::Lock::Timeout); apt-get update does not for the package lists'
# lock, so it is tried again while it says they are locked. The install is tried first; when it
# fails the package lists are refreshed and it is tried once more.
set -euo pipefail
wait_s="${HEALER_APT_WAIT:-600}"
SUDO=()
[ "$(id -u)" -eq 0 ] || SUDO=(sudo)
apt_get() { "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -y -q -o DPkg::Lock::Timeout="$wait_s" "$@"; }

update() {
  local deadline=$((SECONDS + wait_s)) err said=""
  until err="$(apt_get update 2>&1 >/dev/null)"; do
    if [[ $err != *"Unable to lock"* ]] || [ "$SECONDS" -ge "$deadline" ]; then
      printf '%s\n' "$err" >&2
      return 1
    fi
    [ -n "$said" ] || echo "apt-install.sh: another apt holds the package lists; waiting up to $wait_s s" >&2
    said=1
    sleep 1
  done
}

apt_get install --no-install-recommends "$@" >/dev/null 2>&1 \
  || { update && apt_get install --no-install-recommends "$@" >/dev/null; }
