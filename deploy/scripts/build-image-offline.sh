#!/usr/bin/env bash
# Build healer's container image exactly from the Dockerfile on a machine with no Docker daemon and
# no container registry, only Debian's archive and PyPI (CI): podman with the runc runtime, and a
# Debian bookworm base with Python 3.11 made by mmdebstrap and imported with `podman import` in
# place of python:3.11-slim (`--build-arg PYTHON_IMAGE=<that base>`). Prints the image's name.
#
#   bash deploy/scripts/build-image-offline.sh            build if missing, print the image's name
#   bash deploy/scripts/build-image-offline.sh --tag      print the image's name; build nothing
#   bash deploy/scripts/build-image-offline.sh --dockerfile FILE   build FILE instead (not cached)
#
# Cached in podman's image store by hash: the base by this script's recipe (and the host's extra
# certificate authorities), the image by the base, the Dockerfile, .dockerignore and every path the
# Dockerfile COPYs from the context. Nothing changed: a `podman image exists`, well under a second.
# Needs root (rootful podman) and the Debian packages podman, runc and mmdebstrap.
#
# The base is CI-only and never published: it trusts the host's extra certificate authorities
# (/usr/local/share/ca-certificates, where Debian keeps them) so pip inside the build reaches PyPI
# through a TLS-inspecting proxy. A published image is built with `make image` (Docker, on the
# official python:3.11-slim), which this base does not touch.
#
# A failed build ends with one line naming the failing step and its Dockerfile line.
set -euo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/../.."

dockerfile=Dockerfile
mode=build
case "${1:-}" in
  --tag) mode=tag ;;
  --dockerfile) dockerfile="${2:?--dockerfile needs a file}"; mode=check ;;
  "") ;;
  *) echo "usage: $0 [--tag | --dockerfile FILE]" >&2; exit 2 ;;
esac

SUITE=bookworm
MIRROR=http://deb.debian.org/debian
SECURITY=http://deb.debian.org/debian-security
# python-is-python3: `python` on PATH, as in python:3.11-slim; passwd: groupadd/useradd.
PACKAGES=python3,python3-venv,python-is-python3,ca-certificates,passwd
REPOSITORY=localhost/healer
podman=(podman --runtime runc)  # crun, podman's default where installed, cannot set its limits here

extra_cas() { find /usr/local/share/ca-certificates -type f -name '*.crt' 2>/dev/null | sort; }
hash_files() { xargs -0 -r sha256sum | sha256sum | cut -c1-16; }

# What the Dockerfile copies from the build context (COPY without --from: every argument but the
# last, flags left out).
copied="$(awk 'toupper($1) == "COPY" && !/--from/ { for (i = 2; i < NF; i++) if ($i !~ /^--/) print $i }' "${dockerfile}")"

base_key="$(
  { sed -n '/^SUITE=/,/^PACKAGES=/p' "${self}"; sed -n '/^make_base()/,/^}/p' "${self}"
    extra_cas | tr '\n' '\0' | hash_files; } | sha256sum | cut -c1-16
)"
base="${REPOSITORY}-ci-python:${SUITE}-${base_key}"
image_key="$(
  { echo "${base}"
    # shellcheck disable=SC2086  # word splitting: one path per word
    # A path that is missing: podman's build names the COPY that fails.
    { find Dockerfile .dockerignore ${copied} -type f ! -path '*/__pycache__/*' ! -name '*.py[cod]' \
      -print0 2>/dev/null || true; } | sort -z | hash_files; } | sha256sum | cut -c1-16
)"
image="${REPOSITORY}:ci-${image_key}"

if [ "${mode}" = tag ]; then
  echo "${image}"
  exit 0
fi
for tool in podman runc mmdebstrap; do
  command -v "${tool}" >/dev/null || {
    echo "build-image-offline.sh: '${tool}' is not installed: bash scripts/apt-install.sh podman runc mmdebstrap" >&2
    exit 1
  }
done

make_base() {  # the Debian base: minbase + Python 3.11 and its venv, the host's extra CAs trusted
  local tmp rc=0
  tmp="$(mktemp -d)"
  local hooks=()
  if [ -n "$(extra_cas)" ]; then
    hooks+=(--customize-hook='cp /usr/local/share/ca-certificates/*.crt "$1/usr/local/share/ca-certificates/"'
            --customize-hook='chroot "$1" update-ca-certificates >/dev/null')
  fi
  mmdebstrap --quiet --variant=minbase --include="${PACKAGES}" --format=tar \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    "${hooks[@]}" "${SUITE}" "${tmp}/rootfs.tar" \
    "deb ${MIRROR} ${SUITE} main" "deb ${MIRROR} ${SUITE}-updates main" \
    "deb ${SECURITY} ${SUITE}-security main" || rc=$?
  if [ "${rc}" -eq 0 ]; then
    "${podman[@]}" import --quiet --change 'CMD ["python3"]' \
      --message "healer CI base: Debian ${SUITE} minbase, ${PACKAGES}" "${tmp}/rootfs.tar" "${base}" >/dev/null || rc=$?
  fi
  rm -rf "${tmp}"
  return "${rc}"
}

if [ "${mode}" = build ] && "${podman[@]}" image exists "${image}"; then
  echo "build-image-offline.sh: ${image} is cached (Dockerfile and its inputs unchanged)" >&2
  echo "${image}"
  exit 0
fi

start=${SECONDS}
if ! "${podman[@]}" image exists "${base}"; then
  echo "build-image-offline.sh: making the base ${base} (mmdebstrap, Debian ${SUITE})" >&2
  make_base
  echo "build-image-offline.sh: base made in $((SECONDS - start)) s" >&2
fi

log="$(mktemp)"
trap 'rm -f "${log}"' EXIT
tag=("--tag" "${image}")
[ "${mode}" = check ] && tag=()
# --network host: pip reaches PyPI as the host does; --layers: unchanged steps come from the cache.
if "${podman[@]}" build --format docker --layers --network host --file "${dockerfile}" \
    --build-arg PYTHON_IMAGE="${base}" "${tag[@]}" . 2>&1 | tee "${log}" >&2; then
  if [ "${mode}" = check ]; then
    echo "build-image-offline.sh: ${dockerfile} built in $((SECONDS - start)) s (not tagged)" >&2
    exit 0
  fi
  echo "build-image-offline.sh: built ${image} in $((SECONDS - start)) s," \
    "$("${podman[@]}" image inspect --format '{{.Size}}' "${image}" | numfmt --to=si --suffix=B)" >&2
  # Each change to what the image copies makes a new one: keep the newest three of them.
  "${podman[@]}" images --filter "reference=${REPOSITORY}:ci-*" --format '{{.Repository}}:{{.Tag}}' \
    | tail -n +4 | xargs -r "${podman[@]}" rmi >/dev/null || true
  echo "${image}"
  exit 0
fi
# podman prints "[2/2] STEP 3/12: RUN ..." before each step and stops at the one that fails: name
# it, with its line in the Dockerfile.
step="$(grep -E '^(\[[0-9]+/[0-9]+\] )?STEP [0-9]+/[0-9]+: ' "${log}" | tail -n 1 || true)"
if [ -n "${step}" ] && grep -q 'building at STEP' "${log}"; then
  instruction="${step#*: }"
  line="$(grep -n -F -- "${instruction:0:40}" "${dockerfile}" | head -n 1 | cut -d: -f1 || true)"
  echo "build-image-offline.sh: the image build failed at ${step%%: *} (${dockerfile} line ${line:-?}): ${instruction}" >&2
else
  echo "build-image-offline.sh: the image build failed (podman's output above)" >&2
fi
exit 1
