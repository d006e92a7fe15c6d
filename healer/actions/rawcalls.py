"""Requests through the official client's own transport, answered as plain JSON.

The generated API methods (``CoreV1Api.patch_node`` ...) validate every call's arguments with
pydantic and build the answer as model objects (a ``V1Node`` and its nested models), which costs
more CPU than the request itself when a pass writes to hundreds of nodes. :func:`call` keeps the
client's request path (``ApiClient.param_serialize`` for the host, default headers and the
kubeconfig's or service account's authentication; ``ApiClient.call_api`` for the TLS-configured
urllib3 pool and ``_request_timeout``) and skips the rest: the body goes as the plain dict given,
the answer comes back as the API server's JSON.

Errors are the client's: a non-2xx answer raises ``ApiException`` (with status, reason and body,
as the generated methods raise it), so :func:`healer.actions.apierrors.api_call` maps it the same.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

#: The authentication schemes the generated methods name (a bearer token; client certificates are
#: set on the urllib3 pool by the configuration).
AUTH_SETTINGS = ["BearerToken"]


def call(
    api: k8s.ApiClient,
    method: str,
    path: str,
    *,
    body: Any = None,
    content_type: str | None = None,
    query: list[tuple[str, str]] | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Send ``method path`` (``path`` already URL-safe: Kubernetes names are) and return the
    answer's JSON object.

    Raises:
        ApiException: the API server answered outside 2xx (``status``, ``reason``, ``body`` set).
        urllib3.exceptions.HTTPError, OSError: transport failures, as the generated methods raise them.
    """
    headers = {"Accept": "application/json"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    request = api.param_serialize(
        method=method,
        resource_path=path,
        query_params=query or None,
        header_params=headers,
        body=body,
        auth_settings=AUTH_SETTINGS,
    )
    response = api.call_api(*request, _request_timeout=timeout)
    data = response.read()
    if not 200 <= response.status <= 299:
        raise ApiException.from_response(
            http_resp=response, body=data.decode("utf-8", errors="replace") if data else None, data=None
        )
    answer: dict[str, Any] = json.loads(data) if data else {}
    return answer
