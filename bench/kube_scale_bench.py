"""Scale: healer's Kubernetes adapter on a real control plane with thousands of KWOK nodes.

Starts the test control plane (``tests/kube_cluster.py``: kube-apiserver, etcd,
kube-controller-manager, kube-scheduler, KWOK), creates ``--nodes`` KWOK nodes with 8 GPUs each
(``nvidia.com/gpu``), a training Deployment of ``--pods`` one-GPU pods behind a PodDisruptionBudget
(``maxUnavailable: 10%``), and then, as healer's ServiceAccount, one remediation pass over
``--bad`` nodes: the fleet list that sizes the budgets, then per bad node cordon, taint, condition,
Event and one drain step. Prints API calls, wall time and the benchmark process's peak RSS (the
process is healer's adapter; the control plane runs as separate processes, whose RSS is printed
too). Needs ``bash tests/kube/build.sh`` first.

    python bench/kube_scale_bench.py                       # 2,000 nodes, 1,000 pods, 20 bad nodes
    python bench/kube_scale_bench.py --nodes 200 --pods 100 --bad 5   # quick look
"""

from __future__ import annotations

import argparse
import resource
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import client as k8s

from healer.actions.kubernetes import KubernetesNodeActions
from healer.config import KubernetesSettings
from healer.model.drain import DrainOptions
from healer.model.node import Ownership
from tests.helm import NAMESPACE, rendered_objects, require_helm
from tests.kube_cluster import BUILD_HINT, ControlPlane, control_plane, find_binaries
from tests.services import wait_until

REPO = Path(__file__).resolve().parents[1]


def counting(api: k8s.ApiClient, calls: Counter[str]) -> k8s.ApiClient:
    """Count every HTTP request ``api`` sends, by method (from any thread)."""
    original = api.call_api
    lock = threading.Lock()

    def call_api(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        with lock:
            calls[method] += 1
        return original(method, url, *args, **kwargs)

    api.call_api = call_api  # type: ignore[method-assign]
    return api


def add_fleet(cp: ControlPlane, names: list[str], batch: int = 500) -> None:
    """Create KWOK nodes ``names`` with 8 GPUs each, ``batch`` at a time (each batch's POSTs in
    parallel, then waited for until Ready and schedulable), labelled ``pool: pool-<i // 500>``."""
    started = time.monotonic()
    for i in range(0, len(names), batch):
        cp.add_nodes(names[i : i + batch], gpus=8, labels={"pool": f"pool-{i // 500}"})
    print(f"{len(names)} KWOK nodes Ready in {time.monotonic() - started:.0f} s")


def healer_token(cp: ControlPlane) -> str:
    """A token of healer's ServiceAccount bound to the Helm chart's RBAC (only the chart's
    ServiceAccount and RBAC objects are applied), as ``tests/conftest.py``'s ``kube_healer_token``."""
    rbac = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    cp.apply([namespace, *(o for o in rendered_objects(require_helm()) if o["kind"] in rbac)])
    return cp.service_account_token(NAMESPACE, "healer")


def set_scene(cp: ControlPlane, nodes: int, pods: int) -> list[str]:
    names = [f"gpu-node-{i:04d}" for i in range(nodes)]
    add_fleet(cp, names)
    with cp.admin_client() as api:
        core = k8s.CoreV1Api(api)
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name="training")))
        labels = {"app": "trainer"}
        container = {"name": "pause", "image": "registry.k8s.io/pause:3.10",
                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}  # fmt: skip
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "trainer"},
            "spec": {
                "replicas": pods,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"terminationGracePeriodSeconds": 0, "containers": [container]},
                },
            },
        }
        k8s.AppsV1Api(api).create_namespaced_deployment("training", deployment)
        pdb = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "trainer"},
            "spec": {"selector": {"matchLabels": labels}, "maxUnavailable": "10%"},
        }
        k8s.PolicyV1Api(api).create_namespaced_pod_disruption_budget("training", pdb)
        started = time.monotonic()

        def running() -> bool:
            got = core.list_namespaced_pod("training", field_selector="status.phase=Running").items
            return len(got) >= pods

        wait_until(running, timeout=1800, interval=2.0, what=f"{pods} pods Running")
        print(f"{pods} pods Running in {time.monotonic() - started:.0f} s; " + budget_status(cp))
        on = Counter(p.spec.node_name for p in core.list_namespaced_pod("training").items)
    # The bad nodes: those holding pods, so the drain has something to do.
    return [n for n in names if on.get(n)]


def budget_status(cp: ControlPlane) -> str:
    """The trainer budget's status as the disruption controller last wrote it, and the pods' readiness."""
    with cp.admin_client() as api:
        pdb = k8s.PolicyV1Api(api).read_namespaced_pod_disruption_budget("trainer", "training")
        pods = k8s.CoreV1Api(api).list_namespaced_pod("training").items
        nodes = k8s.CoreV1Api(api).list_node().items
    not_ready = {
        n.metadata.name
        for n in nodes
        if not any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
    }
    on_not_ready = sum(1 for p in pods if p.spec.node_name in not_ready)
    st = pdb.status
    ready = sum(
        1 for p in pods if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    )
    return (
        f"budget: allowed {st.disruptions_allowed}, healthy {st.current_healthy}/{st.desired_healthy}, "
        f"expected {st.expected_pods}, "
        f"observedGeneration {st.observed_generation}/{pdb.metadata.generation}; "
        f"pods {len(pods)}, Ready {ready}; nodes not Ready {len(not_ready)} of {len(nodes)}, "
        f"holding {on_not_ready} pods"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--bad", type=int, default=20)
    parser.add_argument(
        "--node-grace-seconds",
        type=int,
        default=600,
        help="kube-controller-manager --node-monitor-grace-period, s (0: its default, 50 s); bench/README.md",
    )
    args = parser.parse_args(argv)
    bindir = find_binaries()
    if bindir is None:
        print(f"no Kubernetes control plane built: run `{BUILD_HINT}` first", file=sys.stderr)
        return 2
    settings = KubernetesSettings(domain="healer.dev", namespace="healer-system", request_timeout_seconds=30)
    with control_plane(bindir, node_grace_seconds=args.node_grace_seconds or None) as cp:
        candidates = set_scene(cp, args.nodes, args.pods)
        token = healer_token(cp)
        calls: Counter[str] = Counter()
        with cp.client(token) as api:
            actions = KubernetesNodeActions(counting(api, calls), settings, identity="bench")
            bad = candidates[: args.bad]
            print("before the pass: " + budget_status(cp))
            rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            started = time.monotonic()
            pools = actions.node_pools()
            listed = time.monotonic() - started
            evicted = held = 0
            options = DrainOptions(
                timeout_seconds=600, grace_period_seconds=0, delete_emptydir_data=True, concurrency=5
            )
            budgets: set[str] = set()
            for name in bad:
                now = datetime.now(UTC)
                actions.cordon(name, Ownership(incident_id=1, reason="Xid79", at=now))
                actions.taint(name, value="GpuFatalXid", effect="NoSchedule")
                actions.set_condition(name, healthy=False, reason="GpuFatalXid", message="Xid 79", now=now)
                actions.event(name, reason="HealerQuarantined", message="Xid 79 on GPU 3", now=now)
                report = actions.drain_step(name, started_at=now, now=now, options=options)
                if report.errors or report.refused or not report.evicted:
                    print(
                        f"{name}: evicted {report.evicted}, remaining {report.remaining}, "
                        f"budgets {report.budgets}, errors {report.errors}, refused {report.refused}"
                    )
                evicted += len(report.evicted)
                held += len(set(report.remaining) - set(report.evicted))
                budgets.update(report.budgets)
            wall = time.monotonic() - started
        print("after the pass: " + budget_status(cp))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        memory = cp.memory_mib()
        print(f"fleet: {len(pools)} nodes listed in {listed:.2f} s (one call)")
        total = sum(calls.values())
        print(f"pass over {len(bad)} bad nodes: {wall:.1f} s wall, {total} API calls {dict(calls)}")
        print(f"pods evicted by the pass: {evicted}; still on the nodes: {held} (budgets {sorted(budgets)})")
        print(f"bench process peak RSS: {peak:.0f} MiB (before the pass {rss_before:.0f} MiB)")
        print("control plane RSS MiB: " + ", ".join(f"{k} {v:.0f}" for k, v in memory.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
