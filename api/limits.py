"""Limits on what a request may cost: its body, and how many requests are handled at once.

A request body limit on every route, enforced before anything reads the body.

:class:`BodyLimitMiddleware` (pure ASGI) answers 413 at once when ``Content-Length`` is over the
limit, 400 when it is not a number, and counts the bytes of a streamed (chunked) body as the app
reads them, failing with 413 the moment the count passes the limit. Nothing upstream ever holds
more than the limit plus one chunk, whoever sends the request and whether or not it is signed or
authenticated (an unsigned 64 MiB callback costs nothing).

:class:`ConcurrencyLimitMiddleware` handles at most two pages or API requests at once; the others
wait for their turn on the event loop, holding no thread. Pages and API answers render on threads,
and every thread that runs Python takes turns on one interpreter lock with the event loop: a storm
of fleet-page requests on FastAPI's 40 threads left the event loop one turn in 40, and
``/healthz`` answered seconds late (a liveness probe restarting a busy healer). Rendering is bound
by that lock anyway, so two at a time serve a storm about as fast. The probes and ``/metrics`` skip
the queue, and so do node pages, which mostly wait on Prometheus (their charts have a gate of their
own); a rule's backtest has a queue of one.
"""

from __future__ import annotations

import asyncio
import json
import re

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Default limit, bytes: callbacks, forms and JSON operations are a few kilobytes.
DEFAULT_MAX_BODY_BYTES = 1024 * 1024


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` when a streamed body passes the limit (rendered as a 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body larger than {limit} bytes")


class BodyLimitMiddleware:
    """Refuse request bodies over ``max_bytes`` (413) without reading them whole."""

    def __init__(self, app: ASGIApp, *, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = [v for k, v in scope.get("headers", []) if k == b"content-length"]
        if declared:
            raw = declared[0].strip()
            if len(declared) > 1 or not raw.isdigit() or len(raw) > 18:
                await _refuse(send, 400, "bad_request", "invalid Content-Length")
                return
            if int(raw) > self.max_bytes:
                await _refuse(
                    send, 413, "payload_too_large", f"request body larger than {self.max_bytes} bytes"
                )
                return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge as exc:
            if started:
                raise
            await _refuse(send, 413, "payload_too_large", str(exc.detail))


async def _refuse(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


#: Requests handled at once per lane; a request outside every lane is never queued.
LANES = {"pages": 2, "backtest": 1}
#: Never queued: the probes, the scrape, static files, node pages, which spend their time
#: waiting on Prometheus for their chart, bounded by their own gate (``api.charts.ChartGate``), and
#: Alertmanager's webhook (it only wakes the controller: an alert must not wait behind pages).
UNQUEUED = re.compile(r"/healthz|/readyz|/metrics|/nodes/[^/]+|/static/.+|/api/v1/alertmanager/webhook")
#: A rule's backtest replays days of history: one at a time, beside the other pages.
BACKTEST = re.compile(r"/rules/[^/]+/backtest")


def lane(path: str) -> str | None:
    """The lane whose queue a request for ``path`` waits in (None: it is not queued)."""
    if UNQUEUED.fullmatch(path):
        return None
    return "backtest" if BACKTEST.fullmatch(path) else "pages"


class ConcurrencyLimitMiddleware:
    """At most ``lanes[name]`` requests of each lane (:func:`lane`) in the app at once; the others
    wait in arrival order, on the event loop, holding no thread."""

    def __init__(self, app: ASGIApp, *, lanes: dict[str, int] | None = None) -> None:
        self.app = app
        self.lanes = dict(LANES if lanes is None else lanes)
        self._slots: dict[str, asyncio.Semaphore] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = lane(scope["path"]) if scope["type"] == "http" else None
        if name is None:
            await self.app(scope, receive, send)
            return
        slots = self._slots.get(name)
        if slots is None:  # made on the event loop that serves the app
            slots = self._slots[name] = asyncio.Semaphore(self.lanes[name])
        async with slots:
            await self.app(scope, receive, send)
