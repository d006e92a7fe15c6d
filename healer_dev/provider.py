"""A small real webhook receiver: a stand-in provider for the demo and the tests.

It listens on HTTP, checks healer's signature (when given the secret), records every request,
answers like a ticketing system (``201 {"id": "RCV-1", "key": "RCV-1"}``; the same id again for
a repeated ``Idempotency-Key``), and can misbehave on purpose:

- ``fail_first=N``: answer the first N webhooks with ``fail_status`` (500), optionally with a
  ``Retry-After`` header;
- ``reject_status=400``: refuse every webhook with that status and a JSON error body;
- ``ack_after`` / ``resolve_after`` (seconds): after accepting a new ticket, call healer back,
  signed with the callback secret over method, path and body
  (:func:`healer.tickets.signing.sign_callback`), at ``<callback_url>/api/v1/tickets/<id>/status`` (or
  ``callback_url`` with ``{ticket_id}`` filled in), taking the id from ``X-Healer-Ticket-Id``.

``GET /requests`` lists what it received (JSON), ``GET /healthz`` answers ``ok``.

Run it with ``healer provider-receiver --port 9300 --callback-url http://127.0.0.1:8080``, or in
a test::

    with Receiver(fail_first=3) as rcv:
        ... deliver to rcv.url ...
        assert [r.status for r in rcv.requests] == [500, 500, 500, 201]
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from healer.clock import utc_now
from healer.errors import SignatureError
from healer.redaction import redact_url
from healer.tickets import signing

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReceivedRequest:
    """One webhook as the receiver saw it, and what it answered."""

    at: datetime
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    status: int
    signature: str  # "ok", "bad: <why>", or "unchecked" (no secret given)

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def idempotency_key(self) -> str | None:
        return self.headers.get(signing.IDEMPOTENCY_HEADER.lower())


@dataclass(frozen=True)
class Callback:
    """A status callback the receiver sent to healer, and healer's answer (None: transport error)."""

    ticket_id: str
    status: str
    http_status: int | None
    answer: str


@dataclass
class Receiver:
    """The stand-in provider. Start with :meth:`start` (or ``with``); stop with :meth:`stop`.

    ``max_skew_seconds`` also checks the signature's timestamp against ``clock`` (off by default,
    since tests sign with a simulated ``now``).
    """

    host: str = "127.0.0.1"
    port: int = 0
    secret: bytes | None = None
    fail_first: int = 0
    fail_status: int = 500
    retry_after: str | None = None
    reject_status: int | None = None
    callback_url: str | None = None
    callback_secret: bytes | None = None
    ack_after: float | None = None
    resolve_after: float | None = None
    max_skew_seconds: float | None = None
    clock: Callable[[], datetime] = utc_now

    requests: list[ReceivedRequest] = field(default_factory=list, init=False)
    callbacks: list[Callback] = field(default_factory=list, init=False)
    tickets: dict[str, str] = field(default_factory=dict, init=False)  # idempotency key -> our id
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _server: ThreadingHTTPServer | None = field(default=None, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _timers: list[threading.Timer] = field(default_factory=list, init=False, repr=False)
    _failures: int = field(default=0, init=False, repr=False)

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:40123`` (any path is accepted for webhooks)."""
        assert self._server is not None, "receiver not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Receiver:
        handler = type("Handler", (_Handler,), {"receiver": self})
        self._server = ThreadingHTTPServer((self.host, self.port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            # A short poll so stop() returns promptly (the default 0.5 s is paid on every stop).
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="provider-receiver",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            timers = list(self._timers)
        for timer in timers:
            timer.cancel()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def serve_forever(self) -> None:
        """Run in the foreground until interrupted (the CLI); starts the server if not started."""
        if self._server is None:
            self.start()
        assert self._thread is not None
        try:
            while self._thread.is_alive():
                self._thread.join(timeout=0.5)
        finally:
            self.stop()

    # --- behaviour ------------------------------------------------------------------------------

    def _check_signature(self, headers: dict[str, str], body: bytes) -> str:
        if self.secret is None:
            return "unchecked"
        skew = self.max_skew_seconds if self.max_skew_seconds is not None else float("inf")
        try:
            signing.verify(
                self.secret, headers=_Lower(headers), body=body, now=self.clock(), max_skew_seconds=skew
            )
        except SignatureError as exc:
            return f"bad: {exc}"
        return "ok"

    def handle_webhook(
        self, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], Any]:
        """Decide the answer to one webhook and record it: (status, extra headers, JSON body)."""
        signature = self._check_signature(headers, body)
        extra: dict[str, str] = {}
        answer: dict[str, Any]
        new_ticket: tuple[str, str] | None = None
        with self._lock:
            key = headers.get(signing.IDEMPOTENCY_HEADER.lower(), "")
            if signature.startswith("bad"):
                status, answer = 401, {"error": signature}
            elif self._failures < self.fail_first:
                self._failures += 1
                status, answer = self.fail_status, {"error": f"simulated failure {self._failures}"}
                if self.retry_after is not None:
                    extra["Retry-After"] = self.retry_after
            elif self.reject_status is not None:
                status, answer = self.reject_status, {"error": "rejected: missing field 'asset_tag'"}
            elif key and key in self.tickets:
                status, answer = 200, {"id": self.tickets[key], "key": self.tickets[key], "duplicate": True}
            else:
                ours = f"RCV-{len(self.tickets) + 1}"
                if key:
                    self.tickets[key] = ours
                status, answer = 201, {"id": ours, "key": ours}
                ticket_id = headers.get(signing.TICKET_ID_HEADER.lower())
                if ticket_id:
                    new_ticket = (ticket_id, ours)
            self.requests.append(
                ReceivedRequest(
                    at=self.clock(), path=path, headers=headers, body=body, status=status, signature=signature
                )
            )
        log.info("webhook %s key=%s signature=%s -> %d", redact_url(path), key or "-", signature, status)
        if new_ticket is not None:
            self._schedule_callbacks(*new_ticket)
        return status, extra, answer

    def _schedule_callbacks(self, ticket_id: str, external_id: str) -> None:
        if not self.callback_url:
            return
        planned = sorted(
            (delay, status)
            for status, delay in (("acknowledged", self.ack_after), ("resolved", self.resolve_after))
            if delay is not None
        )
        if not planned:
            return

        def send_in_order(step: int = 0) -> None:
            # One after the other, as a provider would: the resolve never overtakes the ack.
            delay, status = planned[step]
            self.send_callback(ticket_id, status, external_id)
            if step + 1 < len(planned):
                self._start_timer(max(0.0, planned[step + 1][0] - delay), send_in_order, step + 1)

        self._start_timer(planned[0][0], send_in_order)

    def _start_timer(self, delay: float, func: Callable[..., None], *args: Any) -> None:
        timer = threading.Timer(delay, func, args=args)
        timer.daemon = True
        with self._lock:
            self._timers.append(timer)
        timer.start()

    def callback_target(self, ticket_id: str) -> str:
        assert self.callback_url
        if "{ticket_id}" in self.callback_url:
            return self.callback_url.replace("{ticket_id}", ticket_id)
        return f"{self.callback_url.rstrip('/')}/api/v1/tickets/{ticket_id}/status"

    def send_callback(
        self, ticket_id: str, status: str, external_id: str | None = None, **extra: Any
    ) -> Callback:
        """POST a signed status callback to healer now; returns and records healer's answer."""
        now = self.clock()
        payload: dict[str, Any] = {"status": status, "at": now.isoformat(), **extra}
        if external_id:
            payload["external_id"] = external_id
        if status in ("rejected", "needs_info"):
            payload.setdefault("reason", f"{status} by the stand-in provider")
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"}
        if self.callback_secret is not None:
            headers.update(
                signing.callback_headers(
                    self.callback_secret,
                    method="POST",
                    path=signing.callback_path(ticket_id),
                    body=body,
                    now=now,
                )
            )
        url = self.callback_target(ticket_id)
        try:
            response = httpx.post(url, content=body, headers=headers, timeout=10.0)
            result = Callback(ticket_id, status, response.status_code, response.text[:500])
        except httpx.HTTPError as exc:
            result = Callback(ticket_id, status, None, exc.__class__.__name__)
        log.info(
            "callback %s for ticket %s to %s -> %s",
            status,
            ticket_id,
            redact_url(url),
            result.http_status,
        )
        with self._lock:
            self.callbacks.append(result)
        return result

    def summary(self) -> list[dict[str, Any]]:
        """What ``GET /requests`` returns: per request its time, path, key, status and signature check."""
        with self._lock:
            return [
                {
                    "at": r.at.isoformat(),
                    "path": r.path,
                    "idempotency_key": r.idempotency_key,
                    "ticket_id": r.headers.get(signing.TICKET_ID_HEADER.lower()),
                    "status": r.status,
                    "signature": r.signature,
                    "body": r.body.decode(errors="replace"),
                }
                for r in self.requests
            ]


class _Lower(dict[str, str]):
    """Case-insensitive lookups over lower-case keys."""

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(key.lower(), default)


class _Handler(BaseHTTPRequestHandler):
    receiver: Receiver
    protocol_version = "HTTP/1.1"

    def _answer(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._answer(200, "ok")
        elif self.path == "/requests":
            self._answer(200, self.receiver.summary())
        else:
            self._answer(404, {"error": "not found"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, extra, answer = self.receiver.handle_webhook(self.path, headers, body)
        self._answer(status, answer, extra)

    def log_message(self, format: str, *args: Any) -> None:
        # The request line carries the webhook path, which may be a credential (Slack-style URLs).
        pass
