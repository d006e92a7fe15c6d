"""Every Node of the cluster, from a watch (:mod:`.watch_cache`): the adapter and the address book
read Nodes from it, so a scheduler tick makes no LIST.

Memory: each Node is kept trimmed to the fields healer reads (:func:`trim_node`: names, labels,
annotations, taints, the GPU counts, addresses, conditions), a few kilobytes for a real Node
whose full object (images, volumes, node info) is tens of kilobytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from healer.actions.watch_cache import Watch

#: The resource a GPU node reports its GPUs as (the NVIDIA device plugin's).
GPU_RESOURCE = "nvidia.com/gpu"


def trim_node(node: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a Node healer reads (``node_view``, pools, addresses, GPU counts); the rest
    of the object (images, volumes, node info, managed fields) is dropped."""
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    out_status: dict[str, Any] = {}
    for field in ("capacity", "allocatable"):
        if field in status:  # present without the GPU resource means 0 GPUs, absent means unknown
            resources = status.get(field) or {}
            out_status[field] = {GPU_RESOURCE: resources[GPU_RESOURCE]} if GPU_RESOURCE in resources else {}
    if status.get("addresses"):
        out_status["addresses"] = status["addresses"]
    if status.get("conditions"):
        out_status["conditions"] = [
            {k: c[k] for k in ("type", "status", "reason", "message", "lastTransitionTime") if k in c}
            for c in status["conditions"]
        ]
    return {
        "metadata": {
            k: meta[k] for k in ("name", "uid", "resourceVersion", "labels", "annotations") if k in meta
        },
        "spec": {k: spec[k] for k in ("unschedulable", "taints", "providerID") if k in spec},
        "status": out_status,
    }


class NodeWatch(Watch):
    """The cluster's Nodes, listed once and then watched (:class:`~.watch_cache.Watch`)."""

    PATH = "/api/v1/nodes"
    WHAT = "nodes"

    @staticmethod
    def trim(obj: Mapping[str, Any]) -> dict[str, Any]:
        return trim_node(obj)

    def nodes(self) -> list[dict[str, Any]] | None:
        """Every Node (trimmed, :func:`trim_node`), or None while not synced or stale."""
        return self.items()
