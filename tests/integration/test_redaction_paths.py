"""Secrets never shown: credentials in the Prometheus URL, tokens in a provider URL's path and
query, and a provider that echoes the request back, through every way text leaves healer.

Real HTTP throughout: a provider stand-in on loopback that answers 400 quoting everything it
was sent, healer's delivery, the dashboard and API over uvicorn, and the ``healer`` command run as
a subprocess (its output and its logs).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml
from sqlalchemy.orm import Session, sessionmaker

from healer.config import load_settings
from healer.tickets.delivery import deliver_due
from tests.integration.test_api_support import (
    VIEWER_TOKEN,
    bearer,
    build_app,
    http_client,
    make_settings,
    seed,
)
from tests.integration.test_ticket_delivery import new_ticket
from tests.services import free_port

PROM_PASSWORD = "pr0m-pa55w0rd"
PATH_TOKEN = "tok3nS3cretPath0123456"
QUERY_KEY = "q-key-98765x"
HEADER_KEY = "hdr-secret-4567"
USER_PASSWORD = "pw-secret-abc"
SECRETS = (PROM_PASSWORD, PATH_TOKEN, QUERY_KEY, HEADER_KEY, USER_PASSWORD)


def assert_clean(text: str, where: str) -> None:
    leaked = [s for s in SECRETS if s in text]
    assert not leaked, f"{where} shows {leaked}: {text[:2000]}"


@contextlib.contextmanager
def echoing_provider() -> Iterator[int]:
    """A provider that refuses every ticket (400) quoting the request line, headers and body."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode(errors="replace")
            echo = {
                "error": f"cannot route POST {self.path}",
                "headers": dict(self.headers.items()),
                "received": body[:200],
            }
            data = json.dumps(echo).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def failed_delivery(
    session_factory: sessionmaker[Session], migrated_db_url: str, tmp_path: Path
) -> Iterator[tuple[Path, str]]:
    """A ticket whose delivery the echoing provider refused; yields (config file, provider URL)."""
    with echoing_provider() as port:
        url = f"http://acme:{USER_PASSWORD}@127.0.0.1:{port}/intake/{PATH_TOKEN}/create?apikey={QUERY_KEY}"
        tickets = {
            "cluster_name": "test",
            "providers": [{"name": "acme", "url": url, "headers": {"X-Api-Key": HEADER_KEY}}],
        }
        config = tmp_path / "healer.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "database": {"url": migrated_db_url},
                    "prometheus": {"url": f"http://admin:{PROM_PASSWORD}@127.0.0.1:{free_port()}"},
                    "tickets": tickets,
                }
            )
        )
        new_ticket(session_factory)
        with httpx.Client() as client:
            report = deliver_due(
                session_factory=session_factory,
                settings=load_settings(tickets=tickets),
                now=datetime.now(UTC),
                client=client,
            )
        assert report.failed == 1, report
        yield config, url


def healer_cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEALER_")}
    return subprocess.run(
        [sys.executable, "-m", "healer", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_provider_echo_is_redacted_in_api_pages_and_cli(
    failed_delivery: tuple[Path, str], session_factory: sessionmaker[Session]
) -> None:
    config, _ = failed_delivery
    with http_client(build_app(session_factory)) as client:
        tickets = client.get("/api/v1/tickets", headers=bearer(VIEWER_TOKEN))
        assert tickets.status_code == 200
        assert "REDACTED" in tickets.text  # the echoed error is shown, redacted
        assert_clean(tickets.text, "/api/v1/tickets")
        for path in ("/tickets", "/audit", "/api/v1/audit", "/nodes/gpu-node-1", "/api/v1/nodes/gpu-node-1"):
            r = client.get(path, headers=bearer(VIEWER_TOKEN))
            assert r.status_code == 200, path
            assert_clean(r.text, path)
    listed = healer_cli(config, "ticket", "list")
    assert listed.returncode == 0, listed.stderr
    assert "last error" in listed.stdout and "REDACTED" in listed.stdout
    assert_clean(listed.stdout + listed.stderr, "healer ticket list")
    as_json = healer_cli(config, "ticket", "list", "--json")
    assert_clean(as_json.stdout + as_json.stderr, "healer ticket list --json")


def test_retry_output_and_logs_are_redacted(failed_delivery: tuple[Path, str]) -> None:
    config, _ = failed_delivery
    retried = healer_cli(config, "ticket", "retry", "1")
    assert retried.returncode == 0, retried.stderr
    delivered = healer_cli(config, "ticket", "deliver")
    assert "failed" in delivered.stdout, delivered.stdout
    assert_clean(delivered.stdout + delivered.stderr, "healer ticket deliver")


def test_prometheus_credentials_never_shown(session_factory: sessionmaker[Session], tmp_path: Path) -> None:
    seed(session_factory)
    url = f"http://admin:{PROM_PASSWORD}@127.0.0.1:{free_port()}"
    settings = make_settings(anonymous_role="viewer")
    settings = settings.model_copy(update={"prometheus": settings.prometheus.model_copy(update={"url": url})})
    with http_client(build_app(session_factory, settings)) as client:
        page = client.get("/nodes/gpu-node-07")
        assert page.status_code == 200 and "Metrics unavailable" in page.text
        assert "REDACTED@127.0.0.1" in page.text
        assert_clean(page.text, "the node page")
    config = tmp_path / "healer.yaml"
    config.write_text(yaml.safe_dump({"prometheus": {"url": url, "timeout_seconds": 1}}))
    once = healer_cli(config, "evaluate", "--once", "--no-store")
    assert once.returncode == 1 and "REDACTED@127.0.0.1" in once.stdout + once.stderr
    assert_clean(once.stdout + once.stderr, "healer evaluate --once")
