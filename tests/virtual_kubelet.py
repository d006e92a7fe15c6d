"""A virtual-kubelet node on the test control plane (``tests/kube_cluster.py``): the
virtual-kubelet library's node, lease and pod controllers with an in-memory provider that behaves
as upstream's mock provider does (``tests/kube/vk/main.go``, built by ``tests/kube/build-vk.sh``).

The node registers as virtual-kubelet registers its nodes: labels ``type=virtual-kubelet`` and
``kubernetes.io/role=agent``, the taint ``virtual-kubelet.io/provider=mock:NoSchedule``, Lease
heartbeats; a pod bound to it is Running and Ready at once, and a deleted (or evicted) pod is
terminated and removed from the API server by the node's pod controller. Its kubelet API listens on
a free loopback port (HTTPS, self-signed; no authentication, as virtual-kubelet's command without a
client CA), which the API server reaches for logs and the node proxy.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client as k8s

from healer.sources.local_server import stop_process
from tests.kube_cluster import REPO, REPORT, ControlPlane, die_with_parent, rss_mib
from tests.services import free_port, wait_until

BUILD_SCRIPT = REPO / "tests" / "kube" / "build-vk.sh"
BUILD_HINT = "bash tests/kube/build-vk.sh"
#: The taint virtual-kubelet's command puts on its node by default (key, value = provider, effect).
TAINT_KEY = "virtual-kubelet.io/provider"
TAINT = {"key": TAINT_KEY, "value": "mock", "effect": "NoSchedule"}
#: The labels virtual-kubelet's ``nodeutil`` gives its nodes.
LABELS = {"type": "virtual-kubelet", "kubernetes.io/role": "agent"}
#: A toleration of :data:`TAINT`, for pods meant to run on the virtual node.
TOLERATION = {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}


def find_binary() -> Path | None:
    """The ``vk`` binary as ``build-vk.sh`` caches it, or None when it is not built."""
    if not BUILD_SCRIPT.exists() or shutil.which("bash") is None:
        return None
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--dir"], capture_output=True, text=True, check=False
    ).stdout.strip()
    binary = Path(out) / "vk" if out else None
    return binary if binary is not None and binary.is_file() else None


@dataclass
class VirtualKubelet:
    """A running virtual node: its Node's ``name``, its ``nvidia.com/gpu`` capacity, its kubelet
    API ``port`` (HTTPS on 127.0.0.1), the process and its log file."""

    name: str
    gpus: int
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the process's log."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def _schedulable(core: k8s.CoreV1Api, name: str) -> bool:
    """The Node is Ready and the node lifecycle controller has lifted its not-ready taint."""
    node = json.loads(core.read_node(name, _preload_content=False).data)
    conditions = {c["type"]: c["status"] for c in node["status"].get("conditions") or []}
    taints = {t["key"] for t in node["spec"].get("taints") or []}
    return conditions.get("Ready") == "True" and "node.kubernetes.io/not-ready" not in taints


@contextlib.contextmanager
def virtual_kubelet(
    cp: ControlPlane,
    binary: Path,
    *,
    name: str,
    gpus: int = 16,
    cpu: str = "256",
    memory: str = "2Ti",
    pods: str = "110",
) -> Iterator[VirtualKubelet]:
    """Start ``binary`` registering Node ``name`` (capacity ``nvidia.com/gpu: gpus``, ``cpu``,
    ``memory``, ``pods``) on ``cp``; yield once the Node is Ready and schedulable (polled, at most
    60 s; raises RuntimeError with the process's log when it exits or does not get there). On exit
    stop it, delete the pods still bound to it (nothing is left to confirm their deletion), its
    Lease and its Node.

    It authenticates as cluster admin, as KWOK does.
    """
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="healer-vk-"))
    kubeconfig = cp.kubeconfig(cp.admin_token, workdir / "kubeconfig")
    port = free_port()
    log_path = workdir / "vk.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                str(binary),
                f"--kubeconfig={kubeconfig}",
                f"--nodename={name}",
                f"--listen=127.0.0.1:{port}",
                f"--gpus={gpus}",
                f"--cpu={cpu}",
                f"--memory={memory}",
                f"--pods={pods}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
    vk = VirtualKubelet(name=name, gpus=gpus, port=port, process=process, log=log_path)
    try:
        with cp.admin_client() as api:
            core = k8s.CoreV1Api(api)

            def up_or_exited() -> bool:
                return process.poll() is not None or _schedulable(core, name)

            try:
                wait_until(up_or_exited, timeout=60, interval=0.2, what=f"virtual-kubelet node {name} Ready")
            except TimeoutError as exc:
                raise RuntimeError(f"{exc}; virtual-kubelet's log ends with:\n{vk.log_tail()}") from exc
            if process.poll() is not None:
                raise RuntimeError(f"virtual-kubelet exited with {process.returncode}:\n{vk.log_tail()}")
            REPORT.append(
                f"virtual-kubelet node {name} ({binary.parent.name}) Ready in "
                f"{time.monotonic() - started:.1f} s; RSS {rss_mib(process.pid):.0f} MiB"
            )
        yield vk
    finally:
        stop_process(process, timeout=15)
        with cp.admin_client() as api:
            core = k8s.CoreV1Api(api)
            bound = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items
            for pod in bound:
                with contextlib.suppress(k8s.ApiException):
                    core.delete_namespaced_pod(
                        pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0
                    )
            with contextlib.suppress(k8s.ApiException):
                k8s.CoordinationV1Api(api).delete_namespaced_lease(name, "kube-node-lease")
            with contextlib.suppress(k8s.ApiException):
                core.delete_node(name)
        shutil.rmtree(workdir, ignore_errors=True)
