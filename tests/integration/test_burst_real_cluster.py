"""Burst capacity on a real control plane: a KWOK node stands in as the burst node, labelled and
tainted as a virtual-kubelet node is (``type=virtual-kubelet``, ``virtual-kubelet.io/provider=
mock:NoSchedule``), beside two KWOK GPU nodes; the real kube-scheduler places the pods; healer as its
ServiceAccount under the chart's ClusterRole.

KWOK completes a Job's pods as soon as they run (its ``pod-complete`` stage), so the training that
holds the cluster's GPUs here is a Deployment, and "the training ends" is its deletion.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client import ApiClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.actions.burst import DryRunBurst, KubernetesBurst
from healer.actions.kubernetes import KubernetesNodeActions
from healer.config import KubernetesSettings
from healer.controller.burst import BurstSync
from healer.ruleset.capacity import CapacityRule
from healer.store.burst import RETURN_KIND, SWITCH_BURST
from healer.store.models import Action, BurstTransition
from healer.store.nodes import get_switch
from healer.store.session import make_engine, make_sessionmaker
from tests.integration.test_api_support import build_app, http_client
from tests.kube_cluster import ControlPlane
from tests.services import wait_until

SETTINGS = KubernetesSettings(domain="healer.dev", request_timeout_seconds=10)
GPU = "nvidia.com/gpu"
VK_TAINT = {"key": "virtual-kubelet.io/provider", "value": "mock", "effect": "NoSchedule"}
BURST_KEY = "healer.dev/burst"
#: The pace the test runs at: one pod a second.
PODS_PER_MINUTE = 60.0


@dataclass
class Burst:
    """One test's cluster: its namespace, nodes, capacity rule and burst job."""

    id: str
    namespace: str
    gpu_nodes: list[str]
    burst_node: str
    rule: CapacityRule
    core: k8s.CoreV1Api
    apps: k8s.AppsV1Api
    policy: k8s.PolicyV1Api
    sync: BurstSync
    sessions: sessionmaker[Session]

    def run(self) -> None:
        self.sync.run([self.rule], datetime.now(UTC))

    def run_until(
        self, what: str, done: Callable[[], bool], timeout: float = 60, each: Callable[[], None] | None = None
    ) -> None:
        def step() -> bool:
            self.run()
            if each is not None:
                each()
            return done()

        wait_until(step, timeout=timeout, interval=0.2, what=what)

    def taints(self) -> list[tuple[str, str, str]]:
        node = self.core.read_node(self.burst_node)
        return [(t.key, t.value or "", t.effect) for t in node.spec.taints or []]

    def pods(self, app: str) -> list[k8s.V1Pod]:
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=f"app={app}").items)

    def transitions(self) -> list[BurstTransition]:
        with self.sessions() as session:
            return list(session.scalars(select(BurstTransition).order_by(BurstTransition.id)))

    def returns(self) -> list[Action]:
        with self.sessions() as session:
            return list(session.scalars(select(Action).where(Action.kind == RETURN_KIND).order_by(Action.id)))


def _deployment(
    name: str, replicas: int, gpus: int, tolerations: list[dict[str, str]], **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "tolerations": tolerations,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.example/x:1",
                            "resources": {"limits": {GPU: str(gpus)}},
                        }
                    ],
                    **spec,
                },
            },
        },
    }


@contextlib.contextmanager
def burst_world(
    kube: ControlPlane,
    kube_admin: ApiClient,
    kube_healer_api: ApiClient,
    database_url: str,
    *,
    burst_node: str | None = None,
) -> Iterator[Burst]:
    """Two KWOK GPU nodes of 4 GPUs and a burst node: ``burst_node`` when given (a real
    virtual-kubelet node), else a KWOK node labelled and tainted as one; a namespace; the capacity
    rule (for 1 s, hold 3 s, 60 pods a minute) and its burst job, acting as healer's ServiceAccount."""
    bid = uuid.uuid4().hex[:6]
    namespace = f"burst-{bid}"
    gpu_nodes = [f"gpu-{bid}-{i}" for i in range(2)]
    kube.add_nodes(gpu_nodes, gpus=4, labels={"burst-pool": bid})
    core = k8s.CoreV1Api(kube_admin)
    stand_in = burst_node is None
    if burst_node is None:
        burst_node = f"vk-{bid}"
        kube.add_nodes([burst_node], gpus=100, labels={"type": "virtual-kubelet"})
        core.patch_node(burst_node, {"spec": {"taints": [VK_TAINT]}})
    # Other tests' pods stay off this test's GPU nodes.
    for name in gpu_nodes:
        core.patch_node(
            name, {"spec": {"taints": [{"key": "burst-test", "value": bid, "effect": "NoSchedule"}]}}
        )
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    rule = CapacityRule.model_validate(
        {
            "name": f"overflow-{bid}",
            "burst_nodes": {"type": "virtual-kubelet"},
            "cluster_nodes": {"burst-pool": bid},
            "namespaces": [namespace],
            "open": {"pending_gpu_pods": 1, "for": "1s"},
            "close": {"free_gpus_at_least": 1, "hold": "3s"},
            "return": {"pods_per_minute": PODS_PER_MINUTE},
        }
    )
    engine = make_engine(database_url)
    sessions = make_sessionmaker(engine)
    cluster = KubernetesNodeActions(kube_healer_api, SETTINGS, identity="healer-test")
    ours = {*gpu_nodes, burst_node}
    sync = BurstSync(
        port=KubernetesBurst(kube_healer_api, domain="healer.dev"),
        # The test's own nodes (the session's control plane holds other tests' nodes too).
        nodes=lambda: [v for v in cluster.list_nodes() if v.name in ours],
        sessions=sessions,
        domain="healer.dev",
    )
    apps, policy = k8s.AppsV1Api(kube_admin), k8s.PolicyV1Api(kube_admin)
    try:
        yield Burst(bid, namespace, gpu_nodes, burst_node, rule, core, apps, policy, sync, sessions)
    finally:
        core.delete_namespace(namespace)
        for name in [*gpu_nodes, *([burst_node] if stand_in else [])]:
            core.delete_node(name)
        engine.dispose()


@pytest.fixture
def burst(
    kube: ControlPlane, kube_admin: ApiClient, kube_healer_api: ApiClient, migrated_sqlite_url: str
) -> Iterator[Burst]:
    with burst_world(kube, kube_admin, kube_healer_api, migrated_sqlite_url) as b:
        yield b


def _inference(b: Burst, replicas: int) -> None:
    """``replicas`` one-GPU pods that run on this test's GPU nodes or its burst node, behind a
    PodDisruptionBudget (``maxUnavailable: 1``)."""
    tolerations = [
        {"key": "burst-test", "value": b.id, "effect": "NoSchedule"},
        {"key": VK_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"},
    ]
    ours = [{"matchExpressions": [{"key": "burst-pool", "operator": "In", "values": [b.id]}]}]
    ours.append({"matchFields": [{"key": "metadata.name", "operator": "In", "values": [b.burst_node]}]})
    affinity = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": ours}}
    }
    b.apps.create_namespaced_deployment(
        b.namespace, _deployment("inference", replicas, 1, tolerations, affinity=affinity)
    )
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "inference"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "inference"}}},
    }
    b.policy.create_namespaced_pod_disruption_budget(b.namespace, pdb)


def _training(b: Burst, replicas: int, gpus: int) -> None:
    tolerations = [{"key": "burst-test", "value": b.id, "effect": "NoSchedule"}]
    selector = {"nodeSelector": {"burst-pool": b.id}}
    b.apps.create_namespaced_deployment(
        b.namespace, _deployment("training", replicas, gpus, tolerations, **selector)
    )


def _running_on(pods: list[k8s.V1Pod]) -> dict[str, str]:
    return {
        p.metadata.name: p.spec.node_name
        for p in pods
        if p.status.phase == "Running" and not p.metadata.deletion_timestamp
    }


def test_training_pushes_inference_out_and_it_comes_back_at_the_pace(
    burst: Burst, kube: ControlPlane
) -> None:
    overflow_and_return(burst, kube, replicas=4)


def overflow_and_return(b: Burst, kube: ControlPlane, *, replicas: int) -> float:
    """The story of issue 29 on ``b``'s burst node; returns the seconds from the training's end to
    every inference pod back in the cluster."""
    # A fresh burst node with nothing waiting: closed once the in-cluster GPUs have been free for the hold.
    b.run_until(
        "the fresh burst node closed",
        lambda: (BURST_KEY, b.rule.name, "NoSchedule") in b.taints(),
        timeout=30,
    )
    assert [(t.from_state, t.to_state, t.status) for t in b.transitions()] == [
        ("open", "closed", "succeeded")
    ]
    assert b.transitions()[0].evidence == {
        "free_gpus": 8,
        "pending_gpu_pods": 0,
        "kueue_pending_workloads": None,
        "held_gpus": 0,
        "total_gpus": 8,
    }

    # Flapping demand shorter than `for` (1 s): a pending GPU pod appears and goes, twice: nothing toggles.
    for _ in range(2):
        b.apps.create_namespaced_deployment(
            b.namespace,
            _deployment("flap", 1, 16, [{"key": "burst-test", "value": b.id, "effect": "NoSchedule"}]),
        )
        wait_until(lambda: bool(b.pods("flap")), timeout=20, interval=0.1, what="the flapping pod created")
        b.run()
        time.sleep(0.3)  # less than `for`: the shortage is seen twice, never for a second
        b.run()
        b.apps.delete_namespaced_deployment("flap", b.namespace)
        wait_until(lambda: not b.pods("flap"), timeout=20, interval=0.1, what="the flapping pod gone")
        b.run()
    assert len(b.transitions()) == 1

    # Training takes every in-cluster GPU; the inference that comes after waits, the burst opens and
    # the inference lands on the burst node.
    _training(b, 2, 4)
    wait_until(
        lambda: len(_running_on(b.pods("training"))) == 2, timeout=60, interval=0.2, what="training running"
    )
    _inference(b, replicas)
    b.run_until(
        "inference running on the burst node",
        lambda: list(_running_on(b.pods("inference")).values()) == [b.burst_node] * replicas,
    )
    opened = b.transitions()[-1]
    assert (opened.from_state, opened.to_state, opened.status) == ("closed", "open", "succeeded")
    assert (
        opened.evidence is not None
        and opened.evidence["free_gpus"] == 0
        and opened.evidence["pending_gpu_pods"] >= 1
    )
    assert BURST_KEY not in [t[0] for t in b.taints()]
    assert VK_TAINT["key"] in [t[0] for t in b.taints()]  # the provider's taint is not healer's to touch

    # The training ends: within the hold the burst closes and the pods come back at the pace, the
    # budget never broken (at most one inference pod unavailable), none left pending.
    b.apps.delete_namespaced_deployment("training", b.namespace)
    ended = time.monotonic()
    lowest: list[int] = []

    def watch_budget() -> None:
        lowest.append(
            b.apps.read_namespaced_deployment(
                name="inference", namespace=b.namespace
            ).status.available_replicas
            or 0
        )

    b.run_until(
        "every inference pod back in the cluster",
        lambda: (
            sorted(_running_on(b.pods("inference")).values())
            == sorted([*b.gpu_nodes, *b.gpu_nodes])[:replicas]
            or (
                len(_running_on(b.pods("inference"))) == replicas
                and b.burst_node not in _running_on(b.pods("inference")).values()
            )
        ),
        each=watch_budget,
        timeout=90,
    )
    drained = time.monotonic() - ended
    closed = b.transitions()[-1]
    assert (closed.from_state, closed.to_state, closed.status) == ("open", "closed", "succeeded")
    assert (BURST_KEY, b.rule.name, "NoSchedule") in b.taints()
    assert all(t[2] != "NoExecute" for t in b.taints())
    assert min(lowest) >= replicas - 1, "the PodDisruptionBudget (maxUnavailable 1) was broken"
    assert not [p for p in b.pods("inference") if p.status.phase == "Pending"]
    returns = b.returns()
    assert len(returns) == replicas and {r.status for r in returns} == {"succeeded"}
    # The pace, as the API server received the evictions: at most one a second (60 a minute).
    ours = sorted(
        e.received
        for e in kube.evictions()
        if e.pod.startswith(f"{b.namespace}/inference-") and e.code == 201
    )
    assert len(ours) == replicas
    gaps = [later - earlier for earlier, later in itertools.pairwise(ours)]
    assert min(gaps) >= 60.0 / PODS_PER_MINUTE - 0.05, gaps
    print(
        f"\nburst drain: {replicas} pods back in {drained:.1f} s after the training ended (hold 3 s, "
        f"{PODS_PER_MINUTE:.0f} pods/min); eviction gaps {', '.join(f'{g:.2f}' for g in gaps)} s"
    )
    b.run()
    snapshot = get_switch_value(b)
    assert snapshot["rules"][0]["nodes"][0]["state"] == "closed"
    assert snapshot["rules"][0]["nodes"][0]["out"] == [], snapshot
    return drained


def get_switch_value(b: Burst) -> dict[str, Any]:
    with b.sessions() as session:
        return get_switch(session, SWITCH_BURST)


def _on_burst_node(b: Burst, name: str, replicas: int, gpus: int) -> None:
    """A Deployment pinned to the burst node (as a pod that overflowed earlier would be)."""
    tolerations = [{"key": VK_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}]
    name_is = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [b.burst_node]}]}
    pinned = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [name_is]}
            }
        }
    }
    b.apps.create_namespaced_deployment(b.namespace, _deployment(name, replicas, gpus, tolerations, **pinned))
    wait_until(
        lambda: len(_running_on(b.pods(name))) == replicas,
        timeout=60,
        interval=0.2,
        what=f"{name} on the burst node",
    )


def test_dry_run_records_the_toggles_and_returns_without_making_them(
    burst: Burst, kube: ControlPlane
) -> None:
    b = burst
    b.sync.port = DryRunBurst(b.sync.port)  # type: ignore[arg-type]
    _on_burst_node(b, "inference", 2, 1)
    _on_burst_node(b, "big", 1, 16)  # more GPUs than any in-cluster node has: it cannot come back
    b.run_until("two returns recorded", lambda: len(b.returns()) == 2, timeout=30)
    assert [(t.from_state, t.to_state, t.status) for t in b.transitions()] == [("open", "closed", "dry_run")]
    assert {r.status for r in b.returns()} == {"dry_run"}
    assert BURST_KEY not in [t[0] for t in b.taints()]  # nothing changed on the node
    assert sorted(_running_on(b.pods("inference")).values()) == [b.burst_node] * 2
    assert not [e for e in kube.evictions() if e.pod.startswith(f"{b.namespace}/")]
    node = get_switch_value(b)["rules"][0]["nodes"][0]
    (big,) = [key for key in node["stay"] if "/big-" in key]
    assert node["stay"][big].startswith("no capacity: it requests 16 GPU(s)")

    # The dashboard and /metrics show the burst: its state, history, the pods out and the one stuck.
    with http_client(build_app(b.sessions)) as c:
        page = c.get("/burst")
        assert page.status_code == 200
        assert f'data-node="{b.burst_node}"' in page.text and ">closed<" in page.text
        assert big in page.text and "no capacity" in page.text
        assert "open → closed" in page.text and "dry_run" in page.text
        assert c.get("/api/v1/burst").json()["history"][0]["to"] == "closed"
        metrics = c.get("/metrics").text
    labels = f'{{node="{b.burst_node}",rule="{b.rule.name}"}}'
    assert f"healer_burst_open{labels} 0.0" in metrics, [x for x in metrics.splitlines() if "burst" in x]
    assert f"healer_burst_pods{labels} 1.0" in metrics, [x for x in metrics.splitlines() if "burst" in x]
    assert f"healer_burst_pods_stuck{labels} 1.0" in metrics


def test_a_human_removing_healers_taint_wins(burst: Burst) -> None:
    b = burst
    b.run_until("the fresh burst node closed", lambda: BURST_KEY in [t[0] for t in b.taints()], timeout=30)
    b.core.patch_node(b.burst_node, {"spec": {"taints": [VK_TAINT]}})  # kubectl taint ... healer.dev/burst-
    b.run_until("the human's untaint recorded", lambda: b.transitions()[-1].to_state == "open", timeout=20)
    seen = b.transitions()[-1]
    assert (seen.status, seen.by_hand) == ("recorded", True)
    assert "removed by someone else" in seen.reason
    deadline = time.monotonic() + 2 * b.rule.close.hold
    while time.monotonic() < deadline:  # free GPUs far longer than the hold: the taint stays off
        b.run()
        time.sleep(0.2)
    assert BURST_KEY not in [t[0] for t in b.taints()]
    assert len(b.transitions()) == 2
