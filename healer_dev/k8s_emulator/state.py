"""The emulator's object store: what an API server keeps in etcd, and one global resourceVersion."""

from __future__ import annotations

import copy
import re
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

from healer_dev.k8s_emulator.objects import namespace
from healer_dev.k8s_emulator.resources import _BY_KIND, RESOURCES, Obj, Resource, _now_iso


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
    delay: float = 0.0  # seconds (inject_delay)
    after_write: bool = False  # inject_delay: hold the answer, not the request


class EmulatorState:
    """Objects by resource type and (namespace, name), under one lock, with the bookkeeping the
    request handlers and the pod lifecycle share (ghosts of evicted replicas, terminating pods,
    injected errors, the request and eviction logs)."""

    def __init__(self, *, terminating_seconds: float, auto_reschedule: bool, emulate_kubelet: bool) -> None:
        self.terminating_seconds = terminating_seconds
        self.emulate_kubelet = emulate_kubelet
        self.auto_reschedule = auto_reschedule
        self._lock = threading.RLock()
        self._store: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {
            (r.group_version, r.plural): {} for r in RESOURCES
        }
        self._rv = 1000
        self._ghosts: list[Obj] = []  # evicted controller-owned pods whose replacement is not up
        self._terminating: dict[tuple[str, str], float] = {}  # (ns, name) -> monotonic removal time
        self._injected: list[_Injected] = []
        self._delays: list[_Injected] = []
        # Bounded so a long demo does not grow without limit; tests read them as sequences.
        self.requests: deque[tuple[str, str]] = deque(maxlen=100_000)  # (method, path with query)
        self.evictions: deque[Eviction] = deque(maxlen=100_000)
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.add(namespace(ns))

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
