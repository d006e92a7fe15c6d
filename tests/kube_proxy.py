"""A loopback reverse proxy in front of the test control plane's API server that can hold answers.

``healer run`` is given a kubeconfig pointing at the proxy (plain HTTP on 127.0.0.1); the proxy
sends each request on to kube-apiserver (HTTPS, verified with the control plane's CA) at once and
relays the answer, streamed (watches work; :attr:`ApiProxy.watch_lag` delays their events).
:meth:`ApiProxy.hold` keeps the next matching answers
back for some seconds after the API server has applied the request: the write is visible in the
cluster while the client still waits, which is the moment a crash or a freeze test needs (a slow
network or a stopped VM, as a fault-injection proxy such as toxiproxy would simulate).

:meth:`ApiProxy.fail` makes it fail a share of the requests instead, each drawn from a seeded
``random.Random`` in the order the requests arrive: a 500 or a 429 with ``Retry-After`` answered by
the proxy (the API server never sees the request), or a connection dropped without an answer,
before the API server sees the request or after it has applied it (the answer is lost).
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

#: Headers that belong to one connection, not to the message (RFC 9110 section 7.6.1).
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
    "host",
}


#: The faults :meth:`ApiProxy.fail` draws from: answered 500 by the proxy; answered 429 with
#: ``Retry-After: 1`` (API priority and fairness's answer, no ``DisruptionBudget`` cause); the
#: connection closed before the request reaches the API server; closed after the API server
#: applied it, the answer lost.
FAULTS = ("500", "429", "drop", "drop-after")
#: Not among the random faults: ``"gone"`` answers as kube-apiserver does for a resourceVersion
#: compacted away: a watch gets 200 and one ``ERROR`` event with a 410 ``Expired`` Status (its watch
#: cache's answer), a list gets 410.
GONE = "gone"


@dataclass
class _Failing:
    rate: float
    rng: random.Random
    path: re.Pattern[str]
    kinds: tuple[str, ...]


@dataclass
class _Hold:
    method: str
    path: re.Pattern[str]
    seconds: float
    times: int


class ApiProxy:
    """Relay ``http://127.0.0.1:<port>`` to ``upstream``; see the module docstring."""

    def __init__(self, upstream: str, ca_file: Path) -> None:
        self.upstream = upstream.rstrip("/")
        self._client = httpx.Client(
            verify=ssl.create_default_context(cafile=str(ca_file)),
            timeout=httpx.Timeout(30.0, read=None),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
        )
        self._holds: list[_Hold] = []
        self._failing: _Failing | None = None
        self._lock = threading.Lock()
        #: Requests received, and the faults injected by kind, since the proxy started.
        self.received = 0
        self.injected: Counter[str] = Counter()
        #: Seconds each piece of a watch's answer is held before it is relayed (a watch that
        #: lags behind the writes' answers, as a busy API server's watch cache can).
        self.watch_lag = 0.0
        #: Every request relayed or failed, as (method, path with its query), in order.
        self.requests: list[tuple[str, str]] = []
        # Answers being streamed (watches), with the client's socket.
        self._open: dict[httpx.Response, socket.socket] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05})
        self._thread.daemon = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def hold(self, method: str, path_regex: str, seconds: float, *, times: int = 1) -> None:
        """Hold the answers of the next ``times`` requests matching ``method`` and ``path_regex``
        (searched in the path without the query) for ``seconds`` after the API server answered."""
        with self._lock:
            self._holds.append(_Hold(method.upper(), re.compile(path_regex), seconds, times))

    def fail(self, rate: float, *, seed: int, path_regex: str = "", kinds: tuple[str, ...] = FAULTS) -> None:
        """Fail about ``rate`` (0..1) of the requests whose path (without the query) matches
        ``path_regex`` from now on, each fault one of ``kinds`` (:data:`FAULTS`), drawn from
        ``random.Random(seed)`` as the requests arrive. ``rate`` 0 stops failing."""
        with self._lock:
            self._failing = (
                _Failing(rate, random.Random(seed), re.compile(path_regex), kinds) if rate > 0 else None
            )

    def lists(self, path: str) -> int:
        """How many LISTs (a GET of ``path`` without ``watch``) the proxy has seen; a LIST's later
        pages (a GET with ``continue``) are the same LIST."""
        return sum(1 for full in self.list_pages(path) if "continue=" not in full)

    def list_pages(self, path: str) -> list[str]:
        """Every GET of ``path`` without ``watch`` the proxy has seen (each page of each LIST), as sent."""
        with self._lock:
            return [
                full
                for method, full in self.requests
                if method == "GET" and full.split("?")[0] == path and "watch=true" not in full
            ]

    def cut(self) -> int:
        """Close every answer being streamed now (open watches end as a dropped connection
        ends them); return how many."""
        with self._lock:
            open_ = list(self._open.items())
        for answer, client in open_:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)  # the client's read ends at once
            answer.close()
        return len(open_)

    def _draw_fault(self, path: str) -> str | None:
        with self._lock:
            self.received += 1
            failing = self._failing
            if failing is None or not failing.path.search(path.split("?")[0]):
                return None
            if failing.rng.random() >= failing.rate:
                return None
            kind = failing.rng.choice(failing.kinds)
            self.injected[kind] += 1
            return kind

    def _take_hold(self, method: str, path: str) -> float:
        with self._lock:
            for h in self._holds:
                if h.times > 0 and h.method == method and h.path.search(path.split("?")[0]):
                    h.times -= 1
                    return h.seconds
        return 0.0

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer_status(self, code: int, reason: str, headers: dict[str, str]) -> None:
                """A ``Status`` answer as kube-apiserver writes one."""
                status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code}
                data = json.dumps({**status, "reason": reason, "message": "injected by the test proxy"})
                self.send_response(code)
                for k, v in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data.encode())

            def _answer_gone_event(self) -> None:
                status = {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "message": "too old resource version (injected by the test proxy)",
                    "reason": "Expired",
                    "code": 410,
                }
                data = json.dumps({"type": "ERROR", "object": status}).encode() + b"\n"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with proxy._lock:
                    proxy.requests.append((self.command, self.path))
                fault = proxy._draw_fault(self.path)
                if fault == "500":
                    self._answer_status(500, "InternalError", {})
                    return
                if fault == "429":
                    self._answer_status(429, "TooManyRequests", {"Retry-After": "1"})
                    return
                if fault == "drop":
                    self.close_connection = True
                    return
                if fault == GONE:
                    if "watch=true" in self.path:
                        self._answer_gone_event()
                    else:
                        self._answer_status(410, "Expired", {})
                    return
                headers = [(k, v) for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP]
                request = proxy._client.build_request(
                    self.command, proxy.upstream + self.path, headers=headers, content=body
                )
                try:
                    answer = proxy._client.send(request, stream=True)
                except (httpx.HTTPError, RuntimeError) as exc:  # RuntimeError: the proxy is stopping
                    self.send_error(502, f"upstream: {exc}")
                    return
                if fault == "drop-after":
                    answer.close()  # applied by the API server; the client never hears of it
                    self.close_connection = True
                    return
                with proxy._lock:
                    proxy._open[answer] = self.connection
                try:
                    held = proxy._take_hold(self.command, self.path)
                    if held:
                        time.sleep(held)
                    self.send_response(answer.status_code)
                    for k, v in answer.headers.multi_items():
                        if k.lower() not in HOP_BY_HOP:
                            self.send_header(k, v)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    watching = "watch=true" in self.path
                    for chunk in answer.iter_raw():
                        if chunk:
                            if watching and proxy.watch_lag:
                                time.sleep(proxy.watch_lag)
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (
                    BrokenPipeError,
                    ConnectionResetError,
                    httpx.HTTPError,
                    RuntimeError,
                    AttributeError,
                    ValueError,
                ):
                    # RuntimeError (httpx.StreamClosed), AttributeError, ValueError: the answer was
                    # closed by cut() while it was read
                    self.close_connection = True
                finally:
                    with proxy._lock:
                        proxy._open.pop(answer, None)
                    answer.close()

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _relay

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler

    def start(self) -> ApiProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self._client.close()


@contextmanager
def api_proxy(upstream: str, ca_file: Path) -> Iterator[ApiProxy]:
    """An :class:`ApiProxy` running for the block."""
    proxy = ApiProxy(upstream, ca_file).start()
    try:
        yield proxy
    finally:
        proxy.stop()
