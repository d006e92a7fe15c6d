"""The Prometheus source: one instant query (``/api/v1/query``) per rule per tick.

Built on prometheus-api-client's :class:`PrometheusConnect` (the project's choice) for its session,
TLS, headers and auth, but the query itself goes through that session directly, because
``custom_query`` (0.7.2) drops ``warnings`` and ``resultType``, has no timeout unless given,
retries GETs three times and reports errors as JSON inside a string. Here:

- every request has a connect and a read timeout: ``min(timeout_seconds, deadline left)``; the
  body is read in chunks and abandoned when the query's budget or the tick's deadline runs out;
- no hidden retries (the session's adapter is mounted with ``Retry(total=0)``): a tick that
  cannot query a rule reports it unavailable, and the next tick tries again;
- the query is evaluated at the tick's time (``time=``) and Prometheus is told the budget
  (``timeout=``) so it cancels work nobody waits for.

Errors (see :mod:`healer.errors`)::

    SourceError
    ├── QueryError         errorType bad_data (400) or execution (422): the rule is broken
    └── SourceUnavailable  timeout, deadline passed, 5xx, transport error, non-JSON or odd body

An empty ``result`` is a success with no samples, never an error.

Engines that serve this API (checked against each in tests): Prometheus; VictoriaMetrics, whose
errors carry the HTTP status as ``errorType`` (``"422"`` for a PromQL it cannot parse or run, where
Prometheus writes ``bad_data``/``execution``, but also for a query past its
``-search.maxQueryDuration``, which is unavailability), whose answers may carry ``stats`` (ignored) and, in
its cluster version, ``isPartial: true`` when a storage node did not answer (kept as a warning: a
node missing from a partial answer is not known healthy); Thanos and Mimir answer like Prometheus
(partial answers as ``warnings``).
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from typing import Any

import requests
import urllib3
from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from healer.config import PrometheusSettings
from healer.engine.evaluation import QueryResult, Sample
from healer.errors import QueryError, SourceUnavailable
from healer.redaction import redact_text, redact_url
from healer.sources.base import Deadline

__all__ = ["PrometheusSource", "QueryResult", "Sample"]

#: errorType values that mean the expression is at fault, not the server (no point retrying).
_RULE_ERRORS = frozenset({"bad_data", "execution"})
#: VictoriaMetrics writes the HTTP status as errorType; these statuses blame the expression
#: (Prometheus's API: 400 bad_data, 422 execution).
_RULE_STATUSES = frozenset({"400", "422"})
_PARTIAL = "partial answer (isPartial): some storage nodes did not answer; series may be missing"
_CHUNK = 256 * 1024
#: How much of an unexpected body goes into an error message.
_EXCERPT = 200


class PrometheusSource:
    """Instant queries against one Prometheus (or Thanos/Mimir) base URL.

    Args:
        url: base URL, e.g. ``http://prometheus:9090`` (credentials in it are redacted in errors).
        timeout_seconds: connect and read timeout of one query, and its whole budget, seconds.
        tick_deadline_seconds: all queries of one tick must finish within this, seconds (the
            caller makes the :class:`Deadline`).
        verify_tls: check the server's certificate.
        headers: extra HTTP headers (e.g. a tenant header).

    ``queries_sent`` counts the HTTP queries sent (the benchmark checks one per rule per tick).
    :meth:`query` may be called from several threads at once (the tick's query pool): the
    connection pool keeps up to 10 connections (requests' default), more than the tick uses.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_seconds: float = 10.0,
        tick_deadline_seconds: float = 30.0,
        verify_tls: bool = True,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self.tick_deadline_seconds = tick_deadline_seconds
        self.queries_sent = 0
        self._count_lock = threading.Lock()
        # Retries would hide a failing source inside one tick and blow its deadline.
        no_retry = Retry(total=0, connect=0, read=0, redirect=0, status=0, other=0, raise_on_status=False)
        self._prom = PrometheusConnect(
            url=self.url,
            headers=dict(headers or {}),
            disable_ssl=not verify_tls,
            retry=no_retry,
            timeout=timeout_seconds,  # a float works (requests' timeout)
        )
        self._session: requests.Session = self._prom._session
        self._endpoint = f"{self.url}/api/v1/query"
        self._where = redact_url(self.url)

    @classmethod
    def from_settings(cls, settings: PrometheusSettings) -> PrometheusSource:
        return cls(
            settings.url,
            timeout_seconds=settings.timeout_seconds,
            tick_deadline_seconds=settings.tick_deadline_seconds,
            verify_tls=settings.verify_tls,
            headers=settings.headers,
        )

    def close(self) -> None:
        """Release the connection pool."""
        self._prom.close()

    def __enter__(self) -> PrometheusSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def query(self, expr: str, *, at: datetime, deadline: Deadline | None = None) -> QueryResult:
        """Evaluate ``expr`` at ``at`` (aware datetime) with one HTTP request, no retry.

        Returns:
            the samples (labels as returned, value as float: ``NaN``, ``+Inf``, ``-Inf`` parsed)
            and the response's ``warnings``. A scalar result becomes one sample with no labels.

        Raises:
            QueryError: ``bad_data`` / ``execution``: the expression is wrong; message has the
                PromQL and Prometheus's error.
            SourceUnavailable: the deadline had passed, connect/read timeout, the query budget
                ran out while reading, transport error, HTTP 5xx or any non-JSON or malformed
                body (e.g. the plain-text 503 of a server that is not ready).
        """
        budget = self.timeout_seconds
        if deadline is not None:
            budget = min(budget, deadline.remaining())
            if budget <= 0:
                raise SourceUnavailable(f"{self._where}: tick deadline passed before querying {_short(expr)}")
        params = {
            "query": expr,
            "time": f"{at.timestamp():.3f}",
            "timeout": f"{max(int(budget * 1000), 1)}ms",
        }
        status, body = self._get(self._endpoint, params, budget, what=_short(expr))
        return self._parse(expr, status, body)

    def _get(self, endpoint: str, params: dict[str, str], budget: float, *, what: str) -> tuple[int, bytes]:
        """One GET of ``endpoint`` within ``budget`` seconds, no retry: (HTTP status, body).

        Raises:
            SourceUnavailable: connect/read timeout, the budget ran out while reading, transport
                error (``what`` names the request in the message).
        """
        end = time.monotonic() + budget
        with self._count_lock:
            self.queries_sent += 1
        try:
            response = self._session.get(
                endpoint,
                params=params,
                headers=self._prom.headers,
                auth=self._prom.auth,
                verify=self._session.verify,
                timeout=(budget, budget),
                stream=True,
            )
            try:
                body = _read(response, end)
            finally:
                response.close()
        except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
            reason = _reason(exc)
            # NewConnectionError (refused) subclasses ConnectTimeoutError in urllib3 2.x.
            timed_out = isinstance(reason, requests.Timeout | urllib3.exceptions.TimeoutError)
            if timed_out and not isinstance(reason, urllib3.exceptions.NewConnectionError):
                raise SourceUnavailable(
                    f"{self._where}: query timed out after {budget:.3g}s: {what}"
                ) from exc
            raise SourceUnavailable(
                f"{self._where}: {type(reason).__name__}: {redact_text(str(reason), urls=[self.url])}"
            ) from exc
        if body is None:
            raise SourceUnavailable(
                f"{self._where}: query budget of {budget:.3g}s ran out while reading: {what}"
            )
        return response.status_code, body

    def _parse(self, expr: str, status: int, body: bytes) -> QueryResult:
        try:
            doc = json.loads(body)
        except ValueError:
            raise SourceUnavailable(
                f"{self._where}: HTTP {status}, answer is not JSON: {_excerpt(body)!r}"
            ) from None
        if not isinstance(doc, dict) or doc.get("status") not in ("success", "error"):
            raise SourceUnavailable(
                f"{self._where}: HTTP {status}, not a Prometheus API answer: {_excerpt(body)!r}"
            )
        warnings = [str(w) for w in doc.get("warnings") or []]
        if doc.get("isPartial") is True:
            warnings.append(_PARTIAL)
        if doc["status"] == "error" or status != 200:
            error_type = str(doc.get("errorType") or "")
            message = f"{self._where}: HTTP {status} {error_type}: {doc.get('error')}"
            if error_type in _RULE_ERRORS or _vm_rule_error(error_type, status, str(doc.get("error"))):
                # The rule is broken: the whole PromQL is what its author needs.
                raise QueryError(f"{message} (query: {' '.join(expr.split())})")
            raise SourceUnavailable(f"{message} (query: {_short(expr)})")
        try:
            return QueryResult(samples=_samples(doc["data"]), warnings=warnings)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise SourceUnavailable(
                f"{self._where}: malformed query data ({type(exc).__name__}: {exc}): {_excerpt(body)!r}"
            ) from exc


def _vm_rule_error(error_type: str, status: int, error: str) -> bool:
    """VictoriaMetrics's errorType is the HTTP status, and it answers 422 both to a PromQL it cannot
    run and to a query that waited past ``-search.maxQueryDuration`` (``timeout exceeded``): only
    the first is the rule's fault."""
    return error_type == str(status) and error_type in _RULE_STATUSES and "timeout" not in error.lower()


def _read(response: requests.Response, end: float) -> bytes | None:
    """The whole (decoded) body, or None when the monotonic ``end`` passes first (a trickling
    server). ``read1`` returns what has arrived, so the check runs between network reads."""
    raw = response.raw
    chunks: list[bytes] = []
    while True:
        chunk = raw.read1(_CHUNK, decode_content=True)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        if time.monotonic() > end:
            return None


def _samples(data: dict[str, Any]) -> list[Sample]:
    kind = data["resultType"]
    result = data["result"]
    if kind == "vector":
        return [Sample(labels=s["metric"], value=_value(s["value"][1])) for s in result]
    if kind == "scalar":
        return [Sample(labels={}, value=_value(result[1]))]
    raise ValueError(f"resultType {kind!r} is not an instant vector")


def _value(text: str) -> float:
    """Prometheus writes sample values as strings: ``"69.7"``, ``"NaN"``, ``"+Inf"``, ``"-Inf"``."""
    return float(text)


def _reason(exc: Exception) -> BaseException:
    """The transport error under requests' wrapping (``Max retries exceeded`` hides a timeout)."""
    inner = exc.args[0] if isinstance(exc, requests.RequestException) and exc.args else exc
    if isinstance(inner, urllib3.exceptions.MaxRetryError) and inner.reason is not None:
        return inner.reason
    return inner if isinstance(inner, BaseException) else exc


def _short(expr: str, limit: int = 80) -> str:
    """The PromQL on one line, cut to ``limit`` characters (for errors about the source)."""
    flat = " ".join(expr.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _excerpt(body: bytes) -> str:
    return body[:_EXCERPT].decode("utf-8", "replace")
