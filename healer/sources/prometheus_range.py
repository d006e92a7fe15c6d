"""Prometheus range queries (``/api/v1/query_range``) for charts of one node's GPUs.

The detection path uses instant queries (:mod:`healer.sources.prometheus`); this adapter only
serves the dashboard, so it is small, synchronous and bounded by a timeout: a chart must never hold
a page hostage.

Errors: :class:`~healer.errors.QueryError` when Prometheus refuses the expression (``bad_data``),
:class:`~healer.errors.SourceUnavailable` for everything else (timeout, transport error, 5xx,
non-JSON body).
"""

from __future__ import annotations

import math
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import certifi
import httpx

from healer.errors import QueryError, SourceUnavailable
from healer.redaction import redact_text, redact_url

#: Points per chart: enough for a smooth line at dashboard width, few enough to stay light.
DEFAULT_POINTS = 240


@dataclass(frozen=True)
class RangeSeries:
    """One series of a range query: its labels and ``(unix seconds, value)`` points; NaN dropped."""

    labels: dict[str, str]
    points: list[tuple[float, float]] = field(default_factory=list)


def promql_string(value: str) -> str:
    """``value`` as a double-quoted PromQL string literal (label values are attacker-controllable)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def node_selector_expr(metric: str, node: str, node_labels: Sequence[str]) -> str:
    """``metric`` for ``node`` under any of ``node_labels`` (the rules' node label chain), as one
    expression: ``m{Hostname="n"} or m{hostname="n"} or ...``."""
    literal = promql_string(node)
    return " or ".join(f"{metric}{{{label}={literal}}}" for label in node_labels)


def step_for(start: datetime, end: datetime, *, points: int = DEFAULT_POINTS) -> float:
    """Query step in seconds giving about ``points`` points over the window; at least 1 s."""
    return max(1.0, math.ceil((end - start).total_seconds() / points))


class PrometheusRange:
    """Runs range queries against one Prometheus (or compatible) base URL.

    Args:
        url: base URL, e.g. ``http://prometheus:9090``.
        timeout_seconds: connect+read timeout of one request.
        headers: extra HTTP headers (tenant, auth).
        verify_tls: verify the server certificate.
        transport: an httpx transport (tests may inject one; production uses the default).
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_seconds: float = 3.0,
        headers: Mapping[str, str] | None = None,
        verify_tls: bool = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._url = url.rstrip("/")
        self._timeout = timeout_seconds
        self._headers = dict(headers or {})
        # Built once: an SSL context costs tens of milliseconds, more than the query itself. Each
        # query still uses its own short-lived client, so no connection outlives a request.
        self._verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=certifi.where()) if verify_tls else False
        )
        self._transport = transport

    def query_range(
        self, expr: str, *, start: datetime, end: datetime, step_seconds: float
    ) -> list[RangeSeries]:
        """Run ``expr`` over ``[start, end]`` every ``step_seconds``.

        Returns every series with its finite points (NaN and ±Inf dropped: they cannot be drawn).

        Raises:
            QueryError: Prometheus refused the expression.
            SourceUnavailable: timeout, transport error, 5xx, or an unexpected body.
        """
        params = {
            "query": expr,
            "start": f"{start.timestamp():.3f}",
            "end": f"{end.timestamp():.3f}",
            "step": f"{step_seconds:g}",
            "timeout": f"{self._timeout:g}s",
        }
        try:
            with httpx.Client(
                timeout=self._timeout, headers=self._headers, verify=self._verify, transport=self._transport
            ) as client:
                response = client.get(f"{self._url}/api/v1/query_range", params=params)
        except httpx.HTTPError as exc:
            raise SourceUnavailable(self._redacted(f"{exc.__class__.__name__}: {exc}")) from exc
        try:
            body = response.json()
        except ValueError as exc:
            raise SourceUnavailable(
                self._redacted(f"HTTP {response.status_code}, not JSON: {response.text[:200]!r}")
            ) from exc
        if not isinstance(body, dict) or body.get("status") != "success":
            error_type = body.get("errorType") if isinstance(body, dict) else None
            error = body.get("error") if isinstance(body, dict) else None
            message = self._redacted(f"HTTP {response.status_code}: {error_type}: {error} ({expr})")
            if error_type == "bad_data":
                raise QueryError(message)
            raise SourceUnavailable(message)
        return _parse_matrix(body.get("data", {}))

    def _redacted(self, what: str) -> str:
        """``Prometheus <url>: what`` with the URL's credentials gone, wherever they appear."""
        return redact_text(f"Prometheus {redact_url(self._url)}: {what}", urls=[self._url])


def _parse_matrix(data: object) -> list[RangeSeries]:
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        raise SourceUnavailable(f"Prometheus answered {data!r:.200}, not a matrix")
    out: list[RangeSeries] = []
    for item in data.get("result", []):
        points: list[tuple[float, float]] = []
        for ts, raw in item.get("values", []):
            value = float(raw)
            if math.isfinite(value):
                points.append((float(ts), value))
        out.append(RangeSeries(labels=dict(item.get("metric", {})), points=points))
    return out
