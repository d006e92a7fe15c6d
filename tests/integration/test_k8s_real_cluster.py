"""healer's Kubernetes adapter on a real control plane (``tests/kube_cluster.py``).

kube-apiserver, etcd, kube-controller-manager (disruption, Deployment, ReplicaSet, namespace and
node lifecycle controllers), kube-scheduler, and KWOK nodes with 8 GPUs each. healer acts as its
ServiceAccount bound to the Helm chart's ClusterRole (``kube_healer_api``), never as admin, so a
verb missing from the ClusterRole fails here; the admin client only sets the scene and checks.
"""

from __future__ import annotations

import contextlib
import signal
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from healer.actions.kubernetes import KubernetesNodeActions
from healer.actions.lease import LeaderElector
from healer.config import KubernetesSettings
from healer.errors import KubernetesError, KubernetesNotFound
from healer.model.drain import DrainOptions, DrainReport
from healer.model.node import Ownership
from tests.helm import rendered_objects, require_helm
from tests.kube_cluster import ControlPlane
from tests.services import wait_until

REPO = Path(__file__).resolve().parents[2]
SETTINGS = KubernetesSettings(
    domain="healer.dev",
    namespace="healer-system",
    lease_duration_seconds=15,
    renew_interval_seconds=5,
    request_timeout_seconds=10,
)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def admin(kube_admin: ApiClient) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(kube_admin)


@pytest.fixture
def actions(kube_healer_api: ApiClient) -> KubernetesNodeActions:
    """healer's adapter, as its ServiceAccount."""
    return KubernetesNodeActions(kube_healer_api, SETTINGS, identity="healer-test")


@pytest.fixture
def namespace(admin: k8s.CoreV1Api) -> Iterator[str]:
    name = unique("real")
    admin.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    yield name
    admin.delete_namespace(name)


def drain(
    actions: KubernetesNodeActions, node: str, *, started_at: datetime, timeout: float = 600, **kw: Any
) -> DrainReport:
    """One drain step as a training-node rule asks for it (no grace, emptyDir scratch deleted)."""
    options = DrainOptions(
        timeout_seconds=timeout, grace_period_seconds=0, delete_emptydir_data=True, concurrency=5, **kw
    )
    return actions.drain_step(node, started_at=started_at, now=datetime.now(UTC), options=options)


def deployment_manifest(name: str, replicas: int, pod_spec: dict[str, Any]) -> dict[str, Any]:
    """A Deployment of ``replicas`` pods labelled ``app=<name>`` with ``pod_spec``."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def deployment(kube_admin: ApiClient, namespace: str, name: str, *, replicas: int, group: str) -> None:
    """A Deployment of pause pods (1 GPU each) on the nodes labelled ``healer-test/group=<group>``."""
    spec = {
        "nodeSelector": {"healer-test/group": group},
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "pause",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
            }
        ],
    }
    body = deployment_manifest(name, replicas, spec)
    k8s.AppsV1Api(kube_admin).create_namespaced_deployment(namespace, body)


def ready_pods(core: k8s.CoreV1Api, namespace: str, app: str) -> list[k8s.V1Pod]:
    pods = core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
    return [
        p
        for p in pods
        if p.metadata.deletion_timestamp is None
        and p.status.phase == "Running"
        and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    ]


def pdb(kube_admin: ApiClient, namespace: str, name: str, labels: dict[str, str], min_available: int) -> None:
    body = k8s.V1PodDisruptionBudget(
        metadata=k8s.V1ObjectMeta(name=name),
        spec=k8s.V1PodDisruptionBudgetSpec(
            selector=k8s.V1LabelSelector(match_labels=labels), min_available=min_available
        ),
    )
    k8s.PolicyV1Api(kube_admin).create_namespaced_pod_disruption_budget(namespace, body)


def budget_observed(kube_admin: ApiClient, namespace: str, name: str) -> bool:
    got = k8s.PolicyV1Api(kube_admin).read_namespaced_pod_disruption_budget(name, namespace)
    return bool(got.status and (got.status.observed_generation or 0) >= (got.metadata.generation or 0))


@contextlib.contextmanager
def controllers_paused(kube: ControlPlane) -> Iterator[None]:
    """kube-controller-manager stopped (SIGSTOP): no PDB status, no new pods, until the block ends."""
    process = kube.processes["controller-manager"]
    process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        process.send_signal(signal.SIGCONT)


# --- node writes as healer's ServiceAccount -----------------------------------------------------


def test_cordon_taint_condition_event_and_release(
    kube: ControlPlane, admin: k8s.CoreV1Api, actions: KubernetesNodeActions
) -> None:
    name = unique("gpu-quarantine")
    kube.add_nodes([name])
    at = datetime.now(UTC).replace(microsecond=0)  # a whole second: the Event still needs .000000
    actions.cordon(name, Ownership(incident_id=7, reason="GpuTooHot", at=at))
    actions.taint(name, value="GpuTooHot", effect="NoSchedule")
    actions.set_condition(name, healthy=False, reason="GpuTooHot", message="GPU 3 at 91 C", now=at)
    actions.event(name, reason="HealerQuarantined", message="GPU 3 at 91 C", now=at)

    node = admin.read_node(name)
    assert node.spec.unschedulable is True
    taints = {(t.key, t.value, t.effect) for t in node.spec.taints or []}
    assert ("healer.dev/quarantined", "GpuTooHot", "NoSchedule") in taints
    conditions = {c.type: c for c in node.status.conditions}
    assert conditions["GpuHealthy"].status == "False" and conditions["Ready"].status == "True"
    assert node.metadata.annotations["healer.dev/incident"] == "7"

    # What `kubectl describe node` shows: core/v1 Events in default selected by the Node.
    selector = f"involvedObject.kind=Node,involvedObject.name={name}"
    events = admin.list_namespaced_event("default", field_selector=selector).items
    ours = [e for e in events if e.reason == "HealerQuarantined"]
    assert len(ours) == 1 and ours[0].message == "GPU 3 at 91 C" and ours[0].type == "Warning"
    assert ours[0].metadata.name.startswith(f"{name}.")
    assert ours[0].reporting_component == "healer.dev/healer"

    actions.release(name, now=at + timedelta(minutes=5))
    node = admin.read_node(name)
    assert not node.spec.unschedulable
    assert "healer.dev/quarantined" not in {t.key for t in node.spec.taints or []}
    assert {c.type: c.status for c in node.status.conditions}["GpuHealthy"] == "True"
    assert "healer.dev/incident" not in (node.metadata.annotations or {})


def test_a_taint_value_that_is_not_a_label_value_is_refused(
    kube: ControlPlane, actions: KubernetesNodeActions
) -> None:
    """Why ``healer rules validate`` refuses such rule names: the API server answers 422."""
    name = unique("gpu-badtaint")
    kube.add_nodes([name])
    with pytest.raises(KubernetesError) as refused:
        actions.taint(name, value="gpu:xid", effect="NoSchedule")
    assert refused.value.status == 422


def test_a_deleted_node_is_not_found(
    kube: ControlPlane, admin: k8s.CoreV1Api, actions: KubernetesNodeActions
) -> None:
    name = unique("gpu-gone")
    kube.add_nodes([name])
    admin.delete_node(name)
    wait_until(lambda: name not in {n.metadata.name for n in admin.list_node().items}, what="node deleted")
    with pytest.raises(KubernetesNotFound):
        actions.read_node(name)
    with pytest.raises(KubernetesNotFound):
        actions.cordon(name, Ownership(incident_id=1, reason="x", at=datetime.now(UTC)))
    assert name not in actions.node_pools()


# --- drain: real Deployments, real budgets, the real disruption controller ------------------------


def test_drain_a_deployment_under_a_budget_waits_for_the_controller_then_completes(
    kube: ControlPlane, kube_admin: ApiClient, admin: k8s.CoreV1Api, actions: KubernetesNodeActions,
    namespace: str,
) -> None:  # fmt: skip
    group = unique("g")
    a, b = unique("gpu-a"), unique("gpu-b")
    kube.add_nodes([a], labels={"healer-test/group": group})
    deployment(kube_admin, namespace, "trainer", replicas=2, group=group)
    wait_until(lambda: len(ready_pods(admin, namespace, "trainer")) == 2, timeout=90, what="2 pods Ready")
    kube.add_nodes([b], labels={"healer-test/group": group})
    actions.cordon(a, Ownership(incident_id=1, reason="Xid79", at=datetime.now(UTC)))
    started = datetime.now(UTC)

    with controllers_paused(kube):
        pdb(kube_admin, namespace, "trainer", {"app": "trainer"}, min_available=1)
        # Not yet processed by the disruption controller: every eviction is 429 "still being processed".
        pod = ready_pods(admin, namespace, "trainer")[0]
        with pytest.raises(ApiException) as processing:
            k8s.CoreV1Api(kube_admin).create_namespaced_pod_eviction(
                pod.metadata.name, namespace,
                k8s.V1Eviction(metadata=k8s.V1ObjectMeta(name=pod.metadata.name, namespace=namespace)),
            )  # fmt: skip
        assert processing.value.status == 429
        assert "is still being processed by the server" in (processing.value.body or "")
        report = drain(actions, a, started_at=started)
        assert not report.done and not report.blocked and report.evicted == ()
        assert len(report.remaining) == 2

    wait_until(lambda: budget_observed(kube_admin, namespace, "trainer"), timeout=60, what="budget observed")
    evicted: set[str] = set()

    def drained() -> bool:
        report = drain(actions, a, started_at=started)
        evicted.update(report.evicted)
        assert not report.blocked and not report.errors, report
        return report.done

    wait_until(drained, timeout=120, interval=1.0, what=f"node {a} drained")
    assert len(evicted) == 2  # one at a time: the budget allowed one disruption per step
    pods = ready_pods(admin, namespace, "trainer")
    assert {p.spec.node_name for p in pods} == {b}  # the Deployment recreated them on the other node


def test_two_budgets_on_one_pod_block_the_drain_at_once(
    kube: ControlPlane, kube_admin: ApiClient, admin: k8s.CoreV1Api, actions: KubernetesNodeActions,
    namespace: str,
) -> None:  # fmt: skip
    group, name = unique("g"), unique("gpu-2pdb")
    kube.add_nodes([name], labels={"healer-test/group": group})
    deployment(kube_admin, namespace, "server", replicas=1, group=group)
    wait_until(lambda: ready_pods(admin, namespace, "server"), timeout=90, what="pod Ready")
    pdb(kube_admin, namespace, "by-app", {"app": "server"}, min_available=0)
    pdb(kube_admin, namespace, "by-app-too", {"app": "server"}, min_available=0)
    for budget in ("by-app", "by-app-too"):
        wait_until(lambda b=budget: budget_observed(kube_admin, namespace, b), timeout=60, what=budget)
    actions.cordon(name, Ownership(incident_id=2, reason="Xid79", at=datetime.now(UTC)))

    report = drain(actions, name, started_at=datetime.now(UTC), timeout=3600)  # deadline far away
    assert report.blocked and not report.done
    assert len(report.blocked_pods) == 1 and report.blocked_pods[0].startswith(f"{namespace}/server-")
    assert set(report.budgets) == {f"{namespace}/by-app", f"{namespace}/by-app-too"}


def test_rbac_denies_an_eviction_the_cluster_role_does_not_grant(
    kube: ControlPlane, kube_admin: ApiClient, admin: k8s.CoreV1Api, namespace: str
) -> None:
    """A ClusterRole like the chart's but without ``pods/eviction`` create: the drain fails, 403."""
    group, name = unique("g"), unique("gpu-rbac")
    kube.add_nodes([name], labels={"healer-test/group": group})
    deployment(kube_admin, namespace, "job", replicas=1, group=group)
    wait_until(lambda: ready_pods(admin, namespace, "job"), timeout=90, what="pod Ready")

    role = next(o for o in rendered_objects(require_helm()) if o["kind"] == "ClusterRole")
    role["metadata"]["name"] = "healer-no-evict"
    role["rules"] = [r for r in role["rules"] if r["resources"] != ["pods/eviction"]]
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "healer-no-evict"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "healer-no-evict",
        },
        "subjects": [{"kind": "ServiceAccount", "name": "healer-no-evict", "namespace": "healer-system"}],
    }
    kube.apply([role, binding])
    with kube.client(kube.service_account_token("healer-system", "healer-no-evict")) as api:
        crippled = KubernetesNodeActions(api, SETTINGS, identity="crippled")
        crippled.cordon(name, Ownership(incident_id=3, reason="Xid79", at=datetime.now(UTC)))
        started = datetime.now(UTC) - timedelta(hours=1)  # past the deadline: the step reports
        report = drain(crippled, name, started_at=started, timeout=60)
    assert report.evicted == () and report.blocked
    (message,) = report.errors.values()
    assert message.startswith("HTTP 403") and "pods/eviction" in message
    assert ready_pods(admin, namespace, "job")  # nothing was evicted


def test_eviction_in_a_terminating_namespace_is_403_namespace_terminating(
    kube: ControlPlane, kube_admin: ApiClient, admin: k8s.CoreV1Api
) -> None:
    name = unique("ending")
    admin.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    hold = k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="hold", finalizers=["healer.dev/test-hold"]))
    admin.create_namespaced_config_map(name, hold)
    admin.delete_namespace(name)
    try:
        wait_until(lambda: admin.read_namespace(name).status.phase == "Terminating", what="terminating")
        pod = k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name="late"),
            spec=k8s.V1PodSpec(
                containers=[k8s.V1Container(name="pause", image="registry.k8s.io/pause:3.10")]
            ),
        )
        with pytest.raises(ApiException) as refused:
            admin.create_namespaced_pod(name, pod)
        assert refused.value.status == 403
        assert "NamespaceTerminating" in (refused.value.body or "")
    finally:
        admin.patch_namespaced_config_map("hold", name, {"metadata": {"finalizers": None}})
    wait_until(lambda: name not in {n.metadata.name for n in admin.list_namespace().items}, timeout=60,
               what="namespace gone")  # fmt: skip


# --- leader election --------------------------------------------------------------------------


def test_lease_election_with_two_replicas(kube_healer_api: ApiClient, kube_admin: ApiClient) -> None:
    settings = SETTINGS.model_copy(update={"lease_name": unique("leader")})
    one = LeaderElector(kube_healer_api, settings, identity="healer-0")
    two = LeaderElector(kube_healer_api, settings, identity="healer-1")
    now = datetime.now(UTC).replace(microsecond=0)  # whole seconds: still sent as MicroTime
    assert one.try_acquire_or_renew(now) is True
    assert two.try_acquire_or_renew(now) is False and "healer-0" in two.why_not
    assert one.try_acquire_or_renew(now + timedelta(seconds=5)) is True
    lease = k8s.CoordinationV1Api(kube_admin).read_namespaced_lease(settings.lease_name, "healer-system")
    assert lease.spec.holder_identity == "healer-0"
    assert lease.spec.renew_time == now + timedelta(seconds=5)
    assert two.try_acquire_or_renew(now + timedelta(seconds=6)) is False  # sees the renewal at 6
    # The holder stops renewing; 15 s after the last change it saw, the other replica takes over.
    assert two.try_acquire_or_renew(now + timedelta(seconds=20)) is False
    assert two.try_acquire_or_renew(now + timedelta(seconds=21)) is True
    assert one.try_acquire_or_renew(now + timedelta(seconds=22)) is False
    two.release(now + timedelta(seconds=23))
    assert one.try_acquire_or_renew(now + timedelta(seconds=24)) is True
    lease = k8s.CoordinationV1Api(kube_admin).read_namespaced_lease(settings.lease_name, "healer-system")
    assert lease.spec.holder_identity == "healer-0"
    # healer-0 → healer-1, then healer-1 (released) → healer-0: client-go counts every acquisition by
    # a replica that was not leading, and the count is healer's fencing number.
    assert lease.spec.lease_transitions == 2
