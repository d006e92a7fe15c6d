"""A request body limit on every route, enforced before anything reads the body.

:class:`BodyLimitMiddleware` (pure ASGI) answers 413 at once when ``Content-Length`` is over the
limit, 400 when it is not a number, and counts the bytes of a streamed (chunked) body as the app
reads them, failing with 413 the moment the count passes the limit. Nothing upstream ever holds
more than the limit plus one chunk, whoever sends the request and whether or not it is signed or
authenticated (an unsigned 64 MiB callback costs nothing).
"""

from __future__ import annotations

import json

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
