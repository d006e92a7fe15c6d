"""healer's container image, built from the Dockerfile (``deploy/scripts/build-image-offline.sh``:
podman, runc, a Debian bookworm base with Python 3.11) and run as the Helm chart runs it.

- ``healer --version`` and ``healer rules validate`` of the pack the image bundles;
- the chart's Deployment, rendered by helm, run with podman on the host network: its init
  container (``db upgrade``), then ``healer run`` in dry-run, with the container's args, env,
  mounts (settings and rule ConfigMaps, emptyDirs) and security context (UID 10001, read-only root
  filesystem, no capabilities, no privilege escalation), the chart's ServiceAccount token mounted
  where the kubelet mounts it, against a real Prometheus and the session's control plane. It
  records a dry-run decision for the hot node and serves /healthz, /readyz and /metrics;
- a Dockerfile with one broken line fails, and the build names the step and its line.

The image is built in the background by ``.ci/run``; these tests run last and wait for it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

import healer
from tests.e2e.harness import HEALER_NAMESPACE, World, hot_gpu_rules
from tests.go_builds import IMAGE_STATUS, wait_for_status
from tests.helm import rendered_objects, require_helm
from tests.image import (
    BUILD_HINT,
    BUILD_SCRIPT,
    REPO,
    by_kind,
    container_options,
    image_name,
    podman,
    ulimits,
    write_config_map,
)
from tests.service_skips import REQUIRE
from tests.services import free_port, wait_until

pytestmark = pytest.mark.prometheus

HEALER_UID = 10001  # the Dockerfile's HEALER_UID, the chart's runAsUser
EXTRA_RULES = "image-test-rules"  # the ConfigMap of this test's rule, as rules.extraConfigMaps names it
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@pytest.fixture(scope="module")
def healer_image() -> str:
    """The image built from the working tree, waiting for ``.ci/run``'s background build; skips
    (fails under HEALER_REQUIRE_SERVICES=1) when it is not built."""
    status = wait_for_status(IMAGE_STATUS)
    name = image_name()
    if os.geteuid() != 0:  # rootful podman, and emptyDirs owned by the pod's UID
        message = "the image tests run as root (rootful podman)"
    elif podman("image", "exists", name).returncode != 0:
        why = (
            f"build exited {status}, log in .ci/logs/image-build.log"
            if status not in (None, "0")
            else "not built"
        )
        message = f"image {name} {why}: run `{BUILD_HINT}` (needs podman, runc, mmdebstrap)"
    else:
        return name
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{message} ({REQUIRE}=1)")
    pytest.skip(message)


def run_once(image: str, *args: str) -> tuple[str, float]:
    """``podman run --rm IMAGE ARGS`` as the chart's user, read-only; its output and seconds taken."""
    start = time.monotonic()
    done = podman(
        "run", "--rm", *ulimits(), "--no-healthcheck", "--read-only", f"--user={HEALER_UID}",
        "--cap-drop=ALL", image, *args,
    )  # fmt: skip
    took = time.monotonic() - start
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr, took


def test_image_answers_version_and_validates_its_rule_pack(healer_image: str) -> None:
    out, took = run_once(healer_image, "--version")
    assert out.strip() == f"healer {healer.__version__}"
    print(f"healer --version in the image: {took:.2f} s")
    # Without --user (a plain `docker run`), the image's own user: healer, not root.
    who = podman("run", "--rm", *ulimits(), "--no-healthcheck", "--entrypoint=id", healer_image, "-u")
    assert who.stdout.strip() == str(HEALER_UID), who
    out, _ = run_once(healer_image, "rules", "validate", "/var/lib/healer/rules")
    bundled = sorted(p.name for p in (REPO / "rules").glob("*.y*ml"))
    assert out.startswith("OK: ") and f"from {len(bundled)} files" in out, out


def test_broken_dockerfile_line_fails_naming_the_step(tmp_path: Path, healer_image: str) -> None:
    """A Dockerfile whose runtime stage has one broken line: the steps before it come from the
    cache (seconds), the broken one fails, and the build's last line names it and its line."""
    lines = (REPO / "Dockerfile").read_text().splitlines()
    [index] = [i for i, line in enumerate(lines) if line.startswith("RUN groupadd ")]
    lines[index] = lines[index].replace("groupadd ", "groupadd --no-such-option ", 1)
    broken = tmp_path / "Dockerfile"
    broken.write_text("\n".join(lines) + "\n")
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--dockerfile", str(broken)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    step = rf"failed at \[2/2\] STEP \d+/\d+ \({re.escape(str(broken))} line {index + 1}\)"
    assert re.search(rf"{step}: RUN groupadd --no-such-option ", last), last


def _rendered(world: World, image: str, prometheus_url: str) -> list[dict[str, Any]]:
    repository, tag = image.rsplit(":", 1)
    values = {
        "image": {"repository": repository, "tag": tag},
        "replicas": 1,
        "dryRun": True,
        "prometheus": {"url": prometheus_url},
        "api": {"anonymousRole": "viewer"},  # the test reads the API without a token
        "leaderElection": {"leaseName": world.lease},
        "rules": {"extraConfigMaps": [EXTRA_RULES]},
        "settings": {"kubernetes": {"domain": world.domain}},
    }
    path = world.tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return rendered_objects(require_helm(), "-f", str(path))


@pytest.fixture
def container_name() -> Iterator[str]:
    name = f"healer-image-test-{uuid.uuid4().hex[:6]}"
    yield name
    logs = podman("logs", name)
    print(f"--- the container's log, the end ---\n{(logs.stdout + logs.stderr)[-4000:]}")
    podman("rm", "--force", "--time=5", name)


def test_chart_deployment_runs_the_image_in_dry_run(
    world: World, healer_image: str, container_name: str
) -> None:
    hot_node = world.node_name(1)
    world.add_nodes(3, pool="h100")
    # The default pack has a GpuTooHot of its own: this one (hotter, held 2 s) takes another name.
    text = hot_gpu_rules("[quarantine, {drain: {timeout: 10m}}]").replace("GpuTooHot", "ImageTestGpuTooHot")
    rules = world.rules(text.replace("name: thermal", "name: image-test"), name="hot.yaml")
    scenario = f"faults: [{{at: 0s, node: {hot_node}, gpu: 3, fault: hot_gpu, target: 90, ramp: 1s}}]"
    with world.metrics(
        3, scenario, wait_for=f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{hot_node}"}} > 78'
    ) as metrics:
        objects = _rendered(world, healer_image, metrics.url)
        [deployment] = by_kind(objects, "Deployment").values()
        config_maps = by_kind(objects, "ConfigMap")

        # What the kubelet would mount: each ConfigMap volume, the emptyDirs (owned by the pod's
        # fsGroup), and the ServiceAccount's token, CA and namespace.
        files: dict[str, Path] = {}
        for volume in deployment["spec"]["template"]["spec"]["volumes"]:
            where = world.tmp_path / "volumes" / volume["name"]
            if "configMap" in volume:
                name = volume["configMap"]["name"]
                data = {"data": {rules.name: rules.read_text()}} if name == EXTRA_RULES else config_maps[name]
                files[volume["name"]] = write_config_map(data, where)
            else:
                assert "emptyDir" in volume, f"volume not run by this test: {volume}"
                where.mkdir(parents=True)
                os.chown(where, HEALER_UID, HEALER_UID)
                files[volume["name"]] = where
        account = write_config_map(
            {
                "data": {
                    "token": world.token,
                    "ca.crt": world.kube.ca_file.read_text(),
                    "namespace": HEALER_NAMESPACE,
                }
            },
            world.tmp_path / "serviceaccount",
        )
        port = free_port()
        values = {
            "HEALER_DATABASE__URL": "sqlite:////var/lib/healer/healer.db",  # the Secret's URL
            "HEALER_KUBERNETES__NAMESPACE": HEALER_NAMESPACE,  # metadata.namespace
            "HEALER_API__CSRF_SECRET": uuid.uuid4().hex,
        }
        in_cluster = {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": world.kube.url.rsplit(":", 1)[1],
        }

        def pod(container: str, name: str) -> list[str]:
            options = container_options(deployment, container, files=files, values=values)
            # The host network: the chart's port 8080 may be taken on this machine.
            options.env |= {**in_cluster, "HEALER_API__PORT": str(port)}
            options.options.append(f"--volume={account}:{SERVICE_ACCOUNT_DIR}:ro")
            return options.command(healer_image, name)

        # The init container first (`db upgrade` into the data emptyDir), as the kubelet runs it.
        migrate = podman(*pod("migrate", f"{container_name}-migrate"), timeout=120)
        assert migrate.returncode == 0, migrate.stderr
        waited = podman("wait", f"{container_name}-migrate", timeout=120).stdout.strip()
        logs = podman("logs", f"{container_name}-migrate")
        podman("rm", f"{container_name}-migrate")
        assert waited == "0", f"db upgrade exited {waited}:\n{logs.stdout}{logs.stderr}"

        start = time.monotonic()
        run = podman(*pod("healer", container_name))
        assert run.returncode == 0, run.stderr
        url = f"http://127.0.0.1:{port}"

        def answers(path: str) -> httpx.Response | None:
            state = podman("inspect", "--format", "{{.State.Status}}", container_name).stdout.strip()
            if state != "running":  # pytest.fail: not an Exception, wait_until does not retry it
                pytest.fail(f"the container is {state}")
            try:
                got = httpx.get(url + path, timeout=2)
            except httpx.TransportError:
                return None
            return got if got.status_code == 200 else None

        wait_until(lambda: answers("/healthz"), timeout=60, what="/healthz from the container")
        started = time.monotonic() - start
        print(f"healer run in the image: /healthz answered {started:.1f} s after podman run")

        def decided() -> list[dict[str, Any]] | None:
            got = answers(f"/api/v1/audit?status=dry_run&target={hot_node}")
            items = got.json()["items"] if got is not None else []
            return items or None

        decisions = wait_until(decided, timeout=60, what=f"a dry-run decision for {hot_node}")
        assert {"cordon"} <= {d["kind"] for d in decisions}, json.dumps(decisions, indent=1)
        ready = wait_until(lambda: answers("/readyz"), timeout=30, what="/readyz 200")
        assert ready.json()["ready"] is True
        metrics_text = httpx.get(url + "/metrics", timeout=5).text
        assert "healer_ticks_total" in metrics_text, metrics_text[:2000]
        assert world.node(hot_node)["spec"].get("unschedulable") is not True, "dry-run cordoned the node"

        # As the chart runs it: UID 10001, a read-only root filesystem, no compilers.
        assert podman("exec", container_name, "id", "-u").stdout.strip() == str(HEALER_UID)
        touched = podman("exec", container_name, "touch", "/opt/healer/written")
        assert touched.returncode != 0 and "Read-only file system" in touched.stderr, touched
        tools = podman("exec", container_name, "sh", "-c", "command -v gcc cc make g++ || true")
        assert tools.stdout.strip() == "", f"build tools in the runtime image: {tools.stdout}"
        # The image's own HEALTHCHECK command, as Docker would run it.
        check = json.loads(
            podman("image", "inspect", "--format", "{{json .Config.Healthcheck}}", healer_image).stdout
        )
        assert check["Test"][0] == "CMD"
        assert podman("exec", container_name, *check["Test"][1:]).returncode == 0

        stopped = podman("stop", "--time=20", container_name, timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        code = podman("inspect", "--format", "{{.State.ExitCode}}", container_name).stdout.strip()
        assert code == "0", f"healer run exited {code} on SIGTERM"
