"""Which failed Kubernetes API requests healer retries inside the call, how often and how long
(healer/actions/apiretry.py), through the official client's own transport to a loopback server
that answers from a script: 5xx, 429 with or without ``Retry-After``, a dropped connection."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client as k8s

from healer.actions import rawcalls
from healer.actions.apierrors import api_call
from healer.actions.apiretry import (
    READ_ATTEMPTS,
    RETRY_AFTER_MAX,
    WRITE_ATTEMPTS,
    RetryingApiClient,
    policy_for,
    retry_after,
    transient_answer,
)
from healer.actions.kubernetes import KubernetesNodeActions
from healer.config import KubernetesSettings
from healer.errors import KubernetesError

NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1", "resourceVersion": "7"}}
BUDGET_429 = {
    "kind": "Status",
    "code": 429,
    "reason": "TooManyRequests",
    "details": {"causes": [{"reason": "DisruptionBudget", "message": "needs 1 healthy pod"}]},
}
DROP = "drop"  # close the connection without an answer


@dataclass
class Answer:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=lambda: {"kind": "Status", "message": "scripted"})


class Scripted:
    """A loopback HTTP server answering each request with the next scripted answer (then 200 and
    :data:`NODE`); ``requests`` lists ``METHOD path`` as received."""

    def __init__(self) -> None:
        self.script: list[Answer | str] = []
        self.requests: list[str] = []
        self._lock = threading.Lock()
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                with scripted._lock:
                    scripted.requests.append(f"{self.command} {self.path}")
                    step = scripted.script.pop(0) if scripted.script else Answer(200, body=NODE)
                if step == DROP:
                    self.close_connection = True
                    return
                assert isinstance(step, Answer)
                data = json.dumps(step.body).encode()
                self.send_response(step.status)
                for key, value in {"Content-Type": "application/json", **step.headers}.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _answer

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05})

    def client(self) -> k8s.ApiClient:
        configuration = k8s.Configuration()
        configuration.host = f"http://127.0.0.1:{self.server.server_address[1]}"
        return k8s.ApiClient(configuration)


@pytest.fixture
def server() -> Iterator[Scripted]:
    scripted = Scripted()
    scripted.thread.start()
    try:
        yield scripted
    finally:
        scripted.server.shutdown()
        scripted.server.server_close()


@pytest.fixture
def actions(server: Scripted) -> Iterator[KubernetesNodeActions]:
    with server.client() as api:
        yield KubernetesNodeActions(api, KubernetesSettings(request_timeout_seconds=2))


def call(api: k8s.ApiClient, method: str, path: str, body: Any = None) -> dict[str, Any]:
    """One request as the adapter sends it, its failure mapped to ``KubernetesError``."""
    with api_call(f"{method} {path}"):
        return rawcalls.call(api, method, path, body=body, content_type="application/json", timeout=2)


# -- what is retried ------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_a_read_answered_5xx_is_retried_quickly_and_succeeds(
    server: Scripted, actions: KubernetesNodeActions, status: int
) -> None:
    server.script = [Answer(status), Answer(status)]
    started = time.monotonic()
    assert actions.read_node("gpu-1").name == "gpu-1"
    assert server.requests == ["GET /api/v1/nodes/gpu-1"] * 3
    assert time.monotonic() - started < 1.0, "reads retry within a second"


def test_a_write_whose_connection_dropped_is_sent_again(
    server: Scripted, actions: KubernetesNodeActions
) -> None:
    node = actions.read_node("gpu-1")
    server.script = [DROP]
    assert actions.annotate(node, {"example.com/a": "b"}, what="annotate").name == "gpu-1"
    assert server.requests[1:] == ["PATCH /api/v1/nodes/gpu-1"] * 2


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 410, 422])
def test_other_4xx_are_answered_at_once_not_retried(
    server: Scripted, actions: KubernetesNodeActions, status: int
) -> None:
    server.script = [Answer(status)]
    with pytest.raises(KubernetesError) as failed:
        actions.read_node("gpu-1")
    assert failed.value.status == status
    assert len(server.requests) == 1


def test_reads_and_writes_give_up_after_their_tries_with_the_last_answer(server: Scripted) -> None:
    waits: list[float] = []
    with server.client() as inner:
        api = RetryingApiClient(inner, sleep=waits.append)
        server.script = [Answer(503)] * 10
        with pytest.raises(KubernetesError) as read:
            call(api, "GET", "/api/v1/nodes/gpu-1")
        assert read.value.status == 503 and len(server.requests) == READ_ATTEMPTS
        assert len(waits) == READ_ATTEMPTS - 1 and all(0 <= w <= 0.4 for w in waits)
        assert sum(waits) < 1.0, "a read's retries stay sub-second"

        server.requests.clear()
        waits.clear()
        server.script = [Answer(500)] * 10
        with pytest.raises(KubernetesError) as write:
            call(api, "PATCH", "/api/v1/nodes/gpu-1", {"metadata": {}})
        assert write.value.status == 500 and len(server.requests) == WRITE_ATTEMPTS
    # writes back off exponentially (0.2, 0.4, 0.8 s), each with up to 0.1 s of jitter
    assert all(base <= w <= base + 0.1 for w, base in zip(waits, (0.2, 0.4, 0.8), strict=True))


def test_a_retrying_client_wrapped_again_does_not_multiply_the_tries(server: Scripted) -> None:
    with server.client() as inner:
        twice = RetryingApiClient(RetryingApiClient(inner, sleep=lambda _: None), sleep=lambda _: None)
        server.script = [Answer(503)] * 20
        with pytest.raises(KubernetesError):
            call(twice, "GET", "/api/v1/nodes/gpu-1")
    assert len(server.requests) == READ_ATTEMPTS


# -- Retry-After ------------------------------------------------------------------------------------


def test_a_429_waits_its_retry_after(server: Scripted, actions: KubernetesNodeActions) -> None:
    server.script = [Answer(429, {"Retry-After": "1"})]
    started = time.monotonic()
    assert actions.read_node("gpu-1").name == "gpu-1"
    assert time.monotonic() - started >= 1.0
    assert len(server.requests) == 2


def test_a_long_retry_after_is_cut_to_the_bound(server: Scripted) -> None:
    waits: list[float] = []
    server.script = [Answer(429, {"Retry-After": "3600"}), Answer(503, {"Retry-After": "2"})]
    with server.client() as inner:
        assert call(RetryingApiClient(inner, sleep=waits.append), "PATCH", "/api/v1/nodes/gpu-1", {})
    assert waits == [RETRY_AFTER_MAX, 2.0]


# -- what is left to the caller ------------------------------------------------------------------


def test_evictions_and_watches_are_sent_once(server: Scripted) -> None:
    with server.client() as inner:
        api = RetryingApiClient(inner, sleep=lambda _: None)
        server.script = [Answer(500)]
        with pytest.raises(KubernetesError):
            call(api, "POST", "/api/v1/namespaces/web/pods/web-0/eviction", {})
        server.script = [Answer(500)]
        with pytest.raises(KubernetesError):
            call(api, "GET", "/apis/policy/v1/namespaces/web/poddisruptionbudgets?watch=true")
    assert len(server.requests) == 2


def test_classification() -> None:
    assert all(transient_answer(s, None) for s in (429, 500, 502, 503, 504))
    assert not any(transient_answer(s, None) for s in (200, 201, 400, 403, 404, 409, 422))
    assert not transient_answer(429, json.dumps(BUDGET_429)), "a budget's refusal is not rate limiting"
    assert policy_for("GET", "https://h/api/v1/nodes").kind == "read"  # type: ignore[union-attr]
    assert policy_for("patch", "https://h/api/v1/nodes/a/status").kind == "write"  # type: ignore[union-attr]
    assert policy_for("DELETE", "https://h/api/v1/namespaces/a/pods/b").kind == "write"  # type: ignore[union-attr]
    assert policy_for("GET", "https://h/api/v1/pods?watch=True&fieldSelector=x") is None
    assert policy_for("POST", "https://h/api/v1/namespaces/a/pods/b/eviction") is None
    assert retry_after({"Retry-After": "1"}) == 1.0
    assert retry_after({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}) is None
    assert retry_after({}) is None
