"""Security headers on every response (pure ASGI, so errors, static files and 413s get them too).

- ``Content-Security-Policy``: only this origin's scripts (``static/fleet.js``, which refreshes the
  fleet page; no inline script, and the pages work without JavaScript), styles and images, no
  framing (``frame-ancestors 'none'``), forms post back here only.
  Inline ``style`` attributes are allowed for the chart legend's colour swatches.
- ``X-Frame-Options: DENY`` for browsers without ``frame-ancestors``.
- ``X-Content-Type-Options: nosniff``; ``Referrer-Policy: no-referrer`` (node names stay home).
- ``Cache-Control: no-store`` unless the response set its own (static files): pages and API
  answers carry fleet data and may be per-user.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
}


class SecurityHeadersMiddleware:
    """Add :data:`HEADERS` (and ``Cache-Control: no-store`` when unset) to every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    headers[name] = value
                if "cache-control" not in headers:
                    headers["Cache-Control"] = "no-store"
            await send(message)

        await self.app(scope, receive, send_with_headers)
