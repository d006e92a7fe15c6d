"""Kueue quota sync on a real control plane: Kueue's ClusterQueue CRD (cut down to the fields healer
uses, ``tests/fixtures/kueue-clusterqueue-crd.yaml``), KWOK nodes with 8 GPUs each, healer as its
ServiceAccount under the chart's ClusterRole. No Kueue controller runs: the quota is what we read.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client import ApiClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.actions.gpu_isolation import GpuIsolation
from healer.actions.kubernetes import KubernetesNodeActions
from healer.actions.kueue import DryRunKueueQuotas, KueueQuotas
from healer.config import GpuIsolationSettings, KubernetesSettings, KueueSettings, load_settings
from healer.controller.quota_sync import ACTION_KIND, QuotaSync, count_out
from healer.errors import KubernetesNotFound
from healer.metrics import HealerMetrics
from healer.model.node import NodeEdit, Ownership
from healer.store.models import Action
from healer.store.session import make_engine, make_sessionmaker
from healer.wiring import build_process
from tests.conftest import FIXTURES
from tests.integration.test_api_support import http_client
from tests.kube_cluster import ControlPlane
from tests.services import wait_until

REPO = Path(__file__).resolve().parents[2]
SETTINGS = KubernetesSettings(domain="healer.dev", request_timeout_seconds=10)
GROUP, PLURAL = "kueue.x-k8s.io", "clusterqueues"
GPU = "nvidia.com/gpu"
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def kueue_crd(kube: ControlPlane) -> None:
    """Kueue's ClusterQueue CRD installed (as admin) and Established."""
    crd = yaml.safe_load((FIXTURES / "kueue-clusterqueue-crd.yaml").read_text())
    with kube.admin_client() as api:
        ext = k8s.ApiextensionsV1Api(api)
        with contextlib.suppress(k8s.ApiException):
            ext.create_custom_resource_definition(crd)

        def established() -> bool:
            got = ext.read_custom_resource_definition(crd["metadata"]["name"])
            return any(c.type == "Established" and c.status == "True" for c in got.status.conditions or [])

        wait_until(established, timeout=30, interval=0.2, what="ClusterQueue CRD Established")


@pytest.fixture
def sessions(migrated_sqlite_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(migrated_sqlite_url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def actions(kube_healer_api: ApiClient) -> KubernetesNodeActions:
    return KubernetesNodeActions(kube_healer_api, SETTINGS, identity="healer-test")


@pytest.fixture
def custom(kube_admin: ApiClient) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(kube_admin)


@pytest.fixture
def fleet(kube: ControlPlane, kueue_crd: None, custom: k8s.CustomObjectsApi) -> dict[str, Any]:
    """Three 8-GPU nodes of a fresh flavor, and a ClusterQueue giving that flavor 24 GPUs (set by
    a person with ``kubectl apply``: field manager ``kubectl``), plus a CPU flavor healer leaves alone."""
    flavor = unique("h100")
    nodes = [unique("kq") for _ in range(3)]
    kube.add_nodes(nodes, labels={"healer-test/flavor": flavor})
    queue = unique("train")
    body = {
        "apiVersion": f"{GROUP}/v1beta1",
        "kind": "ClusterQueue",
        "metadata": {"name": queue},
        "spec": {
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", GPU],
                    "flavors": [
                        {
                            "name": flavor,
                            "resources": [
                                {"name": "cpu", "nominalQuota": "192"},
                                {"name": GPU, "nominalQuota": 24},
                            ],
                        }
                    ],
                },
                {
                    "coveredResources": ["memory"],
                    "flavors": [
                        {"name": "default", "resources": [{"name": "memory", "nominalQuota": "1Ti"}]}
                    ],
                },
            ]
        },
    }
    custom.patch_cluster_custom_object(
        GROUP,
        "v1beta1",
        PLURAL,
        queue,
        body,
        field_manager="kubectl",
        _content_type="application/apply-patch+yaml",
    )
    return {"flavor": flavor, "nodes": nodes, "queue": queue}


@dataclass
class Scene:
    """healer's clients (its ServiceAccount), its database, the fleet and an admin reader."""

    api: ApiClient
    actions: KubernetesNodeActions
    sessions: sessionmaker[Session]
    fleet: dict[str, Any]
    custom: k8s.CustomObjectsApi


@pytest.fixture
def scene(
    kube_healer_api: ApiClient,
    actions: KubernetesNodeActions,
    sessions: sessionmaker[Session],
    fleet: dict[str, Any],
    custom: k8s.CustomObjectsApi,
) -> Scene:
    return Scene(kube_healer_api, actions, sessions, fleet, custom)


def sync(
    scene: Scene,
    *,
    dry_run: bool = False,
    gpus_out: Callable[[], dict[str, int]] = dict,
    metrics: HealerMetrics | None = None,
    **policy: Any,
) -> QuotaSync:
    kube_healer_api, actions, sessions, fleet = scene.api, scene.actions, scene.sessions, scene.fleet
    settings = KueueSettings(
        enabled=True,
        cluster_queues=[fleet["queue"]],
        flavors=[{"name": fleet["flavor"], "node_labels": {"healer-test/flavor": fleet["flavor"]}}],
        **policy,
    )
    real = KueueQuotas(kube_healer_api)
    return QuotaSync(
        settings=settings,
        quotas=DryRunKueueQuotas(real) if dry_run else real,
        nodes=actions.list_nodes,
        sessions=sessions,
        domain="healer.dev",
        gpus_out=gpus_out,
        metrics=metrics,
    )


def quarantine(actions: KubernetesNodeActions, name: str) -> None:
    """What healer's quarantine step writes: cordon, taint and ownership annotations, one patch."""
    own = Ownership(incident_id=1, reason="GpuTooHot", at=T0)
    actions.edit(name, NodeEdit(cordon=own, taint=("GpuTooHot", "NoSchedule")))


def gpu_quota(custom: k8s.CustomObjectsApi, fleet: dict[str, Any]) -> str:
    got = custom.get_cluster_custom_object(GROUP, "v1beta2", PLURAL, fleet["queue"])
    (flavor,) = got["spec"]["resourceGroups"][0]["flavors"]
    return str({r["name"]: r["nominalQuota"] for r in flavor["resources"]}[GPU])


def version_of(custom: k8s.CustomObjectsApi, fleet: dict[str, Any]) -> str:
    return str(
        custom.get_cluster_custom_object(GROUP, "v1beta2", PLURAL, fleet["queue"])["metadata"][
            "resourceVersion"
        ]
    )


def recorded(sessions: sessionmaker[Session]) -> list[tuple[str, dict[str, Any]]]:
    with sessions() as session:
        rows = session.scalars(select(Action).where(Action.kind == ACTION_KIND).order_by(Action.id)).all()
        return [(r.status, dict(r.detail or {})) for r in rows]


def test_quota_drops_by_a_node_when_healer_quarantines_it_and_comes_back_when_it_returns(
    scene: Scene,
) -> None:
    actions, sessions, fleet, custom = scene.actions, scene.sessions, scene.fleet, scene.custom
    job = sync(scene, hysteresis=4, lower_after_seconds=30)
    assert [d.set_to for d in job.run(T0)] == [None]  # 24 GPUs healthy, quota 24
    bad = fleet["nodes"][0]
    quarantine(actions, bad)

    (waiting,) = job.run(T0 + timedelta(seconds=1))
    assert (waiting.capacity, waiting.set_to) == (16, None) and "lowered in 30 s" in waiting.reason
    assert gpu_quota(custom, fleet) == "24"

    (lowered,) = job.run(T0 + timedelta(seconds=31))  # 30 s after the shortfall was seen
    assert lowered.set_to == 16
    assert gpu_quota(custom, fleet) == "16"
    got = custom.get_cluster_custom_object(GROUP, "v1beta2", PLURAL, fleet["queue"])
    managers = {m["manager"]: m["operation"] for m in got["metadata"]["managedFields"]}
    assert managers.get("healer-kueue") == "Apply"
    cpu = got["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]
    assert cpu == {"name": "cpu", "nominalQuota": "192"}  # the rest of the atomic list as it was
    assert got["spec"]["resourceGroups"][1]["flavors"][0]["name"] == "default"

    actions.release(bad, now=T0 + timedelta(minutes=5))
    (raised,) = job.run(T0 + timedelta(seconds=40))
    assert raised.set_to == 24 and gpu_quota(custom, fleet) == "24"
    assert [(s, d["from"], d["to"], d["capacity"]) for s, d in recorded(sessions)] == [
        ("succeeded", 24, 16, 16),
        ("succeeded", 16, 24, 24),
    ]


@pytest.mark.parametrize("mode", ["dra", "annotation"])
def test_each_gpu_taken_out_lowers_the_quota_by_one_until_it_returns(scene: Scene, mode: str) -> None:
    """A GPU out (DeviceTaintRule, or the node annotation) is not healthy capacity; the node itself
    stays in service, so only that GPU leaves the quota, under the same hysteresis."""
    fleet, custom = scene.fleet, scene.custom
    isolation = GpuIsolation(scene.api, GpuIsolationSettings(mode=mode), domain="healer.dev")
    metrics = HealerMetrics()
    job = sync(scene, gpus_out=count_out(isolation), metrics=metrics, hysteresis=2, lower_after_seconds=0)
    first, second = fleet["nodes"][:2]
    isolation.isolate(first, "3", "RowRemapFailed")
    (within,) = job.run(T0)  # one GPU short, within the hysteresis of 2: left alone
    assert (within.capacity, within.set_to) == (23, None) and gpu_quota(custom, fleet) == "24"
    labels = {"cluster_queue": fleet["queue"], "flavor": fleet["flavor"]}
    assert metrics.registry.get_sample_value("healer_kueue_nominal_quota", labels) == 24
    assert metrics.registry.get_sample_value("healer_kueue_healthy_capacity", labels) == 23
    isolation.isolate(second, "5", "RowRemapFailed")
    (lowered,) = job.run(T0 + timedelta(seconds=30))
    assert (lowered.capacity, lowered.set_to) == (22, 22) and gpu_quota(custom, fleet) == "22"
    assert metrics.registry.get_sample_value("healer_kueue_nominal_quota", labels) == 22
    isolation.restore(first, "3")
    (raised,) = job.run(T0 + timedelta(seconds=60))  # raised at once
    assert (raised.capacity, raised.set_to) == (23, 23) and gpu_quota(custom, fleet) == "23"
    isolation.restore(second, "5")
    job.run(T0 + timedelta(seconds=90))
    assert gpu_quota(custom, fleet) == "24"
    assert [(d["from"], d["to"]) for _, d in recorded(scene.sessions)] == [(24, 22), (22, 23), (23, 24)]


def test_a_gpu_out_the_device_plugin_already_dropped_is_not_counted_twice(
    kube: ControlPlane, scene: Scene
) -> None:
    fleet, custom = scene.fleet, scene.custom
    isolation = GpuIsolation(scene.api, GpuIsolationSettings(mode="annotation"), domain="healer.dev")
    job = sync(scene, gpus_out=count_out(isolation), lower_after_seconds=0)
    bad = fleet["nodes"][0]
    isolation.isolate(bad, "3", "RowRemapFailed")
    with kube.admin_client() as api:  # a plugin honouring healer.dev/gpus-out: allocatable 7 of 8
        core = k8s.CoreV1Api(api)
        core.patch_node_status(bad, {"status": {"allocatable": {GPU: "7"}}})
        wait_until(lambda: core.read_node(bad).status.allocatable[GPU] == "7", what="allocatable 7")
    (decision,) = job.run(T0)
    assert (decision.capacity, decision.set_to) == (23, 23) and gpu_quota(custom, fleet) == "23"


def test_quota_never_goes_below_the_floor(scene: Scene) -> None:
    actions, fleet, custom = scene.actions, scene.fleet, scene.custom
    job = sync(scene, floor=12, lower_after_seconds=0)
    for name in fleet["nodes"][:2]:
        quarantine(actions, name)
    (decision,) = job.run(T0)
    assert (decision.capacity, decision.set_to) == (8, 12)
    assert gpu_quota(custom, fleet) == "12"
    quarantine(actions, fleet["nodes"][2])
    (none_left,) = job.run(T0 + timedelta(seconds=30))
    assert (none_left.capacity, none_left.set_to) == (0, None)
    assert gpu_quota(custom, fleet) == "12"


def test_quota_does_not_oscillate_within_the_hysteresis(kube: ControlPlane, scene: Scene) -> None:
    actions, sessions, fleet, custom = scene.actions, scene.sessions, scene.fleet, scene.custom
    job = sync(scene, hysteresis=4, lower_after_seconds=60)
    before = version_of(custom, fleet)
    flapping = fleet["nodes"][1]
    # A node out and back, twice, each time for less than lower_after_seconds: no write.
    for start in (0, 100):
        quarantine(actions, flapping)
        job.run(T0 + timedelta(seconds=start))
        job.run(T0 + timedelta(seconds=start + 50))
        actions.release(flapping, now=T0)
        job.run(T0 + timedelta(seconds=start + 70))
    # Two GPUs gone from allocatable (fell off the bus): within the hysteresis of 4, for long.
    with kube.admin_client() as api:
        core = k8s.CoreV1Api(api)
        core.patch_node_status(fleet["nodes"][2], {"status": {"allocatable": {GPU: "6"}}})
        wait_until(
            lambda: core.read_node(fleet["nodes"][2]).status.allocatable[GPU] == "6",
            what="allocatable 6 GPUs",
        )
    for minutes in (5, 10, 60):
        (decision,) = job.run(T0 + timedelta(minutes=minutes))
        assert decision.capacity == 22 and decision.set_to is None, decision.reason
    assert version_of(custom, fleet) == before and gpu_quota(custom, fleet) == "24"
    assert recorded(sessions) == []


def test_dry_run_records_the_quota_it_would_set_and_changes_nothing(scene: Scene) -> None:
    actions, sessions, fleet, custom = scene.actions, scene.sessions, scene.fleet, scene.custom
    job = sync(scene, dry_run=True, lower_after_seconds=0)
    quarantine(actions, fleet["nodes"][0])
    job.run(T0)
    job.run(T0 + timedelta(seconds=30))  # already "set": not recorded twice
    assert gpu_quota(custom, fleet) == "24"
    assert [(s, d["from"], d["to"]) for s, d in recorded(sessions)] == [("dry_run", 24, 16)]


def test_kueue_version_is_discovered(kube_healer_api: ApiClient, kueue_crd: None) -> None:
    assert KueueQuotas(kube_healer_api).version() == "v1beta2"


def test_the_controller_built_by_healer_run_syncs_the_quota_once_it_leads(
    kube: ControlPlane, kube_healer_token: str, scene: Scene, tmp_path: Path, migrated_sqlite_url: str
) -> None:
    """The composition root wires the sync in when ``kueue.enabled``; only the leader applies."""
    fleet, custom = scene.fleet, scene.custom
    settings = load_settings(
        rules_paths=[REPO / "rules"],
        database={"url": migrated_sqlite_url},
        kubernetes={
            "kubeconfig": kube.kubeconfig(kube_healer_token, tmp_path / "kubeconfig"),
            "lease_name": unique("lease"),
        },
        safety={"dry_run": False, "allow_missing_providers": True},
        kueue={
            "enabled": True,
            "cluster_queues": [fleet["queue"]],
            "flavors": [{"name": fleet["flavor"], "node_labels": {"healer-test/flavor": fleet["flavor"]}}],
            "lower_after_seconds": 0,
        },
    )
    process = build_process(settings, identity="healer-kueue-test")
    try:
        quarantine(scene.actions, fleet["nodes"][0])
        process.controller.kueue()
        assert gpu_quota(custom, fleet) == "24"  # not the leader: nothing applied
        process.controller.keep_lease()
        process.controller.kueue()
        assert gpu_quota(custom, fleet) == "16"
        isolation = GpuIsolation(scene.api, GpuIsolationSettings(), domain="healer.dev")
        isolation.isolate(fleet["nodes"][1], "2", "RowRemapFailed")  # one GPU out (DRA)
        process.controller.kueue()
        assert gpu_quota(custom, fleet) == "15"
        with http_client(process.app) as c:
            samples = dict(re.findall(r"^(\S+) (\S+)$", c.get("/metrics").text, flags=re.M))
        labels = f'{{cluster_queue="{fleet["queue"]}",flavor="{fleet["flavor"]}"}}'
        assert samples[f"healer_kueue_nominal_quota{labels}"] == "15.0"
        assert samples[f"healer_kueue_healthy_capacity{labels}"] == "15.0"
        isolation.restore(fleet["nodes"][1], "2")
        process.controller.kueue()
        assert gpu_quota(custom, fleet) == "16"
    finally:
        process.controller.stop()


def served_versions(api: ApiClient) -> set[str]:
    """The versions of Kueue's group the API server's discovery lists now."""
    groups = k8s.ApisApi(api).get_api_versions().groups or []
    return {v.version for g in groups if g.name == GROUP for v in g.versions or []}


@contextlib.contextmanager
def serving_only_v1beta1(kube: ControlPlane) -> Iterator[None]:
    """Kueue's CRD as an older Kueue serves it: ``v1beta1`` only (``v1beta2`` stays the storage
    version, unserved), until the block ends; then both again. The control plane is this worker's
    alone and its tests run one at a time, so the others never see the change."""
    crd = yaml.safe_load((FIXTURES / "kueue-clusterqueue-crd.yaml").read_text())
    index = next(i for i, v in enumerate(crd["spec"]["versions"]) if v["name"] == "v1beta2")
    with kube.admin_client() as api:
        ext = k8s.ApiextensionsV1Api(api)

        def serve_v1beta2(served: bool) -> None:
            patch = [{"op": "replace", "path": f"/spec/versions/{index}/served", "value": served}]
            ext.patch_custom_resource_definition(crd["metadata"]["name"], patch)
            want = {"v1beta1", "v1beta2"} if served else {"v1beta1"}
            wait_until(
                lambda: served_versions(api) == want, timeout=30, interval=0.2, what=f"Kueue serves {want}"
            )

        serve_v1beta2(False)
        try:
            yield
        finally:
            serve_v1beta2(True)


def test_without_v1beta2_healer_falls_back_to_v1beta1_and_rediscovers_after_a_404(
    kube: ControlPlane, scene: Scene
) -> None:
    """An older Kueue serves ``kueue.x-k8s.io/v1beta1`` only: healer reads and applies through it;
    a client that discovered ``v1beta2`` before (Kueue downgraded under it) gets a 404 once, then
    discovers again."""
    actions, fleet, custom = scene.actions, scene.fleet, scene.custom
    upgraded = KueueQuotas(scene.api)
    assert upgraded.version() == "v1beta2"
    with serving_only_v1beta1(kube):
        assert KueueQuotas(scene.api).version() == "v1beta1"
        with pytest.raises(KubernetesNotFound):
            upgraded.read(fleet["queue"])
        assert upgraded.read(fleet["queue"]).version == "v1beta1"

        job = sync(scene, lower_after_seconds=0)
        quarantine(actions, fleet["nodes"][0])
        (lowered,) = job.run(T0)
        assert lowered.set_to == 16
        got = custom.get_cluster_custom_object(GROUP, "v1beta1", PLURAL, fleet["queue"])
        (flavor,) = got["spec"]["resourceGroups"][0]["flavors"]
        assert {r["name"]: r["nominalQuota"] for r in flavor["resources"]}[GPU] == "16"
        applied = {m["manager"]: m["apiVersion"] for m in got["metadata"]["managedFields"]}
        assert applied["healer-kueue"] == f"{GROUP}/v1beta1"
    assert gpu_quota(custom, fleet) == "16"  # the same object, read through v1beta2 again
