"""Checkpoint before eviction on a real control plane: healer (its ServiceAccount, the chart's
ClusterRole) asks a training pod to checkpoint, waits for its answer or the deadline, then evicts;
the real Eviction API marks the pod ``DisruptionTarget`` itself."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client import ApiClient
from sqlalchemy import select

from healer.actions.kubernetes import KubernetesNodeActions
from healer.config import KubernetesSettings, SafetySettings, Settings
from healer.controller import advance_drains, remediate
from healer.model.drain import DrainOptions, DrainReport
from healer.model.findings import Finding, TickFindings
from healer.model.node import Ownership
from healer.model.states import FindingState
from healer.ruleset.schema import Rule, RuleGroup, RuleSet
from healer.store.models import Action, Node
from healer.store.session import make_engine, make_sessionmaker
from tests.integration.test_k8s_real_cluster import admin, namespace, unique
from tests.kube_cluster import ControlPlane
from tests.services import wait_until

SETTINGS = KubernetesSettings(domain="healer.dev", request_timeout_seconds=10, checkpoint_timeout_seconds=120)
__all__ = ["admin", "namespace"]  # fixtures shared with test_k8s_real_cluster
ASKED = "healer.dev/checkpoint-requested-at"
DONE = "healer.dev/checkpoint-done-at"


@pytest.fixture
def actions(kube_healer_api: ApiClient) -> KubernetesNodeActions:
    return KubernetesNodeActions(kube_healer_api, SETTINGS, identity="healer-test")


def workload(
    kube_admin: ApiClient,
    namespace: str,
    name: str,
    node: str,
    *,
    gpus: int = 1,
    labels: dict[str, str] | None = None,
) -> None:
    """A one-replica Deployment pinned to ``node`` (a trainer when it asks for GPUs)."""
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    body: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, **(labels or {})}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},  # replacements wait: cordoned
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": resources}
                    ],
                },
            },
        },
    }
    k8s.AppsV1Api(kube_admin).create_namespaced_deployment(namespace, body)


def running(core: k8s.CoreV1Api, namespace: str, app: str) -> k8s.V1Pod:
    def one() -> k8s.V1Pod | None:
        pods = core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
        live = [p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
        return live[0] if len(live) == 1 else None

    wait_until(lambda: one() is not None, what=f"{app} Running")
    pod = one()
    assert pod is not None
    return pod


@dataclass
class Scene:
    """The control plane, admin clients for set-up, healer's adapter, and a fresh namespace."""

    kube: ControlPlane
    api: ApiClient
    admin: k8s.CoreV1Api
    actions: KubernetesNodeActions
    namespace: str

    def node(self, prefix: str, *apps: tuple[str, dict[str, Any]]) -> tuple[str, dict[str, k8s.V1Pod]]:
        """A KWOK node running ``apps`` (name, ``workload`` options), cordoned by healer (incident 9)."""
        node = unique(prefix)
        self.kube.add_nodes([node])
        for app, options in apps:
            workload(self.api, self.namespace, app, node, **options)
        pods = {app: running(self.admin, self.namespace, app) for app, _ in apps}
        self.actions.cordon(node, Ownership(incident_id=9, reason="XidFatal", at=datetime.now(UTC)))
        return node, pods


@pytest.fixture
def scene(
    kube: ControlPlane,
    kube_admin: ApiClient,
    admin: k8s.CoreV1Api,
    actions: KubernetesNodeActions,
    namespace: str,
) -> Scene:
    return Scene(kube, kube_admin, admin, actions, namespace)


def step(actions: KubernetesNodeActions, node: str, now: datetime, **options: Any) -> DrainReport:
    opts = DrainOptions(timeout_seconds=600, grace_period_seconds=0, **options)
    return actions.drain_step(node, started_at=now, now=now, options=opts)


def key(pod: k8s.V1Pod) -> str:
    return f"{pod.metadata.namespace}/{pod.metadata.name}"


def test_drain_waits_for_the_jobs_checkpoint_before_the_first_eviction(scene: Scene) -> None:
    admin, actions, namespace = scene.admin, scene.actions, scene.namespace
    # The logger asks for no GPU: not a training pod, not asked.
    node, pods = scene.node("gpu-ckpt", ("trainer", {}), ("logger", {"gpus": 0}))
    trainer, logger = pods["trainer"], pods["logger"]
    asked_at = datetime.now(UTC).replace(microsecond=0)

    first = step(actions, node, asked_at, checkpoint_seconds=300)
    assert first.checkpointing == (key(trainer),) and first.evicted == (key(logger),)
    annotations = admin.read_namespaced_pod(trainer.metadata.name, namespace).metadata.annotations
    assert annotations[ASKED] == asked_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert annotations["healer.dev/checkpoint-deadline"] == (asked_at + timedelta(seconds=300)).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    assert annotations["healer.dev/checkpoint-incident"] == "9"

    # Later steps, before the job answers: still not evicted, the request is not repeated.
    again = step(actions, node, asked_at + timedelta(seconds=60), checkpoint_seconds=300)
    assert again.checkpointing == (key(trainer),) and again.evicted == ()
    pod = admin.read_namespaced_pod(trainer.metadata.name, namespace)
    assert pod.metadata.deletion_timestamp is None and pod.metadata.annotations[ASKED] == annotations[ASKED]

    # The job saved its checkpoint and says so on its pod; the next step evicts it.
    done_at = (asked_at + timedelta(seconds=95)).strftime("%Y-%m-%dT%H:%M:%SZ")
    since = admin.list_namespaced_pod(namespace).metadata.resource_version
    admin.patch_namespaced_pod(
        trainer.metadata.name, namespace, {"metadata": {"annotations": {DONE: done_at}}}
    )
    evicted = step(actions, node, asked_at + timedelta(seconds=100), checkpoint_seconds=300)
    assert evicted.evicted == (key(trainer),) and evicted.checkpointing == ()
    assert evicted.checkpoints[key(trainer)] == {
        "requested_at": annotations[ASKED],
        "deadline": annotations["healer.dev/checkpoint-deadline"],
        "acknowledged_at": done_at,
    }

    # healer adds no condition of its own: the Eviction API marks the pod DisruptionTarget, which a
    # Job's podFailurePolicy (onPodConditions DisruptionTarget, action Ignore) does not count.
    conditions = set()
    for event in k8s_watch.Watch().stream(
        admin.list_namespaced_pod,
        namespace,
        field_selector=f"metadata.name={trainer.metadata.name}",
        resource_version=since,
        timeout_seconds=5,
    ):
        for c in event["object"].status.conditions or []:
            conditions.add((c.type, c.status, c.reason))
        if event["type"] == "DELETED":
            break
    assert ("DisruptionTarget", "True", "EvictionByEvictionAPI") in conditions


def test_a_pod_that_never_answers_is_evicted_at_its_deadline(scene: Scene) -> None:
    actions = scene.actions
    node, pods = scene.node("gpu-silent", ("silent", {}))
    pod = pods["silent"]
    now = datetime.now(UTC).replace(microsecond=0)

    assert step(actions, node, now, checkpoint_seconds=30).checkpointing == (key(pod),)
    assert step(actions, node, now + timedelta(seconds=29), checkpoint_seconds=30).evicted == ()
    late = step(actions, node, now + timedelta(seconds=30), checkpoint_seconds=30)
    assert late.evicted == (key(pod),)
    assert late.checkpoints[key(pod)]["deadline_passed_at"] == (now + timedelta(seconds=30)).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def test_a_pod_opts_in_by_label_when_the_rule_does_not_ask(scene: Scene) -> None:
    admin, actions, namespace = scene.admin, scene.actions, scene.namespace
    opted_in = {"gpus": 0, "labels": {"healer.dev/checkpoint": "true"}}
    # "plain" is a GPU pod, but the rule does not ask.
    node, pods = scene.node("gpu-label", ("opted", opted_in), ("plain", {}))
    opted, plain = pods["opted"], pods["plain"]
    now = datetime.now(UTC).replace(microsecond=0)

    report = step(actions, node, now)
    assert report.checkpointing == (key(opted),) and report.evicted == (key(plain),)
    deadline = admin.read_namespaced_pod(opted.metadata.name, namespace).metadata.annotations[
        "healer.dev/checkpoint-deadline"
    ]
    assert deadline == (now + timedelta(seconds=120)).strftime("%Y-%m-%dT%H:%M:%SZ")  # the settings' wait


# --- through the controller: quarantine, drain pass, the drain's record ---------------------------

RULES = RuleSet(
    groups=(
        RuleGroup(
            name="gpu",
            rules=[
                Rule(
                    name="XidFatal",
                    expr="max by (Hostname, gpu) (DCGM_FI_DEV_XID_ERRORS) == 79",
                    actions=[
                        "quarantine",
                        {"drain": {"timeout": "30m", "grace_period": 0, "checkpoint": "5m"}},
                    ],
                )
            ],
        ),
    )
)


def xid(node: str, at: datetime) -> TickFindings:
    finding = Finding(
        rule="XidFatal",
        series_key=f'XidFatal{{Hostname="{node}",gpu="3"}}',
        node=node,
        gpu="3",
        state=FindingState.FIRING,
        severity="critical",
        value=79,
        unit=None,
        labels={"Hostname": node, "gpu": "3"},
        active_since=at,
        fired_at=at,
    )
    return TickFindings(at=at, firing={node: [finding]})


def test_the_drain_record_keeps_when_the_pod_was_asked_when_it_answered_and_the_first_eviction(
    kube: ControlPlane, kube_admin: ApiClient, scene: Scene, migrated_sqlite_url: str
) -> None:
    admin, actions, namespace = scene.admin, scene.actions, scene.namespace
    node = unique("gpu-flow")
    kube.add_nodes([node])
    workload(kube_admin, namespace, "trainer", node)
    trainer = running(admin, namespace, "trainer")
    engine = make_engine(migrated_sqlite_url)
    sessions = make_sessionmaker(engine)
    settings = Settings(kubernetes=SETTINGS, safety=SafetySettings(dry_run=False, max_unhealthy_percent=100))
    t0 = datetime.now(UTC).replace(microsecond=0)
    common: dict[str, Any] = {
        "rules": RULES,
        "actions": actions,
        "session_factory": sessions,
        "settings": settings,
    }
    try:
        remediate(findings=xid(node, t0), now=t0, fleet={node: "default"}, **common)
        with sessions() as s:
            assert s.scalar(select(Node.state).where(Node.name == node)) == "draining"
        advance_drains(now=t0 + timedelta(seconds=10), **common)
        pod = admin.read_namespaced_pod(trainer.metadata.name, namespace)
        assert pod.metadata.deletion_timestamp is None and ASKED in pod.metadata.annotations
        advance_drains(now=t0 + timedelta(seconds=20), **common)  # no answer yet: still there
        assert admin.read_namespaced_pod(trainer.metadata.name, namespace).metadata.deletion_timestamp is None

        answered = (t0 + timedelta(seconds=25)).strftime("%Y-%m-%dT%H:%M:%SZ")
        admin.patch_namespaced_pod(
            trainer.metadata.name, namespace, {"metadata": {"annotations": {DONE: answered}}}
        )
        advance_drains(now=t0 + timedelta(seconds=30), **common)
        with sessions() as s:
            row = s.scalars(select(Action).where(Action.kind == "drain").order_by(Action.id.desc())).first()
            assert row is not None
            detail = dict(row.detail or {})
        assert key(trainer) in detail["evicted"]
        assert detail["checkpoints"][key(trainer)] == {
            "requested_at": (t0 + timedelta(seconds=10)).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "deadline": (t0 + timedelta(seconds=310)).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "acknowledged_at": answered,
        }
        assert detail["first_eviction_at"] == (t0 + timedelta(seconds=30)).isoformat()
    finally:
        engine.dispose()
