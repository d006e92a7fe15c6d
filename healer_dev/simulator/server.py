"""One HTTP server standing in for every exporter of a simulated fleet.

URL layout (all GET):

* ``/nodes/<node>/dcgm/metrics``: that node's dcgm-exporter scrape (``:9400/metrics`` on a real node).
* ``/nodes/<node>/node/metrics``: that node's node_exporter scrape, InfiniBand collector only.
* ``/targets``: every target as Prometheus ``http_sd_config`` JSON (``[{"targets": [...], "labels":
  {"__metrics_path__": ..., ...}}]``); the same document :meth:`SimulatorServer.write_file_sd` writes.
* ``/status``: JSON ``{"elapsed_seconds", "nodes", "label_style", "seed", "scenario",
  "active_faults": [...]}``.
* ``/healthz``: ``ok``.

An endpoint whose exporter is down answers 503 (``http_503``) or closes the connection without an
answer (``connection_close``); an unknown node or path answers 404.

Time: the server asks the injected ``clock`` (seconds since the run began) once per request and
renders the fleet at that instant, so a test drives the whole fleet with a :class:`ManualClock`.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

from healer_dev.simulator.exposition import CONTENT_TYPE
from healer_dev.simulator.fleet import EXPORTERS, Fleet

Clock = Callable[[], float]
"""Returns the seconds elapsed since the simulated run began."""


class ElapsedClock:
    """Seconds since construction (monotonic), times ``speed`` (2.0 = the scenario runs twice as fast)."""

    def __init__(self, *, speed: float = 1.0, offset: float = 0.0) -> None:
        if speed <= 0:
            raise ValueError(f"speed must be positive, got {speed}")
        self._start = time.monotonic()
        self.speed = speed
        self.offset = offset

    def __call__(self) -> float:
        return self.offset + (time.monotonic() - self._start) * self.speed

    def restart(self) -> None:
        """Start counting again from ``offset`` now (e.g. once slow set-up is done, so a scenario's
        first faults are not over before anything scrapes them)."""
        self._start = time.monotonic()


class ManualClock:
    """A clock that moves only when told to (tests, replays). Thread-safe enough: a float assignment."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = float(t)

    def __call__(self) -> float:
        return self.t

    def set(self, t: float) -> None:
        """Jump to ``t`` seconds."""
        self.t = float(t)

    def advance(self, seconds: float) -> None:
        """Move forward by ``seconds``."""
        self.t += seconds


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # Prometheus opens many connections at once when thousands of targets start.
    request_queue_size = 1024

    fleet: Fleet
    clock: Clock
    advertise: str
    #: At most this many connections served at once (None: a thread per connection, unbounded).
    slots: threading.BoundedSemaphore | None = None

    def process_request(self, request: Any, client_address: Any) -> None:
        # With slots, the accept loop waits for a free one; new connections queue in the kernel.
        if self.slots is not None:
            self.slots.acquire()
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            if self.slots is not None:
                self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A scraper that hangs up mid-answer (Prometheus stopping, a scrape timeout) is normal.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Close keep-alive connections idle longer than this (seconds), so threads do not pile up.
    timeout = 120
    # Headers and body go out as separate writes; with Nagle on, the client's delayed ACK stalls each
    # keep-alive response by ~40 ms.
    disable_nagle_algorithm = True
    server: _HTTPServer

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        parts = path.strip("/").split("/")
        fleet = self.server.fleet
        if len(parts) == 4 and parts[0] == "nodes" and parts[3] == "metrics" and parts[2] in EXPORTERS:
            node, exporter = parts[1], parts[2]
            if node not in fleet:
                self._send(404, f"no node {node!r} in the simulated fleet\n")
                return
            scrape = fleet.scrape(node, exporter, self.server.clock())  # type: ignore[arg-type]
            if scrape.failure == "connection_close":
                self.close_connection = True
                return
            if scrape.failure == "http_503":
                self._send(503, "exporter unavailable (simulated)\n")
                return
            self._send(200, scrape.body, CONTENT_TYPE)
        elif path == "/targets":
            self._send(200, json.dumps(fleet.targets(self.server.advertise)), "application/json")
        elif path == "/status":
            self._send(200, json.dumps(status(fleet, self.server.clock())), "application/json")
        elif path == "/healthz":
            self._send(200, "ok\n")
        elif path == "/":
            first = fleet.node_names[0]
            self._send(
                200,
                f"healer fleet simulator: {len(fleet)} nodes\n"
                f"  /nodes/{first}/dcgm/metrics\n  /nodes/{first}/node/metrics\n"
                "  /targets  /status  /healthz\n",
            )
        else:
            self._send(404, "not found\n")

    def _send(self, status: int, body: str, content_type: str = "text/plain; charset=utf-8") -> None:
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape per target per interval is not worth a log line


def status(fleet: Fleet, t: float) -> dict[str, Any]:
    """The ``/status`` document at ``t`` seconds (see the module docstring)."""
    active = []
    for fault in fleet.scenario.faults:
        duration = getattr(fault, "duration", None)
        if fault.at <= t and (duration is None or t < fault.at + duration):
            active.append(fault.model_dump(mode="json"))
    return {
        "elapsed_seconds": t,
        "nodes": len(fleet),
        "label_style": str(fleet.config.label_style),
        "seed": fleet.config.seed,
        "scenario": fleet.scenario.name,
        "active_faults": active,
    }


class SimulatorServer:
    """Serves a :class:`Fleet` over HTTP (URL layout in the module docstring).

    Args:
        fleet: the simulated fleet.
        clock: seconds since the run began; read once per request.
        host, port: where to listen; port 0 picks a free port (see :attr:`port`).
        advertise: ``host:port`` written into service-discovery targets; default the listening address.
        max_connections: serve at most this many connections at once (default: no limit, a thread
            each). For scrapers that close each connection (VictoriaMetrics' ``disable_keepalive``):
            a keep-alive connection holds its slot until it closes. Thousands of connections at
            once, each a thread contending for the interpreter lock, took a shared 2-core machine's
            load average past 100 (10,240 nodes, session 5); bounded, they wait in the listen queue.

    Use as a context manager (serves in a background thread) or call :meth:`serve_forever`.

    Raises:
        OSError: the address cannot be bound.
    """

    def __init__(
        self,
        fleet: Fleet,
        *,
        clock: Clock,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise: str | None = None,
        max_connections: int | None = None,
    ) -> None:
        self.fleet = fleet
        self.clock = clock
        self._httpd = _HTTPServer((host, port), _Handler)
        if max_connections is not None:
            self._httpd.slots = threading.BoundedSemaphore(max_connections)
        self._httpd.fleet = fleet
        self._httpd.clock = clock
        self.host = host
        self.port = int(self._httpd.server_address[1])
        self.address = advertise or f"{host}:{self.port}"
        self._httpd.advertise = self.address
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:9400``."""
        return f"http://{self.host}:{self.port}"

    def write_file_sd(
        self,
        path: Path | str,
        *,
        node_exporters: dict[str, str] | None = None,
        nodes: list[str] | None = None,
    ) -> Path:
        """Write the targets of ``nodes`` (default every node) as a ``file_sd_configs`` JSON file
        pointing at this server (the InfiniBand side at ``node_exporters`` ``{node: host:port}``
        instead, where given)."""
        return self.fleet.write_file_sd(
            path, address=self.address, node_exporters=node_exporters, nodes=nodes
        )

    def serve_forever(self) -> None:
        """Serve in the calling thread until :meth:`stop` (or KeyboardInterrupt)."""
        self._httpd.serve_forever(poll_interval=0.05)

    def start(self) -> SimulatorServer:
        """Serve in a daemon thread; returns self."""
        self._thread = threading.Thread(target=self.serve_forever, name="fleet-simulator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> SimulatorServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
