"""Every object of one kind in the cluster, kept by one LIST and then a WATCH: the informer pattern.

client-go's informers (which controller-runtime's cache is built on) list a resource once, then
watch it from the list's ``resourceVersion`` and apply each ``ADDED``/``MODIFIED``/``DELETED``
event to a local store; a watch that ends is resumed from the last ``resourceVersion`` seen
(``BOOKMARK`` events advance it without an object), and only a ``410 Gone`` (the version was
compacted away) makes them list again. :class:`Watch` does the same in a thread of its own, so a
scheduler tick reads the cluster without a LIST; :mod:`.node_watch` (Nodes) and :mod:`.pod_watch`
(pods and PodDisruptionBudgets) are its kinds. A watch that breaks (a dropped connection, an API
server restart) is resumed from its ``resourceVersion`` after :data:`RETRY_SECONDS` (doubling while
it keeps failing), as client-go's reflector does; until it is back, the store is not trusted and
its readers list.

Freshness: a watch request asks the API server to end it after :data:`WATCH_SECONDS` (its
``timeoutSeconds``), and the thread resumes at once; so a healthy watch is heard from (an event,
a bookmark or a new watch) at least that often. :meth:`Watch.items` answers None, and the reader
lists instead, while the store is not synced or nothing was heard for ``stale_seconds`` (a watch
stuck on a half-open connection); the thread then drops the connection and lists again.

Memory: each object is kept trimmed to the fields healer reads (each kind's ``trim``), and a list
is read :data:`LIST_PAGE` objects at a time, so its whole JSON is never held at once.

Cost per tick: :meth:`Watch.derived` keeps what a reader computes from each object (a node's pool,
whether it carries healer's marks) and computes it again only for the objects an event replaced
since, so a quiet tick over 10,240 Nodes unpacks none of them (client-go's indexers play this part).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, cast

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from healer.actions import rawcalls

log = logging.getLogger(__name__)

#: Seconds the API server keeps one watch request open (its ``timeoutSeconds``).
WATCH_SECONDS = 60
#: Objects per page of a (re)list (``limit``, then ``continue``; client-go's reflector pages by
#: 500 too): the full JSON of 10,000 Nodes is never parsed at once, only a page's.
LIST_PAGE = 500
#: Seconds without an event, a bookmark or a new watch after which the store is stale.
STALE_SECONDS = 3 * WATCH_SECONDS
#: Seconds before the first attempt after a failed list or watch; doubled after each failure in
#: a row, up to :data:`MAX_RETRY_SECONDS`.
RETRY_SECONDS = 2.0
MAX_RETRY_SECONDS = 60.0
#: Versions of each object the store remembers having applied (:meth:`Watch.expect`): the watch
#: can deliver a write's event before the writer hears the answer, and another write or two of the
#: same object (a kubelet's status) may follow within those milliseconds.
RECENT_VERSIONS = 4


T = TypeVar("T")


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


class Watch:
    """One kind of object of the whole cluster, listed once and then watched (see the module).

    Subclasses set :attr:`PATH` (the collection's URL path), :attr:`WHAT` (the kind, plural, for
    the logs) and :meth:`trim` (the fields kept of each object).

    ``lists``, ``watches`` and ``relists`` count the LIST requests, the WATCH requests and the
    lists forced by a 410 or a stale watch (for ``/metrics`` and the tests).
    """

    PATH = ""
    WHAT = ""

    @staticmethod
    def trim(obj: Mapping[str, Any]) -> dict[str, Any]:
        """The fields of one object this store keeps (the whole object unless overridden)."""
        return dict(obj)

    @staticmethod
    def pack(obj: dict[str, Any]) -> Any:
        """How a trimmed object is held (itself unless overridden: :meth:`unpack` undoes it)."""
        return obj

    @staticmethod
    def unpack(held: Any) -> dict[str, Any]:
        """A held object as a dict again (:meth:`pack`)."""
        return cast(dict[str, Any], held)

    @staticmethod
    def index(obj: Mapping[str, Any]) -> str | None:
        """The value this store indexes an object by (:meth:`indexed`), or None: not indexed
        (the default: no index)."""
        return None

    @staticmethod
    def key(obj: Mapping[str, Any]) -> str | None:
        """The store's key of one object: ``namespace/name`` (``name`` for a cluster-scoped
        object); None for an object without a name."""
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not name:
            return None
        return f"{meta['namespace']}/{name}" if meta.get("namespace") else str(name)

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
        self._items: dict[str, Any] = {}  # key -> the trimmed object, packed (pack())
        self._index: dict[str, set[str]] = {}  # index value -> keys (see index())
        self._indexed_as: dict[str, str] = {}  # key -> its index value
        self._version: str | None = None
        self._heard: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: Any = None
        self.lists = self.watches = self.relists = 0
        self.error: str | None = None
        self._failures = 0  # failed lists or watches in a row (the pause doubles with each)
        # Own writes not yet heard back (see expect()): key -> the resourceVersion the API server
        # answered; and each key's last few versions applied, newest last.
        self._expected: dict[str, str] = {}
        self._recent: dict[str, tuple[str, ...]] = {}
        # derived(): name -> key -> (the held object it was computed from, the value)
        self._derived: dict[str, dict[str, tuple[Any, Any]]] = {}
        self._derived_lock = threading.Lock()

    # -- reads ------------------------------------------------------------------------------------

    def items(self) -> list[dict[str, Any]] | None:
        """Every object (trimmed, :meth:`trim`), or None while not synced or stale."""
        with self._lock:
            if not self._fresh():
                return None
            return [self.unpack(x) for x in self._items.values()]

    def derived(self, name: str, compute: Callable[[dict[str, Any]], T]) -> dict[str, T] | None:
        """Each object's key -> ``compute(object)`` (the object trimmed), or None while not synced
        or stale. The values are kept under ``name`` and computed again only for the objects an
        event added or replaced since the last call: a quiet tick unpacks nothing. ``compute``
        must depend on the object alone (one ``name`` per meaning: another function, another
        name)."""
        with self._lock:
            if not self._fresh():
                return None
            held = dict(self._items)
        with self._derived_lock:
            before = self._derived.get(name, {})
            after: dict[str, tuple[Any, Any]] = {}
            for key, obj in held.items():
                kept = before.get(key)
                after[key] = kept if kept is not None and kept[0] is obj else (obj, compute(self.unpack(obj)))
            self._derived[name] = after
        return {key: value for key, (_, value) in after.items()}

    def get(self, keys: Iterable[str]) -> dict[str, dict[str, Any]] | None:
        """The objects of ``keys`` the store holds (trimmed; a key it does not hold is left out),
        or None while not synced or stale."""
        with self._lock:
            if not self._fresh():
                return None
            held = {key: self._items[key] for key in keys if key in self._items}
        return {key: self.unpack(obj) for key, obj in held.items()}

    def indexed(self, value: str) -> list[dict[str, Any]] | None:
        """The objects whose :meth:`index` is ``value`` (trimmed), or None while not synced or
        stale."""
        with self._lock:
            if not self._fresh():
                return None
            return [self.unpack(self._items[k]) for k in sorted(self._index.get(value, ()))]

    def version(self) -> str | None:
        """The resourceVersion the store is at (where a watch of the same kind may start), or
        None while not synced or stale."""
        with self._lock:
            return self._version if self._fresh() else None

    def expect(self, key: str, version: str) -> None:
        """This process wrote object ``key`` and the API server answered ``version``: until the
        watch delivers that version, :meth:`behind` names ``key``, so a reader does not decide on
        the object as it was before its own write (the watch's event can come a few milliseconds
        after the answer). resourceVersions are opaque (the API conventions: compare them only for
        equality), so the store keeps each key's last :data:`RECENT_VERSIONS` versions to know one
        already delivered."""
        if not version:
            return
        with self._lock:
            if version not in self._recent.get(key, ()):
                self._expected[key] = version

    def behind(self, keys: Iterable[str]) -> set[str]:
        """The keys of ``keys`` whose own write (:meth:`expect`) the watch has not delivered yet."""
        with self._lock:
            return {key for key in keys if key in self._expected}

    def _fresh(self) -> bool:  # with the lock held
        return self._heard is not None and self.clock() - self._heard <= self.stale_seconds

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
            self._thread = threading.Thread(target=self._run, name=f"{self.WHAT}-watch", daemon=True)
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
                log.info(
                    "watch of %s: resourceVersion %s expired (410); listing again",
                    self.WHAT,
                    self._version or "",
                )
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
                    # would fill the log): the objects are listed meanwhile.
                    level = logging.WARNING if error != self.error else logging.DEBUG
                    what = "watch of %s interrupted (they are listed meanwhile), resuming in %.0fs: %s"
                    log.log(level, what, self.WHAT, pause, error)
                self.error = error
                self._stop.wait(pause)

    def _heard_now(self) -> None:
        with self._lock:
            self._heard = self.clock()

    def _list(self) -> None:
        with self._lock:  # writes answered before the list was sent are in it
            expected_before = dict(self._expected)
        items: dict[str, Any] = {}
        index: dict[str, set[str]] = {}
        indexed_as: dict[str, str] = {}
        version: str | None = None
        token = ""
        while True:  # page by page, as client-go's reflector lists: one page's JSON in memory at once
            query = [("limit", str(LIST_PAGE))] + ([("continue", token)] if token else [])
            answer = rawcalls.call(self.api, "GET", self.PATH, query=query, timeout=self.timeout)
            for o in answer.get("items") or []:
                if (key := self.key(o)) is None:
                    continue
                kept = self.trim(o)
                items[key] = self.pack(kept)
                if (value := self.index(kept)) is not None:
                    index.setdefault(value, set()).add(key)
                    indexed_as[key] = value
            meta = answer.get("metadata") or {}
            version = str(meta.get("resourceVersion") or "") or version  # every page: the first's snapshot
            if not (token := str(meta.get("continue") or "")):
                break
        self.lists += 1
        with self._lock:
            self._items, self._index, self._indexed_as = items, index, indexed_as
            self._recent = {}
            for key, held in items.items():
                if version := str((self.unpack(held).get("metadata") or {}).get("resourceVersion") or ""):
                    self._recent[key] = (version,)
            for key, version in expected_before.items():
                if self._expected.get(key) == version:
                    del self._expected[key]
            self._heard = self.clock()
        self._version = version
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
            resource_path=self.PATH,
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
        key = self.key(obj) if kind in ("ADDED", "MODIFIED", "DELETED") else None
        with self._lock:
            if key is not None:
                self._unindex(key)
                if version:
                    self._recent[key] = (*self._recent.get(key, ())[1 - RECENT_VERSIONS :], str(version))
                    if self._expected.get(key) == str(version):
                        del self._expected[key]
                if kind == "DELETED":
                    self._items.pop(key, None)
                    self._recent.pop(key, None)
                    self._expected.pop(key, None)
                else:
                    kept = self.trim(obj)
                    self._items[key] = self.pack(kept)
                    if (value := self.index(kept)) is not None:
                        self._index.setdefault(value, set()).add(key)
                        self._indexed_as[key] = value
            self._heard = self.clock()
        if version:
            self._version = str(version)

    def _unindex(self, key: str) -> None:  # with the lock held
        value = self._indexed_as.pop(key, None)
        if value is not None and value in self._index:
            self._index[value].discard(key)
            if not self._index[value]:
                del self._index[value]
