"""A drain reads its pods and PodDisruptionBudgets from watches, on the real control plane.

healer's ServiceAccount (the chart's ClusterRole, so a missing ``watch`` verb fails here) reaches
the API server through the loopback proxy that counts requests (tests/kube_proxy.py). A user sees:
a node of three pods behind a ``maxUnavailable: 1`` budget drains completely, the budget is never
exceeded, and each drain step makes one field-selected LIST of pods (the step's closing read of what
is left) and no LIST of budgets; without the watched stores the same drain lists pods twice and the
budgets once per step.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client import ApiClient

from healer.actions.kubernetes import KubernetesNodeActions
from healer.actions.pod_watch import BudgetWatch, PodWatch
from healer.config import KubernetesSettings
from healer.model.drain import DrainOptions
from healer.model.node import Ownership
from tests.integration.test_k8s_real_cluster import admin, namespace
from tests.kube_cluster import ControlPlane
from tests.kube_proxy import ApiProxy, api_proxy
from tests.services import wait_until

__all__ = ["admin", "namespace"]  # fixtures shared with test_k8s_real_cluster
PODS = "/api/v1/pods"
REPLICAS = 3


@pytest.fixture
def proxy(kube: ControlPlane) -> Iterator[ApiProxy]:
    with api_proxy(kube.url, kube.ca_file) as running:
        yield running


@pytest.fixture
def healer_via_proxy(proxy: ApiProxy, kube_healer_token: str) -> ApiClient:
    configuration = k8s.Configuration()
    configuration.host = proxy.url
    configuration.api_key = {"authorization": f"Bearer {kube_healer_token}"}
    return ApiClient(configuration)


def _serving(kube_admin: ApiClient, namespace: str, pool: str) -> None:
    """``REPLICAS`` pods of a Deployment on the nodes of ``pool``, behind ``maxUnavailable: 1``."""
    labels = {"app": "serve"}
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "serve"},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"pool": pool},
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                },
            },
        },
    }
    k8s.AppsV1Api(kube_admin).create_namespaced_deployment(namespace, deployment)
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "serve"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}},
    }
    k8s.PolicyV1Api(kube_admin).create_namespaced_pod_disruption_budget(namespace, budget)


def _running_on(core: k8s.CoreV1Api, namespace: str, node: str) -> int:
    pods = core.list_namespaced_pod(namespace, field_selector=f"spec.nodeName={node}").items
    return sum(1 for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None)


def _drain_until_done(
    actions: KubernetesNodeActions, proxy: ApiProxy, node: str, namespace: str
) -> tuple[list[int], list[int], set[str]]:
    """Drain steps until done: (pod LISTs per step, budget LISTs per step, pods evicted)."""
    budgets = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
    pod_lists: list[int] = []
    budget_lists: list[int] = []
    evicted: set[str] = set()
    started = datetime.now(UTC)
    options = DrainOptions(timeout_seconds=300, grace_period_seconds=0, budget_wait_seconds=20)
    for _ in range(10):
        pods_before, budgets_before = proxy.lists(PODS), proxy.lists(budgets)
        report = actions.drain_step(node, started_at=started, now=datetime.now(UTC), options=options)
        pod_lists.append(proxy.lists(PODS) - pods_before)
        budget_lists.append(proxy.lists(budgets) - budgets_before)
        evicted |= set(report.evicted)
        assert not report.errors and not report.refused and not report.blocked, report
        if report.done:
            return pod_lists, budget_lists, evicted
    raise AssertionError(f"the drain of {node} did not finish in 10 steps: {pod_lists}")


def _scene(kube: ControlPlane, kube_admin: ApiClient, namespace: str) -> tuple[str, str]:
    """Node ``a`` running the three pods, node ``b`` of the same pool free for their replacements."""
    pool = f"p-{uuid.uuid4().hex[:6]}"
    a, b = f"{pool}-a", f"{pool}-b"
    core = k8s.CoreV1Api(kube_admin)
    kube.add_nodes([a], gpus=0, labels={"pool": pool})
    _serving(kube_admin, namespace, pool)
    wait_until(lambda: _running_on(core, namespace, a) == REPLICAS, timeout=60, what="three pods on a")
    kube.add_nodes([b], gpus=0, labels={"pool": pool})
    return a, b


@pytest.mark.parametrize("watched", [True, False], ids=["watched", "listed"])
def test_a_drain_reads_pods_and_budgets_from_the_watches(
    kube: ControlPlane,
    kube_admin: ApiClient,
    namespace: str,
    proxy: ApiProxy,
    healer_via_proxy: ApiClient,
    watched: bool,
) -> None:
    a, b = _scene(kube, kube_admin, namespace)
    pods, budgets = PodWatch(healer_via_proxy, timeout=10), BudgetWatch(healer_via_proxy, timeout=10)
    settings = KubernetesSettings(domain="healer.dev", request_timeout_seconds=10)
    actions = KubernetesNodeActions(
        healer_via_proxy,
        settings,
        identity="healer-test",
        pod_watch=pods if watched else None,
        budget_watch=budgets if watched else None,
    )
    actions.cordon(a, Ownership(incident_id=7, reason="GpuFatalXid", at=datetime.now(UTC)))
    if watched:
        pods.start()
        budgets.start()
    try:
        if watched:
            wait_until(lambda: len(pods.on_node(a) or []) == REPLICAS, timeout=30, what="the pods watched")
            wait_until(lambda: budgets.in_namespace(namespace), timeout=30, what="the budget watched")
        pod_lists, budget_lists, evicted = _drain_until_done(actions, proxy, a, namespace)
    finally:
        pods.stop()
        budgets.stop()
    core = k8s.CoreV1Api(kube_admin)
    assert len(evicted) == REPLICAS
    assert _running_on(core, namespace, a) == 0
    wait_until(lambda: _running_on(core, namespace, b) == REPLICAS, timeout=60, what="replacements on b")
    if watched:
        assert pod_lists == [1] * len(pod_lists), pod_lists  # only each step's closing read
        assert sum(budget_lists) == 0, budget_lists
        assert pods.lists == 1 and budgets.lists == 1  # one list each, then the watch
    else:
        assert pod_lists == [2] * len(pod_lists), pod_lists
        assert budget_lists == [1] * len(budget_lists), budget_lists
