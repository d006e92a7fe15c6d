"""The emulator as a server: a threaded HTTP server on loopback, client helpers, direct state
access for scenarios and assertions, and ``python -m healer_dev.k8s_emulator``."""

from __future__ import annotations

import builtins
import contextlib
import copy
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from healer_dev.k8s_emulator.objects import gpu_fleet
from healer_dev.k8s_emulator.resources import _BY_KIND, ApiError, Obj
from healer_dev.k8s_emulator.rest import RestDispatch, WatchRequested
from healer_dev.k8s_emulator.state import _Injected

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, Configuration


class KubernetesEmulator(RestDispatch):
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
        super().__init__(
            terminating_seconds=terminating_seconds,
            auto_reschedule=auto_reschedule,
            emulate_kubelet=emulate_kubelet,
        )
        self._port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()

    # -- lifecycle --

    def start(self) -> KubernetesEmulator:
        """Start serving in a daemon thread; :attr:`host` is valid afterwards."""
        emulator = self

        class Handler(_Handler):
            emu = emulator

        server = _Server(("127.0.0.1", self._port), Handler)
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

    def inject_delay(
        self, method: str, path_regex: str, seconds: float, *, times: int = 1, after_write: bool = False
    ) -> None:
        """Hold the next ``times`` requests matching ``method`` and ``path_regex`` for ``seconds``
        (a slow API server: the client may time out while the write still happens, as a real
        eviction does). ``after_write``: apply the request first, then hold the answer (the write
        is visible while the client still waits: the moment to kill it in a crash test)."""
        with self._lock:
            inj = _Injected(method.upper(), re.compile(path_regex), 0, times, seconds, after_write)
            self._delays.append(inj)

    def _take_delay(self, method: str, path: str) -> tuple[float, bool]:
        with self._lock:
            for inj in self._delays:
                if inj.times > 0 and inj.method == method and inj.path_pattern.search(path.split("?")[0]):
                    inj.times -= 1
                    return inj.delay, inj.after_write
        return 0.0, False

    def eviction_count(self, pod_key: str) -> int:
        """How many eviction requests for ``namespace/name`` were accepted (201)."""
        return sum(1 for e in self.evictions if e.pod == pod_key and e.code == 201)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up before its answer (timeout, killed controller) is not an emulator
        error: no traceback for it; anything else is printed as socketserver does."""
        if isinstance(sys.exc_info()[1], ConnectionError):  # BrokenPipeError, ConnectionResetError
            return
        super().handle_error(request, client_address)


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
        delay, after_write = self.emu._take_delay(self.command, self.path)
        if delay and not after_write:
            time.sleep(delay)
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
            except WatchRequested as watch:
                self._watch(watch)
                return
            except ApiError as exc:
                code, payload = exc.code, exc.body()
            except Exception as exc:  # an emulator bug: answer 500 instead of hanging the client
                code, payload = 500, ApiError(500, "InternalError", f"emulator bug: {exc!r}").body()
        data = json.dumps(payload).encode()
        if delay and after_write:
            time.sleep(delay)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _watch(self, watch: WatchRequested) -> None:
        """Stream watch events (one JSON object per line, chunked) until ``timeoutSeconds``
        (default 30 s) or the server stops: ``ADDED`` for every object when no
        ``resourceVersion`` is given, then ``MODIFIED`` for each object whose resourceVersion moves
        past the last one sent, ``DELETED`` for one gone since. The store is read every 20 ms (PDB
        status recomputed each time, as the disruption controller would write it), pods every 200 ms
        (hundreds of them in the demo): a watch of the demo's few dozen nodes, not of a scale
        bench's thousands."""
        query = {k: v for k, v in watch.query.items() if k not in ("watch", "resourceVersion")}
        since = int(watch.query.get("resourceVersion") or 0)
        end = time.monotonic() + float(watch.query.get("timeoutSeconds") or 30)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent: dict[str, int] = {}
        last: dict[str, dict[str, object]] = {}

        def emit(kind: str, obj: dict[str, object]) -> None:
            line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()

        try:
            with self.emu._lock:  # what exists at the watch's start (a version already seen)
                for obj in self.emu._list(watch.res, watch.ns, query)["items"]:
                    meta = obj["metadata"]
                    last[f"{meta.get('namespace', '')}/{meta['name']}"] = obj
            while time.monotonic() < end and self.emu._server is not None:
                with self.emu._lock:
                    items = self.emu._list(watch.res, watch.ns, query)["items"]
                now: dict[str, dict[str, object]] = {}
                for obj in items:
                    meta = obj["metadata"]
                    rv, key = int(meta["resourceVersion"]), f"{meta.get('namespace', '')}/{meta['name']}"
                    now[key] = obj
                    if rv > since and sent.get(key) != rv:
                        emit("ADDED" if since == 0 and key not in sent else "MODIFIED", obj)
                        sent[key] = rv
                for key in last.keys() - now.keys():
                    emit("DELETED", last[key])
                    sent.pop(key, None)
                last = now
                time.sleep(0.2 if watch.res.kind == "Pod" else 0.02)
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m healer_dev.k8s_emulator --fleet 64 --kubeconfig emu.kubeconfig``: serve until
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

    main()
