"""The one place client exceptions become healer's :class:`healer.errors.KubernetesError` tree.

``ApiException`` status 404 → ``KubernetesNotFound``, 409 → ``KubernetesConflict``, 429 →
``KubernetesTooManyRequests``, any other → ``KubernetesError`` (``status`` set); a transport
failure (connection refused or reset, a read slower than ``_request_timeout``: urllib3's
``ReadTimeoutError``, ``MaxRetryError``, ``ProtocolError``, or a raw ``OSError`` from the socket)
→ ``KubernetesError`` with ``status=None``. The client's exception is always the ``__cause__``.
Nothing else of the client escapes an adapter, so one slow or broken call fails one node's step,
never a whole pass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import urllib3
from kubernetes.client.exceptions import ApiException

from healer.errors import KubernetesConflict, KubernetesError, KubernetesNotFound, KubernetesTooManyRequests


def api_error(exc: ApiException, what: str) -> KubernetesError:
    """Our error for a client ``ApiException`` (raise it ``from exc``); the body is kept, cut at 500."""
    status = exc.status
    message = f"{what}: HTTP {status} {exc.reason or ''}".rstrip()
    body = exc.body.strip() if isinstance(exc.body, str) else ""
    if body:
        message += f": {body[:500]}"
    cls: type[KubernetesError] = {
        404: KubernetesNotFound,
        409: KubernetesConflict,
        429: KubernetesTooManyRequests,
    }.get(status or 0, KubernetesError)
    return cls(message, status=status)


@contextlib.contextmanager
def api_call(what: str) -> Iterator[None]:
    """Turn client exceptions raised inside into :class:`KubernetesError` (cause chained).

    ``what`` names the call for the message, e.g. ``"cordon node gpu-1"``.
    """
    try:
        yield
    except ApiException as exc:
        raise api_error(exc, what) from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise KubernetesError(f"{what}: {type(exc).__name__}: {exc}", status=None) from exc
