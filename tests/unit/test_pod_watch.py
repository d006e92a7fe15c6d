"""The pod store's index follows a pod from pending to bound to deleted, and keeps what a drain
reads: events are applied as the API server sends them (``ADDED``, ``MODIFIED``, ``DELETED``)."""

from __future__ import annotations

from typing import Any

from kubernetes import client as k8s

from healer.actions.drain import Disposition, decide, typed
from healer.actions.pod_watch import LAST_APPLIED, PodWatch, trim_pod
from healer.model.drain import DrainOptions


def _pod(name: str, node: str | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "resourceVersion": "7",
            "labels": {"app": "train"},
            "annotations": {LAST_APPLIED: "{...}" * 1000, "kubernetes.io/config.mirror": "x"},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": True}
            ],
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {
            **({"nodeName": node} if node else {}),
            "containers": [
                {"name": "main", "image": "trainer:1", "env": [{"name": "A", "value": "b"}],
                 "resources": {"limits": {"nvidia.com/gpu": "8"}}}
            ],
            "volumes": [{"name": "scratch", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "c"}}],
            **spec,
        },
        "status": {"phase": "Running", "containerStatuses": [{"name": "main"}]},
    }


def _store() -> PodWatch:
    watch = PodWatch(k8s.ApiClient(), clock=lambda: 0.0)
    watch._heard_now()  # as after a list
    return watch


def test_the_node_index_follows_binding_moves_and_deletion() -> None:
    watch = _store()
    watch._apply({"type": "ADDED", "object": _pod("p", None)})
    assert watch.on_node("n1") == []
    watch._apply({"type": "MODIFIED", "object": _pod("p", "n1")})  # bound by the scheduler
    assert [p["metadata"]["name"] for p in watch.on_node("n1") or []] == ["p"]
    watch._apply({"type": "MODIFIED", "object": _pod("p", "n2")})
    assert watch.on_node("n1") == [] and len(watch.on_node("n2") or []) == 1
    watch._apply({"type": "DELETED", "object": _pod("p", "n2")})
    assert watch.on_node("n2") == [] and watch.items() == []


def test_a_trimmed_pod_keeps_what_the_drain_decides_on_and_drops_the_rest() -> None:
    kept = trim_pod(_pod("p", "n1"))
    assert LAST_APPLIED not in kept["metadata"]["annotations"]
    assert "managedFields" not in kept["metadata"]
    assert kept["spec"]["containers"] == [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]
    assert kept["spec"]["volumes"] == [{"name": "scratch", "emptyDir": {}}, {"name": "cfg"}]
    pod = typed(k8s.ApiClient(), kept, "V1Pod")
    # the mirror annotation is kept, so the drain skips the pod as kubectl does
    assert decide(pod, DrainOptions()).disposition is Disposition.KEEP
    del kept["metadata"]["annotations"]["kubernetes.io/config.mirror"]
    pod = typed(k8s.ApiClient(), kept, "V1Pod")
    refused = decide(pod, DrainOptions(delete_emptydir_data=False))
    assert refused.disposition is Disposition.REFUSE and "emptyDir" in refused.reason
    assert decide(pod, DrainOptions(delete_emptydir_data=True)).disposition is Disposition.EVICT
