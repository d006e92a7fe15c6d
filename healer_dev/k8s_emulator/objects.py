"""Object builders for scenarios: namespaces, GPU nodes, pods, PodDisruptionBudgets, a whole fleet."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterable

from healer_dev.k8s_emulator.resources import MIRROR_ANNOTATION, Obj, _now_iso


def namespace(name: str) -> Obj:
    """A Namespace object."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}, "spec": {}, "status": {}}


def node(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    unschedulable: bool = False,
    taints: Iterable[Obj] = (),
    gpus: int = 8,
) -> Obj:
    """A Ready Node with ``gpus`` ``nvidia.com/gpu`` capacity."""
    spec: Obj = {"taints": list(taints)} if taints else {}
    if unschedulable:
        spec["unschedulable"] = True
    capacity = {"cpu": "96", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": _now_iso(),
                    "lastTransitionTime": _now_iso(),
                }
            ],
            "addresses": [{"type": "Hostname", "address": name}],
        },
    }


def pod(
    name: str,
    *,
    node_name: str,
    namespace: str = "default",
    owner: tuple[str, str] | None = ("ReplicaSet", "app-5d8f7"),
    labels: dict[str, str] | None = None,
    empty_dir: bool = False,
    mirror: bool = False,
    phase: str = "Running",
    termination_grace_period_seconds: int = 30,
) -> Obj:
    """A Pod bound to ``node_name``.

    ``owner`` is ``(kind, name)`` of its controller (``ReplicaSet``, ``DaemonSet``, ``Job``,
    ``StatefulSet``) or ``None`` for an unmanaged pod; ``mirror`` adds the static-pod mirror
    annotation (``kubernetes.io/config.mirror``) and a Node owner, as the kubelet does.
    """
    meta: Obj = {"name": name, "namespace": namespace, "labels": dict(labels or {}), "annotations": {}}
    if owner is not None:
        kind, owner_name = owner
        api_version = {"Job": "batch/v1"}.get(kind, "apps/v1")
        meta["ownerReferences"] = [
            {
                "apiVersion": api_version,
                "kind": kind,
                "name": owner_name,
                "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{namespace}/{kind}/{owner_name}")),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    if mirror:
        meta["annotations"][MIRROR_ANNOTATION] = secrets.token_hex(16)
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": "", "controller": True}
        ]
    volumes: list[Obj] = [{"name": "scratch", "emptyDir": {}}] if empty_dir else []
    ready = "True" if phase == "Running" else "False"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "main", "image": "registry.example/app:1"}],
            "volumes": volumes,
            "terminationGracePeriodSeconds": termination_grace_period_seconds,
        },
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]},
    }


def pod_disruption_budget(
    name: str,
    *,
    namespace: str = "default",
    match_labels: dict[str, str],
    min_available: int | str | None = None,
    max_unavailable: int | str | None = None,
) -> Obj:
    """A ``policy/v1`` PodDisruptionBudget selecting pods by ``match_labels``."""
    spec: Obj = {"selector": {"matchLabels": dict(match_labels)}}
    if min_available is not None:
        spec["minAvailable"] = min_available
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def gpu_fleet(
    count: int,
    *,
    prefix: str = "gpu-node-",
    pool: str = "p4d.24xlarge",
    training_namespace: str = "training",
) -> list[Obj]:
    """``count`` GPU nodes, each with a realistic set of pods, for the demo.

    Per node: a ``dcgm-exporter`` and a ``node-exporter`` DaemonSet pod (``monitoring``), a static
    ``kube-proxy`` mirror pod (``kube-system``), a training worker owned by a Job with a scratch
    ``emptyDir``, and an inference replica owned by a ReplicaSet behind a PodDisruptionBudget
    (``maxUnavailable: 1`` over all inference replicas). Nodes are ``<prefix>00``, ``<prefix>01`` ...
    """
    width = max(2, len(str(count - 1)))
    objs: list[Obj] = [namespace(n) for n in ("monitoring", training_namespace, "inference")]
    objs.append(
        pod_disruption_budget(
            "inference", namespace="inference", match_labels={"app": "inference"}, max_unavailable=1
        )
    )
    for i in range(count):
        name = f"{prefix}{i:0{width}d}"
        labels = {"node.kubernetes.io/instance-type": pool, "nvidia.com/gpu.present": "true"}
        objs.append(node(name, labels=labels))
        objs += [
            pod(f"dcgm-exporter-{name}", node_name=name, namespace="monitoring",
                owner=("DaemonSet", "dcgm-exporter"), labels={"app": "dcgm-exporter"}),
            pod(f"node-exporter-{name}", node_name=name, namespace="monitoring",
                owner=("DaemonSet", "node-exporter"), labels={"app": "node-exporter"}),
            pod(f"kube-proxy-{name}", node_name=name, namespace="kube-system", owner=None, mirror=True,
                labels={"k8s-app": "kube-proxy"}),
            pod(f"train-worker-{i}", node_name=name, namespace=training_namespace,
                owner=("Job", "train-llm"), labels={"app": "train-llm"}, empty_dir=True),
            pod(f"inference-{i}", node_name=name, namespace="inference",
                owner=("ReplicaSet", "inference-7c9d"), labels={"app": "inference"}),
        ]  # fmt: skip
    return objs
