"""Fake exporters for tests (exposition text served over HTTP on loopback, changeable at runtime), and
where a rule's result series points: its node and its GPU or HCA port."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from healer.ruleset.device_filter import DeviceFilter
from healer.ruleset.loading import load_ruleset
from healer.ruleset.schema import Rule
from healer_dev.prometheus import PrometheusServer


class Pages:
    """What the fake exporters answer, per path; a page set to ``None`` answers 503 (exporter down)."""

    def __init__(self, pages: dict[str, str | None]) -> None:
        self._lock = threading.Lock()
        self._pages = dict(pages)

    def set(self, path: str, body: str | None) -> None:
        with self._lock:
            self._pages[path] = body

    def get(self, path: str) -> str | None:
        with self._lock:
            return self._pages.get(path)

    def __contains__(self, path: object) -> bool:
        with self._lock:
            return path in self._pages


@contextlib.contextmanager
def serve(pages: Pages) -> Iterator[str]:
    """Serve ``pages`` over HTTP on loopback; yields ``host:port``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path)
            if body is None:
                self.send_error(503 if self.path in pages else 404)
                return
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def node_of(labels: dict[str, str], rule: Rule) -> str | None:
    """The node a series belongs to: the first non-empty label of the rule's node label chain."""
    return next((labels[name] for name in rule.node_labels if labels.get(name)), None)


def target_of(labels: dict[str, str], rule: Rule) -> str | None:
    """What on the node: the GPU index, or ``device:port`` of an HCA; None for node-wide rules."""
    if "device" in labels and "port" in labels:
        return f"{labels['device']}:{labels['port']}"
    return labels.get(rule.gpu_label)


def findings(prom: PrometheusServer, rule: Rule) -> dict[tuple[str | None, str | None], str]:
    """{(node, GPU or device:port): value} of the rule's expression now."""
    return {
        (node_of(s["metric"], rule), target_of(s["metric"], rule)): s["value"][1]
        for s in prom.query(rule.expr)
    }


def all_findings(
    prom: PrometheusServer, pack: dict[str, Rule]
) -> dict[str, dict[tuple[str | None, str | None], str]]:
    """{rule: findings} of every rule of ``pack`` that returns something now."""
    return {name: found for name, rule in pack.items() if (found := findings(prom, rule))}


def load_pack(exclude: str = "") -> dict[str, Rule]:
    """The default pack (``rules/``) loaded with ``exclude`` as the settings' InfiniBand
    ``device_exclude``, as an operator sets it."""
    rules = Path(__file__).resolve().parents[1] / "rules"
    return {r.name: r for r in load_ruleset([rules], device_filter=DeviceFilter(exclude=exclude)).rules}
