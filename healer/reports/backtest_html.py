"""The backtest report as one self-contained HTML page (jinja2, autoescaped): per rule the summary,
and per node a timeline of the window with the periods out of service and each step marked."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from healer.engine.backtest import Comparison, Report

_ENV = Environment(
    loader=PackageLoader("healer.reports", "templates"),
    autoescape=select_autoescape(["html", "j2"]),
    trim_blocks=True,
    lstrip_blocks=True,
)

_MARKS = (
    ("fired", "fired"),
    ("quarantined", "quarantine"),
    ("drained", "drain"),
    ("ticketed", "ticket"),
    ("held_budget", "held by budget"),
    ("held_breaker", "held by breaker"),
    ("returned", "returned"),
)


def _pct(report: Report, at: datetime) -> float:
    span = (report.end - report.start).total_seconds() or 1.0
    return max(0.0, min(100.0, 100.0 * (at - report.start).total_seconds() / span))


def _timelines(report: Report) -> list[dict[str, Any]]:
    nodes = sorted({r.node for r in report.nodes} | {p.node for p in report.periods})
    out = []
    for node in nodes:
        bars = [
            {
                "left": _pct(report, p.start),
                "width": max(0.3, _pct(report, p.end) - _pct(report, p.start)),
                "title": f"{p.rule}: out {p.start:%Y-%m-%d %H:%M} - {p.end:%Y-%m-%d %H:%M}"
                + (" (still out)" if p.open else ""),
            }
            for p in report.periods
            if p.node == node
        ]
        marks = [
            {"left": _pct(report, at), "kind": kind, "title": f"{row.rule}: {label} {at:%Y-%m-%d %H:%M:%S}"}
            for row in report.nodes
            if row.node == node
            for field, label in _MARKS
            for at in getattr(row, field)
            for kind in [field]
        ]
        out.append(
            {"node": node, "bars": bars, "marks": marks, "rows": [r for r in report.nodes if r.node == node]}
        )
    return out


def render(report: Report, comparison: Comparison | None = None) -> str:
    """The page for ``report`` (and, with ``comparison``, the second rule set's report and the deltas)."""
    reports = [report] if comparison is None else [comparison.a, comparison.b]
    return _ENV.get_template("backtest.html.j2").render(
        reports=[{"report": r, "timelines": _timelines(r)} for r in reports],
        comparison=comparison,
    )
