"""healer's container image as the tests see it: built by ``deploy/scripts/build-image-offline.sh``
(podman, runc, a Debian base made by mmdebstrap), run with podman, and the chart's Deployment
turned into a ``podman run`` command line (its container's args, env, mounts and security context).

``.ci/run`` builds the image in the background; the tests using the ``healer_image`` fixture run
last and wait for the build's status file (``HEALER_IMAGE_BUILD_STATUS``, tests/go_builds.py).
"""

from __future__ import annotations

import resource
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.service_skips import require_binary

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "deploy" / "scripts" / "build-image-offline.sh"
BUILD_HINT = f"bash {BUILD_SCRIPT.relative_to(REPO)}"
#: runc, not crun (podman's default where installed): crun cannot set its limits on these machines.
RUNTIME = ("--runtime", "runc")


def podman(*args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
    """``podman --runtime runc ARGS``, output captured as text."""
    binary = require_binary("podman", package="podman")
    return subprocess.run(
        [binary, *RUNTIME, *args], capture_output=True, text=True, timeout=timeout, check=check
    )


def image_name() -> str:
    """The image the build script builds from the working tree now (``--tag``: builds nothing)."""
    return subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--tag"], capture_output=True, text=True, timeout=60, check=True
    ).stdout.strip()


def ulimits() -> list[str]:
    """``--ulimit`` options runc can set here: podman's defaults (a million open files and
    processes) exceed the host's hard limits, and runc fails with ``error setting rlimit type 7``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return ["--ulimit", f"nofile={soft}:{hard}", "--ulimit", "nproc=4096:4096"]


@dataclass
class PodmanPod:
    """One container of a rendered Deployment as ``podman run`` options (host network)."""

    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    options: list[str] = field(default_factory=list)

    def command(self, image: str, name: str) -> list[str]:
        """``podman run`` options, image and arguments, detached, named ``name``."""
        env = [f"--env={key}={value}" for key, value in self.env.items()]
        return ["run", "--detach", f"--name={name}", "--network=host", *self.options, *env, image, *self.args]


def container_options(
    deployment: Mapping[str, Any],
    container: str,
    *,
    files: Mapping[str, Path],
    values: Mapping[str, str],
) -> PodmanPod:
    """Container ``container`` (or init container) of ``deployment`` as podman options.

    ``files``: the host directory standing in for each volume (ConfigMap contents written out, an
    emptyDir); ``values``: each ``valueFrom`` env variable's value (the Secret's, the field's).
    The pod's and the container's security context become ``--user``, ``--read-only``,
    ``--cap-drop`` and ``no-new-privileges``; a security setting this does not know fails.
    """
    spec = deployment["spec"]["template"]["spec"]
    [found] = [c for c in [*spec.get("initContainers", []), *spec["containers"]] if c["name"] == container]
    pod_sc = spec.get("securityContext", {})
    sc = {**pod_sc, **found.get("securityContext", {})}
    options = [*ulimits(), "--no-healthcheck", f"--user={sc['runAsUser']}:{sc['runAsGroup']}"]
    known = {"runAsUser", "runAsGroup", "runAsNonRoot", "fsGroup", "seccompProfile"}
    if sc.pop("readOnlyRootFilesystem", False):
        options.append("--read-only")
    if sc.pop("allowPrivilegeEscalation", True) is False:
        options.append("--security-opt=no-new-privileges")
    for cap in sc.pop("capabilities", {}).get("drop", []):
        options.append(f"--cap-drop={cap}")
    unknown = set(sc) - known
    assert not unknown, f"security settings not run by this test: {sorted(unknown)}"
    for mount in found.get("volumeMounts", []):
        source = files[mount["name"]]
        options.append(f"--volume={source}:{mount['mountPath']}:{'ro' if mount.get('readOnly') else 'rw'}")
    env = {}
    for item in found.get("env", []):
        env[item["name"]] = item["value"] if "value" in item else values[item["name"]]
    return PodmanPod(args=list(found.get("args", [])), env=env, options=options)


def write_config_map(config_map: Mapping[str, Any], where: Path) -> Path:
    """A ConfigMap's keys as files in ``where`` (what its volume mount shows), readable by anyone."""
    where.mkdir(parents=True, exist_ok=True)
    where.chmod(0o755)
    for key, text in config_map.get("data", {}).items():
        path = where / key
        path.write_text(text)
        path.chmod(0o644)
    return where


def by_kind(objects: Sequence[Mapping[str, Any]], kind: str) -> dict[str, Mapping[str, Any]]:
    """The rendered objects of ``kind`` by name."""
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}
