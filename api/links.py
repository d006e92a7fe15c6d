"""Links from a node page to where a person goes next: the same query in Prometheus's graph page
(and Grafana Explore when configured), and the ``kubectl`` commands a human would run. Pure.

URL formats: Prometheus's ``/graph?g0.expr=..&g0.range_input=..&g0.end_input=..&g0.tab=0`` (the
classic and the new UI both read it); Grafana's ``/explore?left=<JSON>`` with ``datasource``,
``queries[].expr`` and ``range.from``/``range.to`` in epoch milliseconds.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlencode, urlsplit

from healer.config import Settings


@dataclass(frozen=True)
class QueryLinks:
    """Where the same query opens: ``prometheus`` and ``grafana`` URLs (None when not configured)."""

    prometheus: str | None
    grafana: str | None


def prometheus_ui(settings: Settings) -> str | None:
    """The Prometheus UI base for links: ``api.prometheus_link_url``, else ``prometheus.url`` when
    it carries no user, password or query string (a link must not leak them); None otherwise."""
    if settings.api.prometheus_link_url:
        return settings.api.prometheus_link_url.rstrip("/")
    parts = urlsplit(settings.prometheus.url)
    if parts.username or parts.password or parts.query:
        return None
    return settings.prometheus.url.rstrip("/")


def query_links(settings: Settings, expr: str, *, start: datetime, end: datetime) -> QueryLinks:
    """Links to ``expr`` over ``[start, end]`` in Prometheus and Grafana."""
    base = prometheus_ui(settings)
    minutes = max(1, math.ceil((end - start).total_seconds() / 60))
    prometheus = (
        f"{base}/graph?"
        + urlencode(
            {
                "g0.expr": expr,
                "g0.tab": "0",
                "g0.range_input": f"{minutes}m",
                "g0.end_input": end.strftime("%Y-%m-%d %H:%M:%S"),
            }
        )
        if base
        else None
    )
    grafana = None
    if settings.api.grafana_url:
        left = {
            "datasource": settings.api.grafana_datasource or "",
            "queries": [{"refId": "A", "expr": expr}],
            "range": {"from": str(int(start.timestamp() * 1000)), "to": str(int(end.timestamp() * 1000))},
        }
        grafana = f"{settings.api.grafana_url.rstrip('/')}/explore?" + urlencode(
            {"left": json.dumps(left, separators=(",", ":"))}
        )
    return QueryLinks(prometheus=prometheus, grafana=grafana)


def kubectl_commands(node: str) -> list[str]:
    """What a person would run to see the node from Kubernetes: its conditions, taints and events,
    and the pods still on it."""
    name = shlex.quote(node)
    return [
        f"kubectl describe node {name}",
        f"kubectl get pods --all-namespaces --field-selector spec.nodeName={name} -o wide",
        f"kubectl get events --all-namespaces --field-selector involvedObject.name={name}",
    ]
