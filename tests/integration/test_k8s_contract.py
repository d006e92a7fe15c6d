"""Contract tests: the Kubernetes API behaviours healer relies on.

Each runs twice: against the emulator (``healer_dev.k8s_emulator``), which is what makes the
emulator trustworthy, and against a real control plane (``tests/kube_cluster.py``: kube-apiserver,
etcd, kube-controller-manager, kube-scheduler, KWOK nodes). With ``HEALER_TEST_KUBECONFIG`` set
(and optionally ``HEALER_TEST_CONTEXT``) the second runs against that cluster instead: they create their own
namespace and objects there and delete them afterwards. Tests that change a Node (cordon, taints,
conditions) run on a real cluster only when ``HEALER_TEST_NODE`` names a node dedicated to tests;
they restore it afterwards.

Pods use ``registry.k8s.io/pause:3.9`` with a zero grace period so a real cluster runs them fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from healer.actions.timestamps import micro_time
from healer_dev.k8s_emulator import KubernetesEmulator, node
from tests.kube_cluster import ControlPlane

pytestmark = pytest.mark.k8s_contract

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
T = TypeVar("T")


@dataclass
class Cluster:
    """Where the contract runs: ``node`` is a Node the test may change (None = skip those)."""

    api: ApiClient
    namespace: str
    real: bool
    node: str | None

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    @property
    def policy(self) -> k8s.PolicyV1Api:
        return k8s.PolicyV1Api(self.api)

    def wait(self, what: str, predicate: Callable[[], T | None], timeout: float = 120.0) -> T:
        """Poll until ``predicate`` is truthy (instant on the emulator; controllers lag on a cluster)."""
        deadline = time.monotonic() + timeout
        while True:
            result = predicate()
            if result:
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}")
            time.sleep(0.5)

    def need_node(self) -> str:
        if self.node is None:
            pytest.skip("set HEALER_TEST_NODE to a node dedicated to tests to run Node-changing contracts")
        return self.node

    def create_pod(self, name: str, labels: dict[str, str]) -> k8s.V1Pod:
        body = k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name=name, labels=labels),
            spec=k8s.V1PodSpec(
                containers=[k8s.V1Container(name="pause", image="registry.k8s.io/pause:3.9")],
                termination_grace_period_seconds=0,
            ),
        )
        self.core.create_namespaced_pod(self.namespace, body)

        def running() -> k8s.V1Pod | None:
            p = self.core.read_namespaced_pod(name, self.namespace)
            ready = any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
            return p if p.spec.node_name and p.status.phase == "Running" and ready else None

        return self.wait(f"pod {name} running", running)

    def create_pdb(self, name: str, labels: dict[str, str], min_available: int) -> None:
        body = k8s.V1PodDisruptionBudget(
            metadata=k8s.V1ObjectMeta(name=name),
            spec=k8s.V1PodDisruptionBudgetSpec(
                selector=k8s.V1LabelSelector(match_labels=labels), min_available=min_available
            ),
        )
        self.policy.create_namespaced_pod_disruption_budget(self.namespace, body)

    def wait_budget_observed(self, name: str) -> None:
        def observed() -> bool:
            pdb = self.policy.read_namespaced_pod_disruption_budget(name, self.namespace)
            status = pdb.status
            return bool(
                status is not None
                and (status.observed_generation or 0) >= (pdb.metadata.generation or 0)
                and status.expected_pods is not None
            )

        self.wait(f"budget {name} observed by the disruption controller", observed)

    def evict(self, name: str, uid: str | None = None) -> None:
        options = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=uid)) if uid else None
        self.core.create_namespaced_pod_eviction(
            name,
            self.namespace,
            k8s.V1Eviction(
                metadata=k8s.V1ObjectMeta(name=name, namespace=self.namespace), delete_options=options
            ),
        )


CONTRACT_NODES = ("contract-node", "contract-other")


@pytest.fixture(params=["emulator", "kube"])
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The contract's cluster: the emulator, and the real control plane (``tests/kube_cluster.py``),
    or the cluster ``HEALER_TEST_KUBECONFIG`` names instead of the latter."""
    kubeconfig = os.environ.get("HEALER_TEST_KUBECONFIG")
    ns = f"healer-contract-{uuid.uuid4().hex[:8]}"
    ns_body = k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=ns))
    if request.param == "kube" and kubeconfig:
        api = k8s_config.new_client_from_config(
            config_file=kubeconfig, context=os.environ.get("HEALER_TEST_CONTEXT"), persist_config=False
        )
        with api:
            k8s.CoreV1Api(api).create_namespace(ns_body)
            try:
                yield Cluster(api=api, namespace=ns, real=True, node=os.environ.get("HEALER_TEST_NODE"))
            finally:
                k8s.CoreV1Api(api).delete_namespace(ns)
        return
    if request.param == "kube":
        plane: ControlPlane = request.getfixturevalue("kube")
        with plane.admin_client() as api:
            core = k8s.CoreV1Api(api)
            existing = {n.metadata.name for n in core.list_node().items}
            missing = [n for n in CONTRACT_NODES if n not in existing]
            if missing:
                plane.add_nodes(missing)
            core.create_namespace(ns_body)
            try:
                yield Cluster(api=api, namespace=ns, real=True, node=CONTRACT_NODES[0])
            finally:
                core.delete_namespace(ns)
        return
    with KubernetesEmulator() as emu:
        emu.load([node(n) for n in CONTRACT_NODES])
        with emu.api_client() as api:
            k8s.CoreV1Api(api).create_namespace(ns_body)
            yield Cluster(api=api, namespace=ns, real=False, node=CONTRACT_NODES[0])


def status_body(exc: ApiException) -> dict[str, Any]:
    body = json.loads(exc.body or "{}")
    assert body["kind"] == "Status"
    return dict(body)


# --- Nodes ---------------------------------------------------------------------------------------


def test_cordon_by_strategic_merge_reads_back(cluster: Cluster) -> None:
    name = cluster.need_node()
    before = cluster.core.read_node(name)
    try:
        cluster.core.patch_node(name, {"spec": {"unschedulable": True}}, _content_type=STRATEGIC)
        assert cluster.core.read_node(name).spec.unschedulable is True
    finally:
        cluster.core.patch_node(
            name, {"spec": {"unschedulable": before.spec.unschedulable or None}}, _content_type=STRATEGIC
        )
    assert bool(cluster.core.read_node(name).spec.unschedulable) == bool(before.spec.unschedulable)


def test_taints_are_an_atomic_list_guarded_by_resource_version(cluster: Cluster) -> None:
    """``spec.taints`` has no merge key: send the whole list (others kept) with resourceVersion."""
    name = cluster.need_node()
    key = "healer.dev/contract"
    current = cluster.core.read_node(name)
    others = [{"key": t.key, "value": t.value, "effect": t.effect} for t in current.spec.taints or []]
    others = [{k: v for k, v in t.items() if v} for t in others if t["key"] != key]
    mine = {"key": key, "value": "x", "effect": "PreferNoSchedule"}
    try:
        rv = current.metadata.resource_version
        cluster.core.patch_node(
            name,
            {"metadata": {"resourceVersion": rv}, "spec": {"taints": [*others, mine]}},
            _content_type=STRATEGIC,
        )
        after = cluster.core.read_node(name)
        got = {(t.key, t.value or "", t.effect) for t in after.spec.taints or []}
        assert (key, "x", "PreferNoSchedule") in got
        assert {(t["key"], t.get("value", ""), t["effect"]) for t in others} <= got
        assert after.metadata.resource_version != rv

        with pytest.raises(ApiException) as stale:
            cluster.core.patch_node(
                name,
                {"metadata": {"resourceVersion": rv}, "spec": {"taints": others}},
                _content_type=STRATEGIC,
            )
        assert stale.value.status == 409
        assert status_body(stale.value)["reason"] == "Conflict"
    finally:
        latest = cluster.core.read_node(name)
        remaining = [
            {k: v for k, v in {"key": t.key, "value": t.value, "effect": t.effect}.items() if v}
            for t in latest.spec.taints or []
            if t.key != key
        ]
        cluster.core.patch_node(name, {"spec": {"taints": remaining or None}}, _content_type=STRATEGIC)


def test_conditions_live_on_the_status_subresource_and_merge_by_type(cluster: Cluster) -> None:
    name = cluster.need_node()
    ctype = "HealerContractTest"
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {
        "type": ctype,
        "status": "False",
        "reason": "Contract",
        "message": "set by healer's contract tests",
        "lastTransitionTime": stamp,
        "lastHeartbeatTime": stamp,
    }
    try:
        cluster.core.patch_node_status(name, {"status": {"conditions": [condition]}}, _content_type=STRATEGIC)
        conds = {c.type: c for c in cluster.core.read_node(name).status.conditions}
        assert conds[ctype].status == "False" and conds[ctype].reason == "Contract"
        assert "Ready" in conds  # merged by type: the kubelet's conditions stay

        # Status written through the main resource is ignored for Nodes.
        flipped = {**condition, "status": "True"}
        cluster.core.patch_node(name, {"status": {"conditions": [flipped]}}, _content_type=STRATEGIC)
        conds = {c.type: c for c in cluster.core.read_node(name).status.conditions}
        assert conds[ctype].status == "False"
    finally:
        cluster.core.patch_node_status(
            name, {"status": {"conditions": [{"type": ctype, "$patch": "delete"}]}}, _content_type=STRATEGIC
        )
    assert ctype not in {c.type for c in cluster.core.read_node(name).status.conditions}


def test_annotations_by_merge_patch_and_json_patch(cluster: Cluster) -> None:
    name = cluster.need_node()
    a, b = "healer.dev/contract-a", "healer.dev/contract-b"
    try:
        cluster.core.patch_node(name, {"metadata": {"annotations": {a: "1"}}}, _content_type=MERGE)
        path = "/metadata/annotations/" + b.replace("~", "~0").replace("/", "~1")
        cluster.core.patch_node(name, [{"op": "add", "path": path, "value": "2"}], _content_type=JSON_PATCH)
        ann = cluster.core.read_node(name).metadata.annotations
        assert (ann[a], ann[b]) == ("1", "2")
    finally:
        cluster.core.patch_node(name, {"metadata": {"annotations": {a: None, b: None}}}, _content_type=MERGE)
    ann = cluster.core.read_node(name).metadata.annotations or {}
    assert a not in ann and b not in ann


# --- Pods and eviction ---------------------------------------------------------------------------


def test_field_selector_lists_only_the_nodes_pods(cluster: Cluster) -> None:
    p = cluster.create_pod("selected", {"app": "selected"})
    where = p.spec.node_name
    listed = cluster.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={where}").items
    assert f"{cluster.namespace}/selected" in {f"{x.metadata.namespace}/{x.metadata.name}" for x in listed}
    assert {x.spec.node_name for x in listed} == {where}
    none = cluster.core.list_pod_for_all_namespaces(field_selector="spec.nodeName=no-such-node-healer")
    assert none.items == []


def test_a_field_selector_the_resource_does_not_register_is_400(cluster: Cluster) -> None:
    with pytest.raises(ApiException) as refused:
        cluster.core.list_pod_for_all_namespaces(field_selector="spec.priorityClassName=high")
    assert refused.value.status == 400
    assert status_body(refused.value)["reason"] == "BadRequest"
    assert "field label not supported: spec.priorityClassName" in status_body(refused.value)["message"]


def test_eviction_is_refused_with_429_while_a_budget_allows_nothing(cluster: Cluster) -> None:
    p = cluster.create_pod("guarded", {"app": "guarded"})
    cluster.create_pdb("guarded", {"app": "guarded"}, min_available=1)
    cluster.wait_budget_observed("guarded")

    with pytest.raises(ApiException) as refused:
        cluster.evict("guarded")
    assert refused.value.status == 429
    body = status_body(refused.value)
    assert body["reason"] == "TooManyRequests"
    assert [c["reason"] for c in body["details"]["causes"]] == ["DisruptionBudget"]
    assert cluster.core.read_namespaced_pod("guarded", cluster.namespace).metadata.uid == p.metadata.uid

    cluster.policy.delete_namespaced_pod_disruption_budget("guarded", cluster.namespace)
    cluster.evict("guarded")  # no budget: accepted

    def gone_or_terminating() -> bool:
        try:
            got = cluster.core.read_namespaced_pod("guarded", cluster.namespace)
        except ApiException as exc:
            return exc.status == 404
        return got.metadata.deletion_timestamp is not None

    cluster.wait("evicted pod gone or terminating", gone_or_terminating)


def test_eviction_of_a_missing_pod_is_404_and_a_stale_uid_is_409(cluster: Cluster) -> None:
    with pytest.raises(ApiException) as missing:
        cluster.evict("no-such-pod")
    assert missing.value.status == 404
    assert status_body(missing.value)["reason"] == "NotFound"

    cluster.create_pod("renamed", {"app": "renamed"})
    with pytest.raises(ApiException) as stale:
        cluster.evict("renamed", uid=str(uuid.uuid4()))
    assert stale.value.status == 409
    assert cluster.core.read_namespaced_pod("renamed", cluster.namespace).metadata.deletion_timestamp is None


def test_eviction_with_several_budgets_is_a_500(cluster: Cluster) -> None:
    cluster.create_pod("doubly", {"app": "doubly", "tier": "front"})
    cluster.create_pdb("by-app", {"app": "doubly"}, min_available=0)
    cluster.create_pdb("by-tier", {"tier": "front"}, min_available=0)
    cluster.wait_budget_observed("by-app")
    cluster.wait_budget_observed("by-tier")
    with pytest.raises(ApiException) as failed:
        cluster.evict("doubly")
    assert failed.value.status == 500
    assert "more than one PodDisruptionBudget" in status_body(failed.value)["message"]


# --- Leases ------------------------------------------------------------------------------------


def test_lease_create_conflicts_and_stale_resource_version(cluster: Cluster) -> None:
    api = k8s.CoordinationV1Api(cluster.api)
    now = datetime.now(UTC)
    body = k8s.V1Lease(
        metadata=k8s.V1ObjectMeta(name="contract"),
        spec=k8s.V1LeaseSpec(
            holder_identity="a", lease_duration_seconds=15, acquire_time=now, renew_time=now
        ),
    )
    created = api.create_namespaced_lease(cluster.namespace, body)
    with pytest.raises(ApiException) as exists:
        api.create_namespaced_lease(cluster.namespace, body)
    assert exists.value.status == 409
    assert status_body(exists.value)["reason"] == "AlreadyExists"

    created.spec.holder_identity = "b"
    renewed = api.replace_namespaced_lease("contract", cluster.namespace, created)
    assert renewed.spec.holder_identity == "b"
    assert renewed.metadata.resource_version != created.metadata.resource_version

    created.spec.holder_identity = "c"  # still carries the old resourceVersion
    with pytest.raises(ApiException) as stale:
        api.replace_namespaced_lease("contract", cluster.namespace, created)
    assert stale.value.status == 409
    assert status_body(stale.value)["reason"] == "Conflict"
    assert api.read_namespaced_lease("contract", cluster.namespace).spec.holder_identity == "b"


# --- Events ------------------------------------------------------------------------------------


def new_event(meta: dict[str, Any], node: str, event_time: datetime, **fields: Any) -> dict[str, Any]:
    """An events.k8s.io/v1 Event; ``eventTime`` goes out with six fractional digits only as a
    :func:`micro_time` (the client writes a plain ``datetime`` with ``isoformat()``)."""
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": meta,
        "eventTime": event_time,
        "reason": "HealerContract",
        "note": "events.k8s.io/v1 event from healer's contract tests",
        "type": "Warning",
        "action": "Contract",
        "reportingController": "healer.dev/healer",
        "reportingInstance": "contract",
        "regarding": {"apiVersion": "v1", "kind": "Node", "name": node},
        **fields,
    }


def test_events_on_a_node_in_both_apis(cluster: Cluster) -> None:
    """Node Events live in ``default`` under explicit ``<node>.<hex>`` names (client-go's recorder
    and kubectl name them so); ``kubectl describe node`` finds both APIs' by field selector."""
    name = CONTRACT_NODES[0]
    uid = cluster.core.read_node(name).metadata.uid
    node_ref = k8s.V1ObjectReference(api_version="v1", kind="Node", name=name, uid=uid)
    now = datetime.now(UTC).replace(microsecond=0)  # a whole second still carries .000000
    core_name, new_name = f"{name}.{uuid.uuid4().hex[:16]}", f"{name}.{uuid.uuid4().hex[:16]}"
    core_event = k8s.CoreV1Event(
        metadata=k8s.V1ObjectMeta(name=core_name, namespace="default"),
        involved_object=node_ref,
        reason="HealerContract",
        message="core/v1 event from healer's contract tests",
        type="Normal",
        first_timestamp=now,
        last_timestamp=now,
        count=1,
        source=k8s.V1EventSource(component="healer"),
    )
    events = k8s.EventsV1Api(cluster.api)
    body = new_event({"name": new_name, "namespace": "default"}, name, micro_time(now))
    body["regarding"]["uid"] = uid
    try:
        made = cluster.core.create_namespaced_event("default", core_event)
        assert made.metadata.name == core_name
        made_v1 = events.create_namespaced_event("default", body)
        assert made_v1.event_time.microsecond == 0 and made_v1.metadata.name == new_name

        # What `kubectl describe node` lists: core/v1 Events in default selected by the Node.
        selector = f"involvedObject.kind=Node,involvedObject.name={name}"
        on_node = cluster.core.list_namespaced_event("default", field_selector=selector).items
        assert {e.metadata.name for e in on_node} >= {core_name, new_name}
        assert any(e.message and "events.k8s.io" in e.message for e in on_node)  # one storage, two APIs
        assert events.read_namespaced_event(new_name, "default").regarding.name == name
    finally:
        for event_name in (core_name, new_name):
            with contextlib.suppress(ApiException):
                cluster.core.delete_namespaced_event(event_name, "default")


def test_event_names_namespaces_and_times_are_validated(cluster: Cluster) -> None:
    """What the real server refuses with 422: a ``generateName`` ending in ``.``, a Node Event
    outside ``default``, an events.k8s.io Event missing its required fields; and with 400 an
    ``eventTime`` without its six fractional digits."""
    name = CONTRACT_NODES[0]
    now = datetime.now(UTC)
    events = k8s.EventsV1Api(cluster.api)

    def named() -> dict[str, Any]:
        return {"name": f"{name}.{uuid.uuid4().hex[:16]}"}

    refused = {
        "generateName ending in '.'": (
            "default",
            new_event({"generateName": f"{name}."}, name, micro_time(now)),
        ),
        "Node Event outside default": (cluster.namespace, new_event(named(), name, micro_time(now))),
        "required fields missing": (
            "default",
            {
                "apiVersion": "events.k8s.io/v1",
                "kind": "Event",
                "metadata": named(),
                "eventTime": micro_time(now),
            },
        ),
    }
    for why, (namespace, body) in refused.items():
        with pytest.raises(ApiException) as invalid:
            events.create_namespaced_event(namespace, body)
        assert invalid.value.status == 422, why
        assert status_body(invalid.value)["reason"] == "Invalid", why

    # An eventTime without its six fractional digits does not even decode: 400.
    whole = new_event(named(), name, now.replace(microsecond=0))  # isoformat(): no fraction
    with pytest.raises(ApiException) as undecodable:
        events.create_namespaced_event("default", whole)
    assert undecodable.value.status == 400
    assert status_body(undecodable.value)["reason"] == "BadRequest"
