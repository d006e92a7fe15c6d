"""Every Node of the cluster, kept by one LIST and then a WATCH: the informer pattern.

client-go's informers (which controller-runtime's cache is built on) list a resource once, then
watch it from the list's ``resourceVersion`` and apply each ``ADDED``/``MODIFIED``/``DELETED``
event to a local store; a watch that ends is resumed from the last ``resourceVersion`` seen
(``BOOKMARK`` events advance it without an object), and only a ``410 Gone`` (the version was
compacted away) makes them list again. :class:`NodeWatch` does the same for Nodes in a thread of
its own, so a scheduler tick reads the cluster's nodes without a LIST. A watch that breaks (a
dropped connection, an API server restart) is resumed from its ``resourceVersion`` after
:data:`RETRY_SECONDS` (doubling while it keeps failing), as client-go's reflector does; until it
is back, the store is not trusted and the adapter lists.

Freshness: a watch request asks the API server to end it after :data:`WATCH_SECONDS` (its
``timeoutSeconds``), and the thread resumes at once; so a healthy watch is heard from (an event,
a bookmark or a new watch) at least that often. :meth:`NodeWatch.nodes` answers None, and the
adapter lists instead, while the store is not synced or nothing was heard for ``stale_seconds``
(a watch stuck on a half-open connection); the thread then drops the connection and lists again.

Memory: each Node is kept trimmed to the fields healer reads (:func:`trim_node`: names, labels,
annotations, taints, the GPU counts, addresses, conditions), a few kilobytes for a real Node
whose full object (images, volumes, node info) is tens of kilobytes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from healer.actions import rawcalls

log = logging.getLogger(__name__)

#: The resource a GPU node reports its GPUs as (the NVIDIA device plugin's).
GPU_RESOURCE = "nvidia.com/gpu"
#: Seconds the API server keeps one watch request open (its ``timeoutSeconds``).
WATCH_SECONDS = 60
#: Seconds without an event, a bookmark or a new watch after which the store is stale.
STALE_SECONDS = 3 * WATCH_SECONDS
#: Seconds before the first attempt after a failed list or watch; doubled after each failure in
#: a row, up to :data:`MAX_RETRY_SECONDS`.
RETRY_SECONDS = 2.0
MAX_RETRY_SECONDS = 60.0


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


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


class NodeWatch:
    """The cluster's Nodes, listed once and then watched (see the module).

    ``lists``, ``watches`` and ``relists`` count the LIST requests, the WATCH requests and the
    lists forced by a 410 or a stale watch (for ``/metrics`` and the tests).
    """

    def __init__(
        self,
        api: k8s.ApiClient,
        *,
        timeout: float = 30.0,
        stale_seconds: float = STALE_SECONDS,
        watch_seconds: int = WATCH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.timeout = timeout
        self.stale_seconds = stale_seconds
        self.watch_seconds = watch_seconds
        self.clock = clock
        self._nodes: dict[str, dict[str, Any]] = {}
        self._version: str | None = None
        self._heard: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: Any = None
        self.lists = self.watches = self.relists = 0
        self.error: str | None = None
        self._failures = 0  # failed lists or watches in a row (the pause doubles with each)

    # -- reads ------------------------------------------------------------------------------------

    def nodes(self) -> list[dict[str, Any]] | None:
        """Every Node (trimmed, :func:`trim_node`), or None while not synced or stale."""
        with self._lock:
            if self._heard is None or self.clock() - self._heard > self.stale_seconds:
                return None
            return list(self._nodes.values())

    def age_seconds(self) -> float | None:
        """Seconds since the store last heard from the API server (event, bookmark, new watch or
        list); None before the first list and while the watch is down (the store is then not
        trusted)."""
        with self._lock:
            return None if self._heard is None else max(0.0, self.clock() - self._heard)

    # -- the thread -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the list-then-watch thread (a daemon); a second call does nothing."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="node-watch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread (the open watch connection is closed)."""
        self._stop.set()
        response = self._response
        if response is not None:
            # urllib3's shutdown() unblocks a read in progress in the watch thread (a plain close
            # waits for it); the connection is gone either way.
            with contextlib.suppress(Exception):
                response.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._version is None:
                    self._list()
                self._watch()
            except _Gone:
                log.info("node watch: resourceVersion %s expired (410); listing again", self._version)
                self._version = None
                self.relists += 1
            except Exception as exc:  # a dropped connection, a 5xx: watch again from where it was
                # Until the watch is back the store misses changes: not trusted (the adapter lists).
                with self._lock:
                    self._heard = None
                error = f"{type(exc).__name__}: {exc}"
                self._failures += 1
                pause = min(RETRY_SECONDS * 2 ** (self._failures - 1), MAX_RETRY_SECONDS)
                if not self._stop.is_set():
                    # One warning per new error, not one per attempt (a server refusing watches
                    # would fill the log): the nodes are listed meanwhile.
                    level = logging.WARNING if error != self.error else logging.DEBUG
                    what = "node watch interrupted (nodes are listed meanwhile), resuming in %.0fs: %s"
                    log.log(level, what, pause, error)
                self.error = error
                self._stop.wait(pause)

    def _heard_now(self) -> None:
        with self._lock:
            self._heard = self.clock()

    def _list(self) -> None:
        answer = rawcalls.call(self.api, "GET", "/api/v1/nodes", timeout=self.timeout)
        self.lists += 1
        nodes = {
            str(n["metadata"]["name"]): trim_node(n)
            for n in answer.get("items") or []
            if (n.get("metadata") or {}).get("name")
        }
        with self._lock:
            self._nodes = nodes
            self._heard = self.clock()
        self._version = str((answer.get("metadata") or {}).get("resourceVersion") or "") or None
        self.error = None

    def _watch(self) -> None:
        query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self.watch_seconds)),
            ("resourceVersion", self._version or ""),
        ]
        request = self.api.param_serialize(
            method="GET",
            resource_path="/api/v1/nodes",
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=rawcalls.AUTH_SETTINGS,
        )
        # The read timeout ends a connection silent past the server's own timeout (half-open).
        response = self.api.call_api(
            *request, _request_timeout=(self.timeout, self.watch_seconds + self.timeout)
        )
        if not 200 <= response.status <= 299:
            data = response.read()
            if response.status == 410:
                raise _Gone
            raise ApiException.from_response(
                http_resp=response, body=data.decode("utf-8", errors="replace") if data else None, data=None
            )
        self.watches += 1
        self._failures = 0
        self._heard_now()
        self._response = response.response
        try:
            for line in iter_resp_lines(response.response):
                if self._stop.is_set():
                    return
                if line:
                    self._apply(json.loads(line))
        finally:
            self._response = None
            response.response.release_conn()

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Gone
            raise RuntimeError(f"watch error: {obj.get('message') or obj}")
        version = meta.get("resourceVersion")
        with self._lock:
            if kind in ("ADDED", "MODIFIED") and meta.get("name"):
                self._nodes[str(meta["name"])] = trim_node(obj)
            elif kind == "DELETED" and meta.get("name"):
                self._nodes.pop(str(meta["name"]), None)
            self._heard = self.clock()
        if version:
            self._version = str(version)
