"""Hostile callbacks and bodies: a captured callback, another provider's secret, and huge bodies.

Real HTTP to the app over uvicorn; the body-size tests run ``healer serve`` as its own process
and read its peak memory from ``/proc``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy.orm import Session, sessionmaker

from healer.config import Settings, load_settings
from healer.wiring import dashboard
from tests.integration.test_api_support import OPERATOR_TOKEN, VIEWER_TOKEN, make_settings
from tests.integration.test_ticket_callbacks import (
    CALLBACK_SECRET,
    NOW,
    minimal_app,
    sent_ticket,
    serve,
    signed,
    snapshot,
)
from tests.integration.test_ticket_delivery import new_ticket
from tests.services import free_port, wait_until

ACME_SECRET = "acme-callback-secret-111111"
BETA_SECRET = "beta-callback-secret-222222"


@pytest.fixture
def callback_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PROVIDER_SECRET", "provider-secret-zyxwvu-987654")
    monkeypatch.setenv("TEST_CALLBACK_SECRET", CALLBACK_SECRET)
    monkeypatch.setenv("ACME_CALLBACK", ACME_SECRET)
    monkeypatch.setenv("BETA_CALLBACK", BETA_SECRET)


def settings_with(*, shared: bool, acme_own: bool = True) -> Settings:
    acme: dict[str, Any] = {
        "name": "acme",
        "url": "http://127.0.0.1:9/",
        "secret_env": "TEST_PROVIDER_SECRET",
    }
    if acme_own:
        acme["callback_secret_env"] = "ACME_CALLBACK"
    beta = {"name": "beta", "url": "http://127.0.0.1:9/", "callback_secret_env": "BETA_CALLBACK"}
    return load_settings(
        tickets={
            "cluster_name": "test",
            "providers": [acme, beta],
            "callback_secret_env": "TEST_CALLBACK_SECRET" if shared else None,
        }
    )


@pytest.fixture
def client(session_factory: sessionmaker[Session], callback_secrets: None) -> Iterator[httpx.Client]:
    app = dashboard(settings_with(shared=False), session_factory, clock=lambda: NOW)
    with serve(app) as c:
        yield c


def post(client: httpx.Client, ticket_id: int, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return client.post(f"/api/v1/tickets/{ticket_id}/status", content=body, headers=headers)


class TestBoundToTheTicket:
    def test_a_captured_callback_does_not_resolve_another_ticket(
        self, client: httpx.Client, session_factory: sessionmaker[Session]
    ) -> None:
        first = sent_ticket(session_factory)
        second = new_ticket(session_factory, node_name="gpu-node-2")
        body, headers = signed({"status": "resolved"}, secret=ACME_SECRET, ticket_id=first)
        before = snapshot(session_factory, second)
        refused = post(client, second, body, headers)
        assert refused.status_code == 401 and "does not match" in refused.text
        assert snapshot(session_factory, second) == before
        assert post(client, first, body, headers).status_code == 200

    def test_equal_bodies_for_two_tickets_are_not_a_replay(
        self, client: httpx.Client, session_factory: sessionmaker[Session]
    ) -> None:
        first = sent_ticket(session_factory)
        second = new_ticket(session_factory, node_name="gpu-node-2")
        for ticket_id in (first, second):  # same body, same second
            body, headers = signed({"status": "acknowledged"}, secret=ACME_SECRET, ticket_id=ticket_id)
            answer = post(client, ticket_id, body, headers)
            assert answer.status_code == 200 and answer.json()["changed"] is True, answer.text

    @pytest.mark.parametrize("ticket_id", ["99999999999999999999", "-1", "0", "1e3", "2147483648"])
    def test_out_of_range_ticket_ids_are_refused_cleanly(self, client: httpx.Client, ticket_id: str) -> None:
        body, headers = signed({"status": "resolved"}, secret=ACME_SECRET)
        answer = client.post(f"/api/v1/tickets/{ticket_id}/status", content=body, headers=headers)
        assert answer.status_code in (400, 422), answer.text
        assert answer.json()["error"]["code"] in ("bad_request", "validation_error")


class TestPerProviderSecrets:
    def test_another_providers_secret_is_refused(
        self, client: httpx.Client, session_factory: sessionmaker[Session]
    ) -> None:
        ticket_id = sent_ticket(session_factory)  # an acme ticket
        before = snapshot(session_factory, ticket_id)
        for secret in (BETA_SECRET, CALLBACK_SECRET):
            body, headers = signed({"status": "resolved"}, secret=secret, ticket_id=ticket_id)
            assert post(client, ticket_id, body, headers).status_code == 401
        assert snapshot(session_factory, ticket_id) == before

    def test_shared_secret_only_when_configured_and_only_for_providers_without_their_own(
        self, session_factory: sessionmaker[Session], callback_secrets: None
    ) -> None:
        ticket_id = sent_ticket(session_factory)
        body, headers = signed({"status": "acknowledged"}, ticket_id=ticket_id)  # the shared secret
        for settings, expected in (
            (settings_with(shared=False, acme_own=False), 401),  # nothing configured for acme
            (settings_with(shared=True, acme_own=True), 401),  # acme has its own
            (settings_with(shared=True, acme_own=False), 200),  # explicitly shared
        ):
            with serve(minimal_app(settings, session_factory, lambda: NOW + timedelta(seconds=1))) as c:
                assert post(c, ticket_id, body, headers).status_code == expected


# --- body limits, against a separate `healer serve` process ---------------------------------------


def peak_rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))


@pytest.fixture
def served(migrated_db_url: str, tmp_path: Path, callback_secrets: None) -> Iterator[tuple[int, int]]:
    """``healer serve`` on a free port; yields (port, pid)."""
    port = free_port()
    config = tmp_path / "healer.yaml"
    api = make_settings().api.model_dump(mode="json")
    config.write_text(
        yaml.safe_dump(
            {
                "database": {"url": migrated_db_url},
                "api": {**api, "anonymous_role": "none"},
                "tickets": {"callback_secret_env": "TEST_CALLBACK_SECRET"},
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEALER_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "healer", "--config", str(config), "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200,
            timeout=60,
            what="healer serve",
        )
        yield port, process.pid
    finally:
        process.terminate()
        process.wait(timeout=20)


def raw_request(port: int, head: str, chunks: Iterator[bytes]) -> tuple[int, bytes]:
    """Send ``head`` then ``chunks`` until the server answers or hangs up; return (status, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.encode())
        try:
            for chunk in chunks:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server refused without reading the rest: what we want
        data = b""
        while b"\r\n\r\n" not in data or len(data) < data.find(b"\r\n\r\n") + 4 + 10:
            try:
                part = sock.recv(65536)
            except ConnectionResetError:
                break  # reset after what it sent: keep what arrived
            if not part:
                break
            data += part
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1]


MIB = 1024 * 1024


def test_declared_huge_bodies_are_refused_before_reading(served: tuple[int, int]) -> None:
    port, pid = served
    before = peak_rss_kib(pid)
    for path, size, auth in (
        ("/api/v1/tickets/1/status", 64 * MIB, ""),  # unsigned callback
        ("/api/v1/pause", 48 * MIB, ""),  # unauthenticated JSON POST
        ("/api/v1/pause", 48 * MIB, f"Authorization: Bearer {OPERATOR_TOKEN}\r\n"),
        ("/login", 48 * MIB, ""),
    ):
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}"
            f"Content-Length: {size}\r\n\r\n"
        )
        # The declaration alone is answered: not a byte of the body was needed (a server that
        # waited for it would leave this read hanging until the socket's timeout).
        status, body = raw_request(port, head, iter([]))
        assert status == 413, (path, body)
        assert json.loads(body)["error"]["code"] == "payload_too_large"
        # A client that sends the body all the same gets the 413 too, and nothing of it is kept.
        # (The server closes with the body's unread bytes in its buffer: the kernel may reset the
        # connection before the error's JSON leaves, so only the status line is certain here.)
        status, body = raw_request(port, head, iter([b"x" * MIB] * (size // MIB)))
        assert status == 413, (path, body)
    assert peak_rss_kib(pid) - before < 16 * 1024  # KiB: nothing near the bodies' size was held


def test_streamed_bodies_are_counted_and_cut_off(served: tuple[int, int]) -> None:
    port, pid = served
    before = peak_rss_kib(pid)

    def chunked(total: int) -> Iterator[bytes]:
        piece = b"y" * (256 * 1024)
        for _ in range(total // len(piece)):
            yield f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
        yield b"0\r\n\r\n"

    head = (
        "POST /api/v1/tickets/1/status HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    )
    status, body = raw_request(port, head, chunked(64 * MIB))
    assert status == 413, body
    assert peak_rss_kib(pid) - before < 16 * 1024
    # and the process still answers
    r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
    assert r.status_code == 200
    ok = httpx.get(
        f"http://127.0.0.1:{port}/api/v1/status", headers={"Authorization": f"Bearer {VIEWER_TOKEN}"}
    )
    assert ok.status_code == 200
