"""A small Kubernetes API server emulator: real HTTP on loopback, for tests and the demo.

The official ``kubernetes`` client talks to it through ``Configuration(host=emulator.host)``, so code
under test runs its real request paths (serialisation, content types, status codes). It serves what
healer calls, with the semantics a real API server has for them (the facts come from the Kubernetes
API reference and ``kubectl``'s ``pkg/drain``, see ``shared/reference/kubernetes.md``):

* every object gets ``metadata.uid``, ``creationTimestamp`` and a ``resourceVersion`` that moves on
  every write (one global counter, like etcd's revision);
* ``PUT`` and ``PATCH`` carrying a stale ``metadata.resourceVersion`` answer 409 Conflict; ``POST``
  of an existing name answers 409 AlreadyExists;
* ``PATCH`` honours the content type: ``application/json-patch+json`` (RFC 6902, the body must be a
  list), ``application/merge-patch+json`` (RFC 7386, lists replaced) and
  ``application/strategic-merge-patch+json`` (lists merged by their patch merge key, e.g. node
  ``status.conditions`` by ``type``; ``spec.taints`` is atomic, as in the real schema; directives
  ``$patch: delete|replace``, ``$deleteFromPrimitiveList/<f>``; ``null`` deletes a key);
* ``/status`` is a subresource: writes to it change only ``status``, writes to the object itself
  leave ``status`` alone (Nodes and Pods);
* list ``fieldSelector`` (``a=b``, ``a==b``, ``a!=b`` on the fields each resource registers, e.g.
  ``spec.nodeName``; others are 400) and ``labelSelector`` (``=``, ``!=``, ``in``, ``notin``,
  exists, ``!``exists);
* ``POST .../pods/{name}/eviction`` (policy/v1 Eviction) evaluates PodDisruptionBudgets of the
  pod's namespace: several matching budgets → 500; a budget with no disruption allowed → 429 with
  the real ``Status`` body (cause ``DisruptionBudget``); otherwise the pod is deleted (201).
  Pods not Running (Pending, Succeeded, Failed) or already terminating ignore budgets, as in
  ``pkg/registry/core/pod/storage/eviction.go``; a ``preconditions.uid`` mismatch → 409;
* PodDisruptionBudget ``status`` (expectedPods, currentHealthy, desiredHealthy,
  disruptionsAllowed) is computed on every read the way the disruption controller does;
  an evicted controller-owned pod keeps counting as expected (its replacement is not healthy yet)
  until :meth:`KubernetesEmulator.reschedule_evicted` or ``auto_reschedule`` brings it back;
* deleting a pod: gone at once, or, with ``terminating_seconds > 0``, terminating
  (``deletionTimestamp`` set) for that many wall-clock seconds first;
* Events (core ``v1`` and ``events.k8s.io/v1``, each listed in both APIs), Leases
  (``coordination.k8s.io/v1``), Namespaces;
* the real server's validation (:mod:`healer_dev.k8s_emulator.server_checks`): 422 for a
  ``generateName`` ending in anything but ``-``, Node Events outside ``default``, taint keys and
  values, label keys and values, Pods without containers; 400 for MicroTime fields without six
  fractional digits.

Watch is served for PodDisruptionBudgets (status changes as MODIFIED events), Nodes and Pods.
Not emulated: other watches, pagination (``limit`` is ignored, everything is returned), server-side apply,
admission, RBAC, the node lifecycle controller (cordoning does not add the
``node.kubernetes.io/unschedulable`` taint), PDB ``unhealthyPodEvictionPolicy``.

Usage::

    with KubernetesEmulator() as emu:
        emu.load([node("gpu-1"), pod("web-1", node_name="gpu-1", owner=("ReplicaSet", "web-5d8"))])
        with emu.api_client() as api:
            CoreV1Api(api).patch_node("gpu-1", {...}, _content_type=STRATEGIC_MERGE)
        emu.evictions  # [("default/web-1", 201), ...]

Modules, one concern each::

    resources   the served resource types, the Status error answer
    objects     builders: namespaces, GPU nodes, pods, PodDisruptionBudgets, a fleet
    patches     JSON, merge and strategic-merge PATCH
    selectors   field and label selectors
    validation  admission checks (Events)
    state       the object store and its resourceVersion
    pods        PDB status, scheduling, graceful deletion, the Eviction API
    rest        request dispatch (list, create, get, update, delete, evict)
    server      the HTTP server, client helpers, direct state access, ``main``

Imports only the standard library (and ``kubernetes`` lazily, for :meth:`KubernetesEmulator.api_client`).
"""

from __future__ import annotations

from healer_dev.k8s_emulator.objects import gpu_fleet, namespace, node, pod, pod_disruption_budget
from healer_dev.k8s_emulator.patches import json_merge_patch, json_patch, strategic_merge_patch
from healer_dev.k8s_emulator.resources import (
    JSON_PATCH,
    MERGE_PATCH,
    MIRROR_ANNOTATION,
    RESOURCES,
    STRATEGIC_MERGE_PATCH,
    ApiError,
)
from healer_dev.k8s_emulator.selectors import (
    match_field_selector,
    match_label_selector,
    match_label_selector_string,
)
from healer_dev.k8s_emulator.server import KubernetesEmulator, main
from healer_dev.k8s_emulator.state import Eviction

__all__ = [
    "JSON_PATCH",
    "MERGE_PATCH",
    "MIRROR_ANNOTATION",
    "RESOURCES",
    "STRATEGIC_MERGE_PATCH",
    "ApiError",
    "Eviction",
    "KubernetesEmulator",
    "gpu_fleet",
    "json_merge_patch",
    "json_patch",
    "main",
    "match_field_selector",
    "match_label_selector",
    "match_label_selector_string",
    "namespace",
    "node",
    "pod",
    "pod_disruption_budget",
    "strategic_merge_patch",
]
