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
* the real server's validation (:mod:`healer.testing.k8s_validation`): 422 for a ``generateName``
  ending in anything but ``-``, Node Events outside ``default``, taint keys and values, label keys
  and values, Pods without containers; 400 for MicroTime fields without six fractional digits.

Not emulated: watch, pagination (``limit`` is ignored, everything is returned), server-side apply,
admission, RBAC, the node lifecycle controller (cordoning does not add the
``node.kubernetes.io/unschedulable`` taint), PDB ``unhealthyPodEvictionPolicy``.

Usage::

    with KubernetesEmulator() as emu:
        emu.load([node("gpu-1"), pod("web-1", node_name="gpu-1", owner=("ReplicaSet", "web-5d8"))])
        with emu.api_client() as api:
            CoreV1Api(api).patch_node("gpu-1", {...}, _content_type=STRATEGIC_MERGE)
        emu.evictions  # [("default/web-1", 201), ...]

Imports only the standard library (and ``kubernetes`` lazily, for :meth:`api_client`).
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import json
import math
import re
import secrets
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from healer.testing import k8s_validation

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, Configuration

Obj = dict[str, Any]

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


@dataclass(frozen=True)
class Resource:
    """One served resource type: ``group_version`` as in ``apiVersion``, ``plural`` as in URLs."""

    group_version: str
    plural: str
    kind: str
    namespaced: bool
    has_status: bool = False


RESOURCES: tuple[Resource, ...] = (
    Resource("v1", "nodes", "Node", namespaced=False, has_status=True),
    Resource("v1", "namespaces", "Namespace", namespaced=False),
    Resource("v1", "pods", "Pod", namespaced=True, has_status=True),
    Resource("v1", "events", "Event", namespaced=True),
    Resource("events.k8s.io/v1", "events", "Event", namespaced=True),
    Resource("coordination.k8s.io/v1", "leases", "Lease", namespaced=True),
    Resource("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget", namespaced=True, has_status=True),
)
_BY_PATH = {(r.group_version, r.plural): r for r in RESOURCES}
_BY_KIND = {(r.group_version, r.kind): r for r in RESOURCES}

#: Strategic-merge patch merge keys by field name (``x-kubernetes-patch-merge-key`` in the API's
#: OpenAPI schema). Fields not listed are replaced whole (``spec.taints`` and ``tolerations`` are
#: atomic lists in the real schema).
MERGE_KEYS: dict[str, str] = {
    "conditions": "type",
    "addresses": "type",
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "env": "name",
    "ports": "containerPort",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
}
#: Primitive lists merged as sets by strategic-merge patch.
PRIMITIVE_MERGE: frozenset[str] = frozenset({"finalizers"})


class ApiError(Exception):
    """An answer other than success, rendered as a ``Status`` object with ``code``."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def body(self) -> Obj:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _not_found(res: Resource, name: str) -> ApiError:
    group = res.group_version.split("/")[0] if "/" in res.group_version else ""
    what = f"{res.plural}.{group}" if group else res.plural
    return ApiError(
        404, "NotFound", f'{what} "{name}" not found', {"name": name, "group": group, "kind": res.plural}
    )


def _conflict(res: Resource, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {res.plural} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        {"name": name, "kind": res.plural},
    )


# --- patches --------------------------------------------------------------------------------------


def json_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge recursively, ``null`` deletes, everything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = json_merge_patch(result.get(key), value)
    return result


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$") and v is not None}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value if not (isinstance(v, dict) and "$patch" in v)]
    return copy.deepcopy(value)


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Kubernetes strategic-merge patch with the merge keys in :data:`MERGE_KEYS`."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return _strip_directives(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith(("$setElementOrder/", "$retainKeys", "$patch")):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [x for x in result.get(name) or [] if x not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            if value.get("$patch") == "delete":
                result.pop(key, None)
            else:
                result[key] = strategic_merge_patch(result.get(key), value)
        elif isinstance(value, list) and key in MERGE_KEYS:
            result[key] = _merge_list(result.get(key) or [], value, MERGE_KEYS[key])
        elif isinstance(value, list) and key in PRIMITIVE_MERGE:
            merged = list(result.get(key) or [])
            merged += [v for v in value if v not in merged]
            result[key] = merged
        else:
            result[key] = _strip_directives(value)
    return result


def _merge_list(target: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
        return [_strip_directives(i) for i in patch if not (isinstance(i, dict) and "$patch" in i)]
    out = [copy.deepcopy(i) for i in target]
    for item in patch:
        if not isinstance(item, dict):
            out.append(copy.deepcopy(item))
            continue
        key = item.get(merge_key)
        idx = next(
            (n for n, old in enumerate(out) if isinstance(old, dict) and old.get(merge_key) == key), None
        )
        if item.get("$patch") == "delete":
            out = [o for o in out if not (isinstance(o, dict) and o.get(merge_key) == key)]
        elif idx is None:
            out.append(_strip_directives(item))
        else:
            out[idx] = strategic_merge_patch(out[idx], item)
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"json patch path {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, list):
            doc = doc[int(part)]
        elif isinstance(doc, dict):
            doc = doc[part]
        else:
            raise KeyError(part)
    return doc


def json_patch(doc: Any, ops: list[Any]) -> Any:
    """RFC 6902 (add, remove, replace, move, copy, test). Raises ApiError 422 on a bad op."""
    doc = copy.deepcopy(doc)
    for op in ops:
        try:
            kind = op["op"]
            parts = _pointer(op["path"])
            if kind == "test":
                if _walk(doc, parts) != op["value"]:
                    raise ApiError(422, "Invalid", f"json patch test failed at {op['path']}")
                continue
            if kind in ("move", "copy"):
                value = copy.deepcopy(_walk(doc, _pointer(op["from"])))
                if kind == "move":
                    doc = json_patch(doc, [{"op": "remove", "path": op["from"]}])
                doc = json_patch(doc, [{"op": "add", "path": op["path"], "value": value}])
                continue
            parent = _walk(doc, parts[:-1])
            last = parts[-1]
            if kind == "remove":
                if isinstance(parent, list):
                    parent.pop(int(last))
                else:
                    del parent[last]
            elif kind in ("add", "replace"):
                value = copy.deepcopy(op["value"])
                if isinstance(parent, list):
                    if last == "-":
                        parent.append(value)
                    elif kind == "add":
                        parent.insert(int(last), value)
                    else:
                        parent[int(last)] = value
                else:
                    if kind == "replace" and last not in parent:
                        raise KeyError(last)
                    parent[last] = value
            else:
                raise ApiError(422, "Invalid", f"unknown json patch op {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise ApiError(422, "Invalid", f"json patch {op!r} does not apply: {exc!r}") from exc
    return doc


# --- selectors ------------------------------------------------------------------------------------


def _dotted(obj: Obj, path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def match_field_selector(obj: Obj, selector: str) -> bool:
    """``spec.nodeName=gpu-1,status.phase!=Succeeded`` (``=``, ``==``, ``!=`` on dotted paths)."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            path, want = term.split("!=", 1)
            if str(_dotted(obj, path.strip()) or "") == want.strip():
                return False
        else:
            path, want = re.split(r"==?", term, maxsplit=1)
            if str(_dotted(obj, path.strip()) or "") != want.strip():
                return False
    return True


_SET_TERM = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_label_selector(selector: str) -> list[str]:
    terms, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    terms.append(cur)
    return [t.strip() for t in terms if t.strip()]


def match_label_selector_string(labels: dict[str, str], selector: str) -> bool:
    """``labelSelector`` syntax: ``a=b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a``, ``!a``."""
    for term in _split_label_selector(selector):
        m = _SET_TERM.match(term)
        if m:
            key, op, raw = m.groups()
            values = {v.strip() for v in raw.split(",")}
            if (op == "in") != (labels.get(key) in values):
                return False
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (s.strip() for s in re.split(r"==?", term, maxsplit=1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def match_label_selector(labels: dict[str, str], selector: Obj | None) -> bool:
    """A ``metav1.LabelSelector`` (matchLabels, matchExpressions). ``None`` matches nothing, ``{}`` all."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


# --- object builders (scenarios) --------------------------------------------------------------------


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


# --- the emulator ---------------------------------------------------------------------------------


@dataclass
class Eviction:
    """One eviction request as the emulator answered it."""

    pod: str  # "namespace/name"
    uid: str
    code: int
    at: float = field(default_factory=time.time)


@dataclass
class _Injected:
    method: str
    path_pattern: re.Pattern[str]
    code: int
    times: int


class KubernetesEmulator:
    """A threaded HTTP server on 127.0.0.1 holding Kubernetes objects in memory.

    Args:
        terminating_seconds: a deleted or evicted pod stays terminating (``deletionTimestamp``
            set) for ``min(grace period, this)`` wall-clock seconds before it disappears; 0 = at once.
        auto_reschedule: an evicted pod owned by a ReplicaSet, StatefulSet or Job is recreated at
            once, Running, on another schedulable node (as its controller and the scheduler
            would), so PodDisruptionBudgets let the next eviction through. Off: the evicted
            replica keeps counting as expected-but-unhealthy until :meth:`reschedule_evicted`.
        emulate_kubelet: a pod created through the API is bound to the first schedulable node
            (if it names none) and reported Running and Ready at once; off: it stays Pending.
        port: TCP port, 0 = any free port.
    """

    def __init__(
        self,
        *,
        terminating_seconds: float = 0.0,
        auto_reschedule: bool = False,
        emulate_kubelet: bool = True,
        port: int = 0,
    ):
        self.terminating_seconds = terminating_seconds
        self.emulate_kubelet = emulate_kubelet
        self.auto_reschedule = auto_reschedule
        self._port = port
        self._lock = threading.RLock()
        self._store: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {
            (r.group_version, r.plural): {} for r in RESOURCES
        }
        self._rv = 1000
        self._ghosts: list[Obj] = []  # evicted controller-owned pods whose replacement is not up
        self._terminating: dict[tuple[str, str], float] = {}  # (ns, name) -> monotonic removal time
        self._injected: list[_Injected] = []
        # Bounded so a long demo does not grow without limit; tests read them as sequences.
        self.requests: deque[tuple[str, str]] = deque(maxlen=100_000)  # (method, path with query)
        self.evictions: deque[Eviction] = deque(maxlen=100_000)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.add(namespace(ns))

    # -- lifecycle --

    def start(self) -> KubernetesEmulator:
        """Start serving in a daemon thread; :attr:`host` is valid afterwards."""
        emulator = self

        class Handler(_Handler):
            emu = emulator

        server = ThreadingHTTPServer(("127.0.0.1", self._port), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.05,), name="k8s-emulator", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close open client connections."""
        if self._server is None:
            return
        self._server.shutdown()
        with self._lock:
            for conn in list(self._connections):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> KubernetesEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def host(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:40123``."""
        if self._server is None:
            raise RuntimeError("emulator not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def configuration(self) -> Configuration:
        """A kubeconfig-less client ``Configuration`` pointing at this emulator."""
        from kubernetes.client import Configuration

        return Configuration(host=self.host)

    def api_client(self) -> ApiClient:
        """A new official-client ``ApiClient`` for this emulator; close it (or use ``with``)."""
        from kubernetes.client import ApiClient

        return ApiClient(self.configuration())

    def write_kubeconfig(self, path: Path, *, context: str = "emulator") -> Path:
        """Write a kubeconfig pointing at this emulator (for ``healer run`` and ``kubectl``)."""
        import yaml

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": context, "cluster": {"server": self.host}}],
            "users": [{"name": context, "user": {"token": "emulator"}}],
            "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
            "current-context": context,
        }
        path.write_text(yaml.safe_dump(config))
        return path

    # -- direct state access (scenarios, assertions) --

    def add(self, obj: Obj) -> Obj:
        """Store ``obj`` as if created (uid, resourceVersion, timestamps); its namespace is created
        if missing. Replaces an object of the same name. Returns the stored copy."""
        res = self._resource_of(obj)
        with self._lock:
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            ns = meta.get("namespace", "default") if res.namespaced else ""
            if res.namespaced:
                meta["namespace"] = ns
                if ("", ns) not in self._store[("v1", "namespaces")]:
                    self.add(namespace(ns))
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now_iso())
            meta["resourceVersion"] = self._next_rv()
            self._store[(res.group_version, res.plural)][(ns, meta["name"])] = obj
            return copy.deepcopy(obj)

    def load(self, objects: Iterable[Obj]) -> None:
        """Add every object (namespaces first)."""
        objs = list(objects)
        for obj in sorted(objs, key=lambda o: o.get("kind") != "Namespace"):
            self.add(obj)

    def load_file(self, path: Path) -> None:
        """Load a YAML (multi-document, or a ``List`` with ``items``) or JSON scenario file."""
        import yaml

        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        objs: list[Obj] = []
        for d in docs:
            objs += d["items"] if d.get("kind", "").endswith("List") or "items" in d else [d]
        self.load(objs)

    def get(self, kind: str, name: str, namespace: str = "", api_version: str = "v1") -> Obj | None:
        """A deep copy of the stored object, or None."""
        res = _BY_KIND[(api_version, kind)]
        with self._lock:
            self._sweep()
            found = self._store[(res.group_version, res.plural)].get(
                ((namespace or "default") if res.namespaced else "", name)
            )
            return copy.deepcopy(self._with_status(res, found)) if found else None

    def list(self, kind: str, namespace: str | None = None, api_version: str = "v1") -> builtins.list[Obj]:
        """Deep copies of the stored objects of a kind (one namespace, or all)."""
        res = _BY_KIND[(api_version, kind)]
        with self._lock:
            self._sweep()
            return [
                copy.deepcopy(self._with_status(res, o))
                for (ns, _), o in sorted(self._store[(res.group_version, res.plural)].items())
                if namespace is None or ns == namespace
            ]

    def delete(self, kind: str, name: str, namespace: str = "", api_version: str = "v1") -> None:
        """Remove an object at once (e.g. a node deleted mid-remediation)."""
        res = _BY_KIND[(api_version, kind)]
        with self._lock:
            ns = (namespace or "default") if res.namespaced else ""
            self._store[(res.group_version, res.plural)].pop((ns, name), None)
            self._next_rv()

    def pods_on(self, node_name: str) -> builtins.list[str]:
        """``namespace/name`` of the pods bound to a node (terminating ones included)."""
        return [
            f"{p['metadata']['namespace']}/{p['metadata']['name']}"
            for p in self.list("Pod")
            if p["spec"].get("nodeName") == node_name
        ]

    def finish_terminating(self) -> None:
        """Remove every terminating pod now (their grace period is over)."""
        with self._lock:
            for key in list(self._terminating):
                self._store[("v1", "pods")].pop(key, None)
            self._terminating.clear()
            self._next_rv()

    def reschedule_evicted(self, node_name: str) -> builtins.list[str]:
        """Recreate the evicted controller-owned pods, Running on ``node_name``; returns their names."""
        with self._lock:
            ghosts, self._ghosts = self._ghosts, []
            return [self._recreate(g, node_name) for g in ghosts]

    def inject_error(self, method: str, path_regex: str, code: int, *, times: int = 1) -> None:
        """Answer the next ``times`` requests matching ``method`` and ``path_regex`` with ``code``."""
        with self._lock:
            self._injected.append(_Injected(method.upper(), re.compile(path_regex), code, times))

    def eviction_count(self, pod_key: str) -> int:
        """How many eviction requests for ``namespace/name`` were accepted (201)."""
        return sum(1 for e in self.evictions if e.pod == pod_key and e.code == 201)

    # -- internals --

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    @staticmethod
    def _resource_of(obj: Obj) -> Resource:
        key = (obj.get("apiVersion", "v1"), obj.get("kind", ""))
        if key not in _BY_KIND:
            raise ValueError(f"the emulator does not serve {key[0]} {key[1]}")
        return _BY_KIND[key]

    def _sweep(self) -> None:
        now = time.monotonic()
        for key, when in list(self._terminating.items()):
            if when <= now:
                self._store[("v1", "pods")].pop(key, None)
                del self._terminating[key]

    def _with_status(self, res: Resource, obj: Obj) -> Obj:
        if res.kind == "PodDisruptionBudget":
            obj["status"] = self._pdb_status(obj)
        return obj

    def _pdb_status(self, pdb: Obj) -> Obj:
        ns = pdb["metadata"]["namespace"]
        selector = pdb["spec"].get("selector")
        matching = [
            p
            for (pns, _), p in self._store[("v1", "pods")].items()
            if pns == ns
            and match_label_selector(p["metadata"].get("labels") or {}, selector)
            and not p["metadata"].get("deletionTimestamp")
        ]
        ghosts = [
            g
            for g in self._ghosts
            if g["metadata"]["namespace"] == ns
            and match_label_selector(g["metadata"].get("labels") or {}, selector)
        ]
        expected = len(matching) + len(ghosts)
        healthy = sum(1 for p in matching if _pod_ready(p))
        spec = pdb["spec"]
        if spec.get("maxUnavailable") is not None:
            desired = max(0, expected - _scaled(spec["maxUnavailable"], expected))
        elif spec.get("minAvailable") is not None:
            desired = _scaled(spec["minAvailable"], expected)
        else:
            desired = 1  # neither set: the old policy/v1beta1 default of minAvailable 1
        return {
            "observedGeneration": pdb["metadata"].get("generation", 1),
            "expectedPods": expected,
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "disruptionsAllowed": max(0, healthy - desired),
            "conditions": [
                {
                    "type": "DisruptionAllowed",
                    "status": "True" if healthy > desired else "False",
                    "reason": "SufficientPods" if healthy > desired else "InsufficientPods",
                    "message": "",
                    "lastTransitionTime": _now_iso(),
                    "observedGeneration": 1,
                }
            ],
        }

    def _schedule_and_run(self, obj: Obj) -> None:
        """What the scheduler and the kubelet would do, at once: bind to the first schedulable
        node (by name) when unbound, then report Running and Ready."""
        spec = obj.setdefault("spec", {})
        if not spec.get("nodeName"):
            schedulable = sorted(
                n["metadata"]["name"]
                for n in self._store[("v1", "nodes")].values()
                if not n.get("spec", {}).get("unschedulable")
            )
            if not schedulable:
                return
            spec["nodeName"] = schedulable[0]
        obj["status"] = {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "startTime": _now_iso(),
        }

    def _recreate(self, ghost: Obj, node_name: str) -> str:
        fresh = copy.deepcopy(ghost)
        meta = fresh["metadata"]
        base = meta["name"].rsplit("-", 1)[0] if "-" in meta["name"] else meta["name"]
        meta["name"] = f"{base}-{secrets.token_hex(3)[:5]}"
        for k in ("uid", "resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(k, None)
        fresh["spec"]["nodeName"] = node_name
        fresh["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        self.add(fresh)
        return f"{meta['namespace']}/{meta['name']}"

    def _delete_pod(self, obj: Obj, grace: int | None) -> Obj:
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        if grace is None or grace < 0:
            grace = int(obj["spec"].get("terminationGracePeriodSeconds", 30))
        if self.terminating_seconds > 0 and grace > 0 and obj["status"].get("phase") == "Running":
            if not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"]["deletionTimestamp"] = (
                    datetime.now(UTC) + timedelta(seconds=grace)
                ).strftime("%Y-%m-%dT%H:%M:%SZ")
                obj["metadata"]["deletionGracePeriodSeconds"] = grace
                obj["metadata"]["resourceVersion"] = self._next_rv()
                self._terminating[key] = time.monotonic() + min(grace, self.terminating_seconds)
            return copy.deepcopy(obj)
        self._store[("v1", "pods")].pop(key, None)
        self._next_rv()
        return copy.deepcopy(obj)

    def _controller_owned(self, obj: Obj) -> bool:
        return any(
            ref.get("controller") and ref.get("kind") in ("ReplicaSet", "StatefulSet", "Job")
            for ref in obj["metadata"].get("ownerReferences") or []
        )

    def _evict(self, ns: str, name: str, body: Obj) -> tuple[int, Obj]:
        pods = self._store[("v1", "pods")]
        res = _BY_PATH[("v1", "pods")]
        obj = pods.get((ns, name))
        if obj is None:
            self.evictions.append(Eviction(f"{ns}/{name}", "", 404))
            raise _not_found(res, name)
        options = body.get("deleteOptions") or {}
        want_uid = (options.get("preconditions") or {}).get("uid")
        if want_uid and want_uid != obj["metadata"]["uid"]:
            self.evictions.append(Eviction(f"{ns}/{name}", obj["metadata"]["uid"], 409))
            raise ApiError(
                409,
                "Conflict",
                f"Precondition failed: UID in precondition: {want_uid}, UID in object meta: "
                f"{obj['metadata']['uid']}",
                {"name": name, "kind": "pods"},
            )
        terminating = bool(obj["metadata"].get("deletionTimestamp"))
        running = obj["status"].get("phase") == "Running"
        if running and not terminating:
            pdbs = [
                p
                for (pns, _), p in self._store[("policy/v1", "poddisruptionbudgets")].items()
                if pns == ns
                and match_label_selector(obj["metadata"].get("labels") or {}, p["spec"].get("selector"))
            ]
            if len(pdbs) > 1:
                self.evictions.append(Eviction(f"{ns}/{name}", obj["metadata"]["uid"], 500))
                raise ApiError(
                    500,
                    "InternalError",
                    "This pod has more than one PodDisruptionBudget, which the eviction subresource "
                    "does not support.",
                )
            if pdbs:
                status = self._pdb_status(pdbs[0])
                if status["disruptionsAllowed"] <= 0 or not _pod_ready(obj):
                    budget = pdbs[0]["metadata"]["name"]
                    self.evictions.append(Eviction(f"{ns}/{name}", obj["metadata"]["uid"], 429))
                    raise ApiError(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        {
                            "causes": [
                                {
                                    "reason": "DisruptionBudget",
                                    "message": f"The disruption budget {budget} needs "
                                    f"{status['desiredHealthy']} healthy pods and has "
                                    f"{status['currentHealthy']} currently",
                                }
                            ]
                        },
                    )
        grace = options.get("gracePeriodSeconds")
        self._delete_pod(obj, grace)
        if running and not terminating and self._controller_owned(obj):
            others = [
                n["metadata"]["name"]
                for n in self._store[("v1", "nodes")].values()
                if not n["spec"].get("unschedulable") and n["metadata"]["name"] != obj["spec"].get("nodeName")
            ]
            if self.auto_reschedule and others:
                self._recreate(obj, sorted(others)[0])
            else:
                self._ghosts.append(copy.deepcopy(obj))
        self.evictions.append(Eviction(f"{ns}/{name}", obj["metadata"]["uid"], 201))
        return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    # -- request dispatch (called by the handler with the lock held) --

    def handle(self, method: str, raw_path: str, content_type: str, body: Any) -> tuple[int, Obj]:
        self.requests.append((method, raw_path))
        url = urlsplit(raw_path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        for inj in self._injected:
            if inj.times > 0 and inj.method == method and inj.path_pattern.search(url.path):
                inj.times -= 1
                raise ApiError(inj.code, "InternalError" if inj.code >= 500 else "Injected", "injected error")
        self._sweep()
        res, ns, name, sub = self._route(url.path)
        table = self._store[(res.group_version, res.plural)]
        if name is None:
            if method == "GET":
                return 200, self._list(res, ns, query)
            if method == "POST":
                return 201, self._create(res, ns, body)
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {res.plural}")
        key = (ns or "", name)
        if sub == "eviction":
            if method != "POST" or res.plural != "pods":
                raise ApiError(405, "MethodNotAllowed", "eviction is POST on pods")
            return self._evict(ns or "", name, body if isinstance(body, dict) else {})
        if sub not in (None, "status") or (sub == "status" and not res.has_status):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({sub})")
        current = table.get(key)
        if current is None:
            raise _not_found(res, name)
        if method == "GET":
            return 200, copy.deepcopy(self._with_status(res, current))
        if method == "DELETE":
            return 200, self._delete(res, current, body if isinstance(body, dict) else {})
        if method in ("PUT", "PATCH"):
            if method == "PUT":
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", "the body of a PUT must be an object")
                updated = copy.deepcopy(body)
            else:
                updated = self._patched(current, content_type, body)
            return 200, self._update(res, current, updated, status_only=sub == "status")
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported")

    def _route(self, path: str) -> tuple[Resource, str | None, str | None, str | None]:
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[:2] == ["api", "v1"]:
            gv, rest = "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            gv, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        else:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        ns: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        if not rest or (gv, rest[0]) not in _BY_PATH:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        res = _BY_PATH[(gv, rest[0])]
        if ns is not None and not res.namespaced:
            raise ApiError(404, "NotFound", f"{res.plural} are not namespaced")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        return res, ns, name, sub

    def _list(self, res: Resource, ns: str | None, query: dict[str, str]) -> Obj:
        if query.get("watch") in ("true", "1"):
            raise ApiError(400, "BadRequest", "watch is not supported by the emulator")
        if "fieldSelector" in query:
            try:
                k8s_validation.check_field_selector(res.group_version, res.plural, query["fieldSelector"])
            except k8s_validation.Refused as exc:
                raise ApiError(exc.code, exc.reason, exc.message, exc.details) from None
        stored = sorted(self._store[(res.group_version, res.plural)].items())
        if res.kind == "Event":  # one storage behind both Event APIs
            other = "events.k8s.io/v1" if res.group_version == "v1" else "v1"
            stored += [(k, k8s_validation.event_as(res.group_version, e))
                       for k, e in sorted(self._store[(other, "events")].items())]  # fmt: skip
        items = []
        for (ons, _), obj in stored:
            if ns is not None and ons != ns:
                continue
            labels = obj["metadata"].get("labels") or {}
            if "fieldSelector" in query and not match_field_selector(obj, query["fieldSelector"]):
                continue
            if "labelSelector" in query and not match_label_selector_string(labels, query["labelSelector"]):
                continue
            items.append(copy.deepcopy(self._with_status(res, obj)))
        return {
            "kind": f"{res.kind}List",
            "apiVersion": res.group_version,
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }

    def _create(self, res: Resource, ns: str | None, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of a POST must be an object")
        obj = copy.deepcopy(body)
        obj.setdefault("apiVersion", res.group_version)
        obj.setdefault("kind", res.kind)
        meta = obj.setdefault("metadata", {})
        if res.namespaced:
            if meta.get("namespace") not in (None, ns):
                raise ApiError(400, "BadRequest", "the namespace of the object does not match the URL")
            meta["namespace"] = ns
            if ("", ns or "") not in self._store[("v1", "namespaces")]:
                raise ApiError(
                    404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"}
                )
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, "Invalid", "metadata.name or metadata.generateName is required")
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        key = (ns or "", meta["name"])
        table = self._store[(res.group_version, res.plural)]
        if key in table:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{res.plural} "{meta["name"]}" already exists',
                {"name": meta["name"], "kind": res.plural},
            )
        self._validate(res, obj)
        for k in ("resourceVersion", "uid", "deletionTimestamp"):
            meta.pop(k, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now_iso()
        meta["resourceVersion"] = self._next_rv()
        if res.kind == "Namespace":
            obj.setdefault("status", {"phase": "Active"})
        if res.kind == "Pod":
            obj.setdefault("status", {"phase": "Pending"})
            if self.emulate_kubelet:
                self._schedule_and_run(obj)
        table[key] = obj
        return copy.deepcopy(self._with_status(res, obj))

    @staticmethod
    def _validate(res: Resource, obj: Obj) -> None:
        """What the real server refuses (see :mod:`healer.testing.k8s_validation`)."""
        try:
            k8s_validation.validate(res.group_version, res.kind, obj)
        except k8s_validation.Refused as exc:
            raise ApiError(exc.code, exc.reason, exc.message, exc.details) from None

    def _patched(self, current: Obj, content_type: str, body: Any) -> Obj:
        ctype = content_type.split(";")[0].strip().lower()
        if ctype == JSON_PATCH:
            if not isinstance(body, list):
                raise ApiError(
                    400, "BadRequest", "json: cannot unmarshal object into Go value of type []jsonPatchOp"
                )
            return json_patch(current, body)
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", f"the body of a {ctype} patch must be an object")
        if ctype == MERGE_PATCH:
            return json_merge_patch(current, body)
        if ctype == STRATEGIC_MERGE_PATCH:
            return strategic_merge_patch(current, body)
        raise ApiError(415, "UnsupportedMediaType", f"the emulator does not support {ctype} patches")

    def _update(self, res: Resource, current: Obj, updated: Obj, *, status_only: bool) -> Obj:
        meta = updated.setdefault("metadata", {})
        cur_meta = current["metadata"]
        want_rv = meta.get("resourceVersion")
        if want_rv and want_rv != cur_meta["resourceVersion"]:
            raise _conflict(res, cur_meta["name"])
        if status_only:
            result = copy.deepcopy(current)
            result["status"] = updated.get("status", {})
        else:
            result = updated
            if res.has_status and res.kind != "PodDisruptionBudget":
                result["status"] = copy.deepcopy(current.get("status", {}))
            for k in ("uid", "creationTimestamp", "name", "namespace", "deletionTimestamp"):
                if k in cur_meta:
                    meta[k] = cur_meta[k]
        result.setdefault("apiVersion", current.get("apiVersion", res.group_version))
        result.setdefault("kind", res.kind)
        self._validate(res, result)
        result["metadata"]["resourceVersion"] = self._next_rv()
        key = (cur_meta.get("namespace", "") if res.namespaced else "", cur_meta["name"])
        self._store[(res.group_version, res.plural)][key] = result
        return copy.deepcopy(self._with_status(res, result))

    def _delete(self, res: Resource, current: Obj, options: Obj) -> Obj:
        meta = current["metadata"]
        pre = options.get("preconditions") or {}
        if (pre.get("uid") and pre["uid"] != meta["uid"]) or (
            pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]
        ):
            raise ApiError(409, "Conflict", f"Precondition failed for {res.plural} {meta['name']}")
        if res.kind == "Pod":
            return self._delete_pod(current, options.get("gracePeriodSeconds"))
        key = (meta.get("namespace", "") if res.namespaced else "", meta["name"])
        self._store[(res.group_version, res.plural)].pop(key, None)
        self._next_rv()
        if res.kind == "Namespace":
            for (gv, plural), table in self._store.items():
                if _BY_PATH[(gv, plural)].namespaced:
                    for k in [k for k in table if k[0] == meta["name"]]:
                        del table[k]
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {"name": meta["name"], "kind": res.plural, "uid": meta["uid"]},
        }


def _scaled(value: int | str, total: int) -> int:
    """An int, or a percentage of ``total`` rounded up (the disruption controller rounds up)."""
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(total * int(value[:-1]) / 100)
    return int(value)


def _pod_ready(obj: Obj) -> bool:
    if obj["status"].get("phase") != "Running" or obj["metadata"].get("deletionTimestamp"):
        return False
    conds = {c.get("type"): c.get("status") for c in obj["status"].get("conditions") or []}
    return conds.get("Ready", "True") == "True"


class _Handler(BaseHTTPRequestHandler):
    emu: KubernetesEmulator
    protocol_version = "HTTP/1.1"  # keep-alive, as the official client's urllib3 pool expects

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes: without this, Nagle + delayed ACK add ~40 ms each.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.emu._lock:
            self.emu._connections.add(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            with self.emu._lock:
                self.emu._connections.discard(self.connection)

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read emu.requests
        pass

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            code, payload = 400, ApiError(400, "BadRequest", "the body is not JSON").body()
        else:
            try:
                with self.emu._lock:
                    code, payload = self.emu.handle(
                        self.command, self.path, self.headers.get("Content-Type", ""), body
                    )
            except ApiError as exc:
                code, payload = exc.code, exc.body()
            except Exception as exc:  # an emulator bug: answer 500 instead of hanging the client
                code, payload = 500, ApiError(500, "InternalError", f"emulator bug: {exc!r}").body()
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m healer.testing.k8s_emulator --fleet 64 --kubeconfig emu.kubeconfig``: serve until
    interrupted (loopback only)."""
    import argparse

    parser = argparse.ArgumentParser(description="healer's emulated Kubernetes API (loopback only)")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0 = any free port)")
    parser.add_argument("--fleet", type=int, default=0, help="load gpu_fleet(N): N GPU nodes with pods")
    parser.add_argument(
        "--scenario", type=Path, action="append", default=[], help="YAML/JSON objects to load"
    )
    parser.add_argument("--kubeconfig", type=Path, help="write a kubeconfig pointing at the emulator here")
    parser.add_argument("--auto-reschedule", action="store_true", help="recreate evicted replicas elsewhere")
    parser.add_argument("--terminating-seconds", type=float, default=0.0, help="pods terminate this long")
    args = parser.parse_args(argv)
    emu = KubernetesEmulator(
        port=args.port, auto_reschedule=args.auto_reschedule, terminating_seconds=args.terminating_seconds
    )
    if args.fleet:
        emu.load(gpu_fleet(args.fleet))
    for path in args.scenario:
        emu.load_file(path)
    emu.start()
    if args.kubeconfig:
        emu.write_kubeconfig(args.kubeconfig)
    print(emu.host, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        emu.stop()


if __name__ == "__main__":
    main()


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
    "match_field_selector",
    "match_label_selector",
    "match_label_selector_string",
    "namespace",
    "node",
    "pod",
    "pod_disruption_budget",
    "strategic_merge_patch",
]
