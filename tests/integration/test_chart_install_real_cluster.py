"""The Helm chart installed with ``helm install`` onto the real control plane (tests/kube_cluster.py).

What a user sees after the documented install: the Deployment's pod is created, scheduled and
running (KWOK plays its kubelet) under the chart's ServiceAccount, and that ServiceAccount may do
what healer does (evict pods, patch node status, write Events and its Lease) and no more.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes.client import ApiClient

from tests.helm import CHART, IMAGE, require_helm, run_helm
from tests.kube_cluster import ControlPlane
from tests.services import wait_until

pytestmark = pytest.mark.k8s_contract


def _allowed(api: ApiClient, user: str, *, verb: str, resource: str, group: str = "", sub: str = "",
             namespace: str = "") -> bool:  # fmt: skip
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts"],
            "resourceAttributes": {
                "verb": verb,
                "resource": resource,
                "group": group,
                "subresource": sub,
                "namespace": namespace,
            },
        },
    }  # fmt: skip
    answer = k8s.AuthorizationV1Api(api).create_subject_access_review(review)  # type: ignore[arg-type]
    return bool(answer.status.allowed)


def test_helm_install_runs_healer_under_its_service_account(
    kube: ControlPlane, kube_admin: ApiClient, tmp_path: Path
) -> None:
    helm = require_helm()
    suffix = uuid.uuid4().hex[:6]
    namespace, release, group = f"healer-chart-{suffix}", f"healer-{suffix}", f"chart-{suffix}"
    kube.add_nodes([f"cpu-{suffix}"], gpus=0, labels={"healer-test/group": group})
    core = k8s.CoreV1Api(kube_admin)
    core.create_namespace({"metadata": {"name": namespace}})
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "healer-database"}, "stringData": {"url": "sqlite:////tmp/h.db"}}
    )
    kubeconfig = kube.kubeconfig(kube.admin_token, tmp_path / "admin.kubeconfig")

    placement = "nodeSelector=" + json.dumps({"healer-test/group": group})
    where = ("--namespace", namespace, "--kubeconfig", str(kubeconfig))
    result = run_helm(helm, "install", release, str(CHART), *where, *IMAGE, "--set", "replicas=1",
                      "--set-json", placement)  # fmt: skip
    assert result.returncode == 0, result.stderr

    def running() -> list[k8s.V1Pod]:
        pods = core.list_namespaced_pod(namespace, label_selector="app.kubernetes.io/name=healer").items
        return [p for p in pods if p.status.phase == "Running"]

    wait_until(lambda: running(), timeout=90, what="the chart's healer pod Running")
    (pod,) = running()
    assert pod.spec.service_account_name == release
    assert pod.spec.node_name == f"cpu-{suffix}"
    (container,) = pod.spec.containers
    assert container.image == "registry.example.com/healer:0.1.0"
    env = {e.name: e.value for e in container.env or []}
    assert env.get("HEALER_SAFETY__DRY_RUN") == "true"  # the documented first install changes nothing
    # The Xid catalog the default ladders read is installed and mounted where the settings point.
    catalog = core.read_namespaced_config_map(f"{release}-xid-catalog", namespace)
    assert "class: reset" in (catalog.data or {})["xid-catalog.yaml"]
    mounts = {m.name: m.mount_path for m in container.volume_mounts or []}
    assert mounts["xid-catalog"] == "/etc/healer/catalog"
    settings = core.read_namespaced_config_map(f"{release}-settings", namespace)
    assert "xid_catalog: /etc/healer/catalog/xid-catalog.yaml" in (settings.data or {})["healer.yaml"]

    user = f"system:serviceaccount:{namespace}:{release}"
    assert _allowed(kube_admin, user, verb="create", resource="pods", sub="eviction", namespace="default")
    assert _allowed(kube_admin, user, verb="patch", resource="nodes", sub="status")
    assert _allowed(kube_admin, user, verb="create", resource="events", group="events.k8s.io",
                    namespace="default")  # fmt: skip
    assert _allowed(kube_admin, user, verb="update", resource="leases", group="coordination.k8s.io",
                    namespace=namespace)  # fmt: skip
    # Least privilege: no Secrets anywhere, no Leases outside its namespace, no node deletion.
    assert not _allowed(kube_admin, user, verb="get", resource="secrets", namespace="default")
    assert not _allowed(kube_admin, user, verb="update", resource="leases", group="coordination.k8s.io",
                        namespace="default")  # fmt: skip
    assert not _allowed(kube_admin, user, verb="delete", resource="nodes")

    assert run_helm(helm, "uninstall", release, *where).returncode == 0
