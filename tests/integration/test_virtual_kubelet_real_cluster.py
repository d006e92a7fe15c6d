"""A virtual-kubelet node on the real control plane, beside KWOK GPU nodes (``tests/virtual_kubelet.py``):
it registers as virtual-kubelet does (label, taint, Lease), takes GPU pods that tolerate its taint
when the GPU nodes are full and runs them, gives them up to the Eviction API (a budget's 429
honoured), and never takes a pod that does not tolerate its taint."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from tests.integration.test_k8s_real_cluster import (
    admin,
    budget_observed,
    deployment_manifest,
    namespace,
    pdb,
    ready_pods,
    unique,
)
from tests.kube_cluster import ControlPlane
from tests.services import wait_until
from tests.virtual_kubelet import LABELS, TAINT, TOLERATION, VirtualKubelet

__all__ = ["admin", "namespace"]  # fixtures shared with test_k8s_real_cluster
GPUS = 16


@pytest.fixture(scope="module")
def vk_node_name() -> str:
    return unique("vk")


@pytest.fixture(scope="module")
def vk_node_gpus() -> int:
    return GPUS


@pytest.fixture
def gpu_group(kube: ControlPlane, admin: k8s.CoreV1Api) -> Iterator[str]:
    """Two KWOK nodes of 2 GPUs each, labelled ``healer-test/group=<the value yielded>``."""
    group = unique("g")
    names = [unique("gpu"), unique("gpu")]
    kube.add_nodes(names, gpus=2, labels={"healer-test/group": group})
    yield group
    for name in names:
        admin.delete_node(name)


def gpu_deployment(
    kube_admin: ApiClient, namespace: str, name: str, *,
    replicas: int, gpus: int, nodes: list[dict[str, Any]], tolerate: bool,
) -> None:  # fmt: skip
    """A Deployment of pause pods asking for ``gpus`` GPUs each, on a node matching any of the
    ``nodes`` selector terms; ``tolerate``: the pods tolerate the virtual-kubelet taint."""
    spec: dict[str, Any] = {
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": nodes}}
        },
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
            }
        ],
    }
    if tolerate:
        spec["tolerations"] = [TOLERATION]
    body = deployment_manifest(name, replicas, spec)
    k8s.AppsV1Api(kube_admin).create_namespaced_deployment(namespace, body)


def term(key: str, value: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}


def evict(kube_admin: ApiClient, namespace: str, pod: str) -> None:
    k8s.CoreV1Api(kube_admin).create_namespaced_pod_eviction(
        pod, namespace, k8s.V1Eviction(metadata=k8s.V1ObjectMeta(name=pod, namespace=namespace))
    )


def test_the_node_registers_with_its_label_taint_gpus_and_a_lease(
    vk_node: VirtualKubelet, admin: k8s.CoreV1Api, kube_admin: ApiClient
) -> None:
    node = admin.read_node(vk_node.name)
    assert {k: node.metadata.labels.get(k) for k in LABELS} == LABELS
    assert [(t.key, t.value, t.effect) for t in node.spec.taints or []] == [
        (TAINT["key"], TAINT["value"], TAINT["effect"])
    ]
    assert node.status.capacity["nvidia.com/gpu"] == str(GPUS)
    assert node.status.allocatable["nvidia.com/gpu"] == str(GPUS)
    assert {"cpu", "memory", "pods"} <= set(node.status.allocatable)
    assert {c.type: c.status for c in node.status.conditions}["Ready"] == "True"
    assert node.status.daemon_endpoints.kubelet_endpoint.port == vk_node.port
    lease = k8s.CoordinationV1Api(kube_admin).read_namespaced_lease(vk_node.name, "kube-node-lease")
    assert lease.spec.holder_identity == vk_node.name
    assert lease.spec.renew_time > datetime.now(UTC) - timedelta(seconds=lease.spec.lease_duration_seconds)


def test_gpu_pods_tolerating_the_taint_land_on_the_virtual_node_when_the_gpu_nodes_are_full(
    vk_node: VirtualKubelet, kube_admin: ApiClient, admin: k8s.CoreV1Api, namespace: str, gpu_group: str
) -> None:
    kwok = term("healer-test/group", gpu_group)
    virtual = term("kubernetes.io/hostname", vk_node.name)
    # The trainers fill the KWOK nodes' 4 GPUs; they do not tolerate the taint, so never go virtual.
    gpu_deployment(kube_admin, namespace, "train", replicas=2, gpus=2, nodes=[kwok, virtual], tolerate=False)
    wait_until(lambda: len(ready_pods(admin, namespace, "train")) == 2, timeout=60, what="trainers Running")
    gpu_deployment(kube_admin, namespace, "burst", replicas=3, gpus=2, nodes=[kwok, virtual], tolerate=True)
    wait_until(lambda: len(ready_pods(admin, namespace, "burst")) == 3, timeout=60, what="burst pods Running")

    kwok_nodes = {
        n.metadata.name for n in admin.list_node(label_selector=f"healer-test/group={gpu_group}").items
    }
    assert {p.spec.node_name for p in ready_pods(admin, namespace, "train")} <= kwok_nodes
    burst = ready_pods(admin, namespace, "burst")
    assert {p.spec.node_name for p in burst} == {vk_node.name}
    assert all(s.state.running for p in burst for s in p.status.container_statuses)
    # The API server reaches the node's kubelet API (the address and port it advertises) for logs.
    assert admin.read_namespaced_pod_log(burst[0].metadata.name, namespace) == ""


def test_an_eviction_removes_a_pod_from_the_virtual_node_and_a_budget_429_is_honoured(
    vk_node: VirtualKubelet, kube_admin: ApiClient, admin: k8s.CoreV1Api, namespace: str
) -> None:
    virtual = term("kubernetes.io/hostname", vk_node.name)
    gpu_deployment(kube_admin, namespace, "serve", replicas=2, gpus=1, nodes=[virtual], tolerate=True)
    wait_until(lambda: len(ready_pods(admin, namespace, "serve")) == 2, timeout=60, what="2 pods Running")
    pdb(kube_admin, namespace, "serve", {"app": "serve"}, min_available=2)
    wait_until(lambda: budget_observed(kube_admin, namespace, "serve"), timeout=30, what="budget observed")

    pod = ready_pods(admin, namespace, "serve")[0].metadata.name
    with pytest.raises(ApiException) as refused:
        evict(kube_admin, namespace, pod)
    assert refused.value.status == 429
    assert "disruption budget" in (refused.value.body or "")
    assert admin.read_namespaced_pod(pod, namespace).metadata.deletion_timestamp is None

    policy = k8s.PolicyV1Api(kube_admin)
    policy.patch_namespaced_pod_disruption_budget("serve", namespace, {"spec": {"minAvailable": 1}})

    def allowed() -> bool:
        got = policy.read_namespaced_pod_disruption_budget("serve", namespace)
        return bool(got.status and got.status.disruptions_allowed == 1)

    wait_until(allowed, timeout=30, what="one disruption allowed")
    evict(kube_admin, namespace, pod)

    def gone() -> bool:
        try:
            admin.read_namespaced_pod(pod, namespace)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_until(gone, timeout=30, interval=0.2, what=f"evicted pod {pod} deleted by the virtual node")
    # The Deployment replaces it, on the virtual node again.
    wait_until(
        lambda: len(ready_pods(admin, namespace, "serve")) == 2, timeout=60, what="replacement Running"
    )
    assert {p.spec.node_name for p in ready_pods(admin, namespace, "serve")} == {vk_node.name}


def test_a_pod_that_does_not_tolerate_the_taint_never_lands_on_the_virtual_node(
    vk_node: VirtualKubelet, admin: k8s.CoreV1Api, namespace: str
) -> None:
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="intolerant"),
        spec=k8s.V1PodSpec(
            node_selector={"kubernetes.io/hostname": vk_node.name},
            containers=[k8s.V1Container(name="main", image="registry.k8s.io/pause:3.10")],
        ),
    )
    admin.create_namespaced_pod(namespace, pod)

    def unschedulable() -> k8s.V1PodCondition | None:
        got = admin.read_namespaced_pod("intolerant", namespace)
        return next(
            (c for c in got.status.conditions or [] if c.type == "PodScheduled" and c.status == "False"), None
        )

    condition = wait_until(unschedulable, timeout=30, interval=0.2, what="the scheduler's verdict")
    assert condition.reason == "Unschedulable"
    # Every other node fails the node selector; the virtual one fails on its taint.
    assert "1 node(s) had untolerated taint(s)" in condition.message
    assert admin.read_namespaced_pod("intolerant", namespace).spec.node_name is None
