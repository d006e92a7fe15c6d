"""Every pod and every PodDisruptionBudget of the cluster, from watches (:mod:`.watch_cache`): what
a drain reads, so a drain step lists neither (it still confirms with one field-selected LIST
before it calls a node empty: :func:`healer.actions.drain.drain_step`).

Memory: a pod is kept trimmed to what the drain's filters, the checkpoint requests and the
PodDisruptionBudget matching read (:func:`trim_pod`: names, labels, annotations without kubectl's
``last-applied-configuration``, owners, deletion time, node, volumes reduced to their name and
``emptyDir``, containers reduced to their name and resources, tolerations, phase and
conditions), under a kilobyte for most pods; a PodDisruptionBudget is small as it is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

from healer.actions.watch_cache import Watch

#: kubectl's copy of the applied manifest: as large as the pod spec, read by nobody here.
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

_META = ("name", "namespace", "uid", "resourceVersion", "labels", "ownerReferences", "deletionTimestamp")
_SPEC = ("nodeName", "nodeSelector", "priority", "priorityClassName")
_DEFAULT_TOLERATIONS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def trim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a pod healer reads (see the module); the rest is dropped."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    out_meta = {k: meta[k] for k in _META if k in meta}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != LAST_APPLIED}
    if annotations:
        out_meta["annotations"] = annotations
    out_spec: dict[str, Any] = {k: spec[k] for k in _SPEC if k in spec}
    out_spec["containers"] = [
        {k: c[k] for k in ("name", "resources") if k in c} for c in spec.get("containers") or []
    ]
    if spec.get("initContainers"):
        out_spec["initContainers"] = [
            {k: c[k] for k in ("name", "resources") if k in c} for c in spec["initContainers"]
        ]
    if spec.get("volumes"):
        out_spec["volumes"] = [{k: v[k] for k in ("name", "emptyDir") if k in v} for v in spec["volumes"]]
    if spec.get("tolerations"):
        # The two every pod gets by default (DefaultTolerationSeconds admission) say nothing.
        out_spec["tolerations"] = [t for t in spec["tolerations"] if t.get("key") not in _DEFAULT_TOLERATIONS]
    out_status: dict[str, Any] = {"phase": status["phase"]} if "phase" in status else {}
    scheduled = [
        {k: c[k] for k in ("type", "status", "reason") if k in c}
        for c in status.get("conditions") or []
        if c.get("type") == "PodScheduled"
    ]
    if scheduled:  # why a pending pod is pending (reason Unschedulable)
        out_status["conditions"] = scheduled
    return {"metadata": out_meta, "spec": out_spec, "status": out_status}


class PodWatch(Watch):
    """Every pod of the cluster, indexed by the node it is bound to (``spec.nodeName``).

    Each pod is held as compact JSON bytes (about a kilobyte for a typical pod; as a tree of
    Python dicts the same fields take several), decoded only when read: a drain reads the pods of
    one node.
    """

    PATH = "/api/v1/pods"
    WHAT = "pods"

    @staticmethod
    def trim(obj: Mapping[str, Any]) -> dict[str, Any]:
        return trim_pod(obj)

    @staticmethod
    def pack(obj: dict[str, Any]) -> Any:
        return json.dumps(obj, separators=(",", ":")).encode()

    @staticmethod
    def unpack(held: Any) -> dict[str, Any]:
        return cast(dict[str, Any], json.loads(held))

    @staticmethod
    def index(obj: Mapping[str, Any]) -> str | None:
        node = (obj.get("spec") or {}).get("nodeName")
        return str(node) if node else None

    def on_node(self, node: str) -> list[dict[str, Any]] | None:
        """The pods bound to ``node`` (trimmed, :func:`trim_pod`), or None while not synced or
        stale (the reader lists instead)."""
        return self.indexed(node)


class BudgetWatch(Watch):
    """Every PodDisruptionBudget (``policy/v1``) of the cluster, indexed by namespace."""

    PATH = "/apis/policy/v1/poddisruptionbudgets"
    WHAT = "PodDisruptionBudgets"

    @staticmethod
    def trim(obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = obj.get("metadata") or {}
        return {
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta},
            "spec": obj.get("spec") or {},
            "status": obj.get("status") or {},
        }

    @staticmethod
    def index(obj: Mapping[str, Any]) -> str | None:
        namespace = (obj.get("metadata") or {}).get("namespace")
        return str(namespace) if namespace else None

    def in_namespace(self, namespace: str) -> list[dict[str, Any]] | None:
        """The budgets of ``namespace``, or None while not synced or stale."""
        return self.indexed(namespace)
