"""The API's one error type and the handlers that render it.

Every refusal is an :class:`ApiError` (status, machine-readable ``code``, human ``message``). Under
``/api/`` it is rendered as ``{"error": {"code": ..., "message": ...}}``; elsewhere as an HTML page
(401 on a page redirects to the login form instead).

Codes: ``bad_request`` and ``invalid_cursor`` (400), ``unauthorized`` (401), ``forbidden`` and
``csrf`` (403), ``not_found`` (404), ``method_not_allowed`` (405), ``conflict`` (409),
``payload_too_large`` (413), ``validation_error`` (422), ``unavailable`` (503).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.rendering import render

_DEFAULT_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    422: "validation_error",
    503: "unavailable",
}


class ApiError(Exception):
    """A request refused on purpose, with the HTTP ``status``, a stable ``code`` and a ``message``."""

    def __init__(self, status: int, message: str, *, code: str | None = None) -> None:
        self.status = status
        self.code = code or _DEFAULT_CODES.get(status, "error")
        self.message = message
        super().__init__(message)


def error_body(code: str, message: str) -> dict[str, Any]:
    """The JSON error body: ``{"error": {"code": code, "message": message}}``."""
    return {"error": {"code": code, "message": message}}


def _wants_json(request: Request) -> bool:
    return request.url.path.startswith("/api/") or request.url.path == "/openapi.json"


def _render(request: Request, status: int, code: str, message: str) -> Response:
    if _wants_json(request):
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return JSONResponse(error_body(code, message), status_code=status, headers=headers)
    if status == 401:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)
    return render(
        request, "error.html", {"status": status, "code": code, "message": message}, status_code=status
    )


def install_error_handlers(app: FastAPI) -> None:
    """Render :class:`ApiError`, HTTP errors and validation errors the same way everywhere."""

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return _render(request, exc.status, exc.code, exc.message)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = _DEFAULT_CODES.get(exc.status_code, "error")
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return _render(request, exc.status_code, code, message)

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        parts = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path"))
            parts.append(f"{where or 'request'}: {err.get('msg')}")
        message = "; ".join(parts) or "invalid request"
        if all(err.get("loc", ("",))[0] == "path" for err in exc.errors()):
            return _render(request, 400, "bad_request", message)  # a URL that names nothing
        return _render(request, 422, "validation_error", message)

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
