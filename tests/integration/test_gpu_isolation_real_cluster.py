"""One GPU out on a real control plane (DRA device taints enabled in ``tests/kube_cluster.py``): a
finding naming one GPU creates a DeviceTaintRule and leaves the node schedulable; a second GPU on
the node escalates to the node's quarantine; healer acts as its ServiceAccount (the chart's RBAC)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client import ApiClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.actions.gpu_isolation import DryRunGpuIsolation, GpuIsolation
from healer.actions.kubernetes import KubernetesNodeActions
from healer.config import GpuIsolationSettings, KubernetesSettings, SafetySettings, Settings
from healer.controller import remediate
from healer.controller.gpu_isolation import GpuIsolationSync
from healer.engine.gpu_scope import for_nodes
from healer.metrics import HealerMetrics
from healer.model.findings import Finding, TickFindings
from healer.model.states import FindingState
from healer.ruleset.schema import Rule, RuleGroup, RuleSet
from healer.store.models import Action, Node
from tests.integration.test_k8s_real_cluster import unique
from tests.integration.test_kueue_quota_real_cluster import actions, sessions
from tests.kube_cluster import ControlPlane

__all__ = ["actions", "sessions"]  # fixtures shared with test_kueue_quota_real_cluster
SETTINGS = KubernetesSettings(domain="healer.dev", request_timeout_seconds=10)
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
RULES = RuleSet(
    groups=(
        RuleGroup(
            name="gpu",
            rules=[Rule(name="RowRemapFailed", expr="x > 0", actions=[{"quarantine": {"scope": "gpu"}}])],
        ),
    )
)


def remap(node: str, *gpus: str) -> TickFindings:
    found = [
        Finding(
            rule="RowRemapFailed",
            series_key=f'RowRemapFailed{{Hostname="{node}",gpu="{gpu}"}}',
            node=node,
            gpu=gpu,
            state=FindingState.FIRING,
            severity="critical",
            value=1.0,
            unit=None,
            labels={"Hostname": node, "gpu": gpu},
            fired_at=T0,
        )
        for gpu in gpus
    ]
    return TickFindings(at=T0, firing={node: found} if found else {})


def device_rules(kube_admin: ApiClient, node: str) -> dict[str, dict[str, Any]]:
    """GPU → (selector, taint) of the DeviceTaintRules healer made for ``node``."""
    rules = k8s.ResourceV1alpha3Api(kube_admin).list_device_taint_rule(
        label_selector=f"healer.dev/node={node}"
    )
    return {
        r.metadata.labels["healer.dev/gpu"]: {
            "selector": (
                r.spec.device_selector.driver,
                r.spec.device_selector.pool,
                r.spec.device_selector.device,
            ),
            "taint": (r.spec.taint.key, r.spec.taint.value, r.spec.taint.effect),
        }
        for r in rules.items
    }


def test_one_gpu_out_keeps_the_node_serving_and_a_second_gpu_quarantines_it(
    kube: ControlPlane,
    kube_admin: ApiClient,
    kube_healer_api: ApiClient,
    actions: KubernetesNodeActions,
    sessions: sessionmaker[Session],
) -> None:
    node = unique("gpu-one")
    kube.add_nodes([node])
    settings = Settings(kubernetes=SETTINGS, safety=SafetySettings(dry_run=False, max_unhealthy_percent=100))
    isolation = GpuIsolation(kube_healer_api, GpuIsolationSettings(), domain="healer.dev")
    job = GpuIsolationSync(isolation=isolation, sessions=sessions)
    assert isolation.mode() == "dra"

    def tick(findings: TickFindings, at: datetime) -> None:
        remediate(
            findings=for_nodes(findings, RULES),
            rules=RULES,
            actions=actions,
            session_factory=sessions,
            settings=settings,
            now=at,
            fleet={node: "default"},
        )
        job.run(findings, RULES, at)

    tick(remap(node, "3"), T0)
    assert device_rules(kube_admin, node) == {
        "3": {
            "selector": ("gpu.nvidia.com", node, "gpu-3"),
            "taint": ("healer.dev/unhealthy", "RowRemapFailed", "NoSchedule"),
        }
    }
    seen = k8s.CoreV1Api(kube_admin).read_node(node)
    assert not seen.spec.unschedulable
    assert "healer.dev/quarantined" not in {t.key for t in seen.spec.taints or []}
    with sessions() as s:
        assert s.scalar(select(Node.state).where(Node.name == node)) in (None, "healthy")

    tick(remap(node, "3", "5"), T0 + timedelta(seconds=30))
    assert set(device_rules(kube_admin, node)) == {"3", "5"}
    seen = k8s.CoreV1Api(kube_admin).read_node(node)
    assert seen.spec.unschedulable
    assert "healer.dev/quarantined" in {t.key for t in seen.spec.taints or []}

    job.run(remap(node), RULES, T0 + timedelta(minutes=5))  # resolved: the GPUs come back
    assert device_rules(kube_admin, node) == {}
    with sessions() as s:
        kinds = [
            (a.kind, a.detail["gpu"], a.status)
            for a in s.scalars(select(Action).where(Action.kind.like("gpu_%")))
        ]
    assert sorted(kinds) == sorted(
        [
            ("gpu_isolate", "3", "succeeded"),
            ("gpu_isolate", "5", "succeeded"),
            ("gpu_restore", "3", "succeeded"),
            ("gpu_restore", "5", "succeeded"),
        ]
    )


def test_without_dra_the_node_annotation_names_the_gpus_out(
    kube: ControlPlane, kube_admin: ApiClient, kube_healer_api: ApiClient, sessions: sessionmaker[Session]
) -> None:
    node = unique("gpu-annot")
    kube.add_nodes([node])
    isolation = GpuIsolation(kube_healer_api, GpuIsolationSettings(mode="annotation"), domain="healer.dev")
    job = GpuIsolationSync(isolation=isolation, sessions=sessions)

    def annotation() -> str | None:
        return (k8s.CoreV1Api(kube_admin).read_node(node).metadata.annotations or {}).get(
            "healer.dev/gpus-out"
        )

    job.run(remap(node, "3"), RULES, T0)
    assert annotation() == "3"
    job.run(remap(node, "3", "10", "5"), RULES, T0)
    assert annotation() == "3,5,10"
    job.run(remap(node), RULES, T0)
    assert annotation() is None
    assert device_rules(kube_admin, node) == {}


def test_dry_run_records_the_gpu_it_would_take_out_once(
    kube: ControlPlane, kube_admin: ApiClient, kube_healer_api: ApiClient, sessions: sessionmaker[Session]
) -> None:
    node = unique("gpu-dry")
    kube.add_nodes([node])
    real = GpuIsolation(kube_healer_api, GpuIsolationSettings(), domain="healer.dev")
    job = GpuIsolationSync(isolation=DryRunGpuIsolation(real), sessions=sessions)
    assert job.run(remap(node, "2"), RULES, T0) == 1
    assert job.run(remap(node, "2"), RULES, T0 + timedelta(seconds=30)) == 0
    assert device_rules(kube_admin, node) == {}
    with sessions() as s:
        rows = [
            (a.kind, a.status, a.detail) for a in s.scalars(select(Action).where(Action.kind.like("gpu_%")))
        ]
    assert rows == [("gpu_isolate", "dry_run", {"gpu": "2", "rule": "RowRemapFailed", "how": "dra"})]


def node_events(kube_admin: ApiClient, node: str) -> list[tuple[str, str, str]]:
    """(reason, type, message) of healer's Events on ``node``, as ``kubectl describe node`` lists
    them (the node lifecycle controller's own, e.g. ``RegisteredNode``, left out)."""
    selector = f"involvedObject.kind=Node,involvedObject.name={node}"
    events = k8s.CoreV1Api(kube_admin).list_namespaced_event("default", field_selector=selector).items
    healers = [e for e in events if (e.reporting_component or "").endswith("/healer")]
    return [(e.reason, e.type, e.message) for e in sorted(healers, key=lambda e: e.event_time)]


def gpus_out_metric(metrics: HealerMetrics) -> dict[str, float]:
    """node → ``healer_gpus_out`` in the /metrics text."""
    text = metrics.exposition().decode()
    return {
        sample.labels["node"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "healer_gpus_out"
        for sample in family.samples
    }


@pytest.fixture
def fresh_node(kube: ControlPlane) -> str:
    """A new 8-GPU KWOK node's name."""
    node = unique("gpu-event")
    kube.add_nodes([node])
    return node


def test_a_gpu_out_and_back_is_an_event_on_the_node_and_counted_on_metrics(
    fresh_node: str,
    kube_admin: ApiClient,
    kube_healer_api: ApiClient,
    actions: KubernetesNodeActions,
    sessions: sessionmaker[Session],
) -> None:
    node = fresh_node
    metrics = HealerMetrics()
    isolation = GpuIsolation(kube_healer_api, GpuIsolationSettings(), domain="healer.dev")
    job = GpuIsolationSync(isolation=isolation, sessions=sessions, events=actions, metrics=metrics)

    job.run(remap(node, "3"), RULES, T0)
    rule_name = f"healer-{node}-gpu-3"
    assert node_events(kube_admin, node) == [
        (
            "GpuTakenOut",
            "Warning",
            f"GPU 3 taken out of service by healer (rule RowRemapFailed): DeviceTaintRule {rule_name}; "
            "the node keeps serving with its other GPUs",
        )
    ]
    assert gpus_out_metric(metrics).get(node) == 1.0
    job.run(remap(node, "3", "5"), RULES, T0 + timedelta(seconds=30))
    assert gpus_out_metric(metrics).get(node) == 2.0

    job.run(remap(node), RULES, T0 + timedelta(minutes=5))
    seen = node_events(kube_admin, node)
    assert [(r, t) for r, t, _ in seen] == [
        ("GpuTakenOut", "Warning"),
        ("GpuTakenOut", "Warning"),
        ("GpuReturned", "Normal"),
        ("GpuReturned", "Normal"),
    ]
    assert f"GPU 3 back in service (rule RowRemapFailed): DeviceTaintRule {rule_name} removed" in {
        m for _, _, m in seen
    }
    assert node not in gpus_out_metric(metrics)
