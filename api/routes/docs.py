"""The API's own documentation, behind the same access rules as the API.

``/openapi.json`` is the OpenAPI document; ``/docs`` a server-rendered reference built from it
(every path, method, summary and parameter), served from this package: no CDN, no JavaScript, so
it works offline and under the strict Content-Security-Policy (:mod:`api.headers`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from api.deps import IdentityDep
from api.rendering import render

router = APIRouter(include_in_schema=False)

_METHODS = ("get", "post", "put", "patch", "delete")


@router.get("/openapi.json")
def openapi_document(request: Request, _who: IdentityDep) -> JSONResponse:
    """The OpenAPI document (needs the viewer role, like the API it describes)."""
    return JSONResponse(request.app.openapi())


@router.get("/docs")
def api_reference(request: Request, _who: IdentityDep) -> Response:
    """The API reference page."""
    spec: dict[str, Any] = request.app.openapi()
    operations = [
        {
            "method": method.upper(),
            "path": path,
            "summary": op.get("summary", ""),
            "description": op.get("description", ""),
            "parameters": [
                {"name": p.get("name"), "in": p.get("in"), "required": p.get("required", False)}
                for p in op.get("parameters", [])
            ],
        }
        for path, item in sorted(spec.get("paths", {}).items())
        for method, op in item.items()
        if method in _METHODS
    ]
    return render(request, "docs.html", {"spec": spec, "operations": operations})
