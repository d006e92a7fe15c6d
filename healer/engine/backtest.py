"""Backtest reports: a replay's events summed up per rule and node, and two rule sets compared. Pure.

A :class:`~healer.engine.replay.ReplayResult` becomes a :class:`Report`:

- per rule and node (:class:`NodeRow`): when the rule's findings fired, and when healer would have
  quarantined, started a drain, asked for a ticket, or been held by the budget or the breaker;
- per rule (:class:`RuleSummary`): findings fired, nodes that fired, nodes taken out of service,
  node-hours lost (hours out of service, from the quarantine to the return to service, or to the
  end of the window when the node was still out), holds by the budget and the breaker, and the
  series that named no node (``unresolved``: they act on nothing, as ``healer evaluate`` reports).

:func:`compare` sets two reports side by side (current vs proposed rule set): per rule the
difference in nodes out and node-hours, and the nodes only one of them takes out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from healer.engine.replay import EventKind, ReplayResult, UnresolvedTally

_NODE_FIELDS = {
    EventKind.FIRED: "fired",
    EventKind.QUARANTINE: "quarantined",
    EventKind.DRAIN: "drained",
    EventKind.TICKET: "ticketed",
    EventKind.HELD_BUDGET: "held_budget",
    EventKind.HELD_BREAKER: "held_breaker",
    EventKind.RETURNED: "returned",
}


@dataclass
class NodeRow:
    """One rule on one node: the times (aware UTC) of each kind of event, in order."""

    rule: str
    node: str
    fired: list[datetime] = field(default_factory=list)
    quarantined: list[datetime] = field(default_factory=list)
    drained: list[datetime] = field(default_factory=list)
    ticketed: list[datetime] = field(default_factory=list)
    held_budget: list[datetime] = field(default_factory=list)
    held_breaker: list[datetime] = field(default_factory=list)
    returned: list[datetime] = field(default_factory=list)
    hours_out: float = 0.0


@dataclass
class RuleSummary:
    """One rule over the window: counts, ``node_hours`` lost (hours), and ``unresolved``: its
    series that named no node (None: every series named one)."""

    rule: str
    fired: int = 0
    nodes_fired: int = 0
    nodes_out: int = 0
    node_hours: float = 0.0
    held_budget: int = 0
    held_breaker: int = 0
    unresolved: UnresolvedTally | None = None


@dataclass(frozen=True)
class Period:
    """A node out of service because of ``rule`` from ``start`` to ``end`` (the window's end when
    it was still out; ``open`` then)."""

    node: str
    rule: str | None
    start: datetime
    end: datetime
    open: bool


@dataclass(frozen=True)
class QueryFailure:
    """A rule whose query Prometheus failed for ``ticks`` ticks of the window (the rule was frozen
    for them, as in the controller); ``error`` is the first failure's message."""

    rule: str
    ticks: int
    error: str


@dataclass
class Report:
    """A backtest of one rule set over ``[start, end]`` every ``step_seconds``."""

    label: str
    start: datetime
    end: datetime
    step_seconds: float
    ticks: int
    nodes_seen: int
    rules: list[RuleSummary]
    nodes: list[NodeRow]
    periods: list[Period]
    breaker_trips: list[tuple[datetime, str]]
    #: Rules whose query failed for part (or all) of the window: the report undercounts them.
    failures: list[QueryFailure] = field(default_factory=list)
    #: Storms that would have become one domain incident (docs/topology.md): when, and what.
    domain_incidents: list[tuple[datetime, str]] = field(default_factory=list)

    def rule(self, name: str) -> RuleSummary | None:
        return next((r for r in self.rules if r.rule == name), None)

    @property
    def degraded(self) -> list[UnresolvedTally]:
        """The rules some of whose series named no node: the report undercounts them."""
        return [r.unresolved for r in self.rules if r.unresolved is not None]

    def steps(self) -> dict[tuple[str, str], list[str]]:
        """(node, rule) → the kinds of steps taken, in order (``quarantined``, ``drained`` ...)."""
        out: dict[tuple[str, str], list[str]] = {}
        for row in self.nodes:
            kinds = [
                k
                for k in ("quarantined", "drained", "ticketed", "held_budget", "held_breaker")
                if getattr(row, k)
            ]
            if kinds:
                out[(row.node, row.rule)] = kinds
        return out


def summarize(
    result: ReplayResult,
    *,
    rules: list[str],
    start: datetime,
    end: datetime,
    step_seconds: float,
    label: str = "rules",
) -> Report:
    """The report of ``result``; ``rules`` names every rule of the set (those that never fired too)."""
    rows: dict[tuple[str, str], NodeRow] = {}
    summaries = {name: RuleSummary(name) for name in rules}
    trips: list[tuple[datetime, str]] = []
    domains: list[tuple[datetime, str]] = []
    for event in result.events:
        if event.kind == EventKind.BREAKER_TRIP:
            trips.append((event.at, event.detail))
            continue
        if event.kind == EventKind.DOMAIN_INCIDENT:
            domains.append((event.at, event.detail))
            continue
        name = _NODE_FIELDS.get(event.kind)
        if name is None or event.rule is None:
            continue
        row = rows.setdefault((event.rule, event.node), NodeRow(event.rule, event.node))
        getattr(row, name).append(event.at)
        summary = summaries.setdefault(event.rule, RuleSummary(event.rule))
        if event.kind == EventKind.FIRED:
            summary.fired += 1
        elif event.kind == EventKind.HELD_BUDGET:
            summary.held_budget += 1
        elif event.kind == EventKind.HELD_BREAKER:
            summary.held_breaker += 1
    periods = [Period(p.node, p.rule, p.start, p.end or end, p.end is None) for p in result.out_periods]
    for p in periods:
        hours = max(0.0, (p.end - p.start).total_seconds() / 3600.0)
        key = (p.rule or "", p.node)
        if key in rows:
            rows[key].hours_out += hours
        if p.rule is not None:
            summaries.setdefault(p.rule, RuleSummary(p.rule)).node_hours += hours
    for tally in result.unresolved:
        summaries.setdefault(tally.rule, RuleSummary(tally.rule)).unresolved = tally
    for summary in summaries.values():
        summary.nodes_fired = len({n for (r, n), row in rows.items() if r == summary.rule and row.fired})
        summary.nodes_out = len({p.node for p in periods if p.rule == summary.rule})
    return Report(
        label=label,
        start=start,
        end=end,
        step_seconds=step_seconds,
        ticks=result.ticks,
        nodes_seen=result.nodes_seen,
        rules=[summaries[n] for n in sorted(summaries)],
        nodes=sorted(rows.values(), key=lambda r: (r.node, r.rule)),
        periods=sorted(periods, key=lambda p: (p.node, p.start)),
        breaker_trips=trips,
        domain_incidents=domains,
    )


@dataclass(frozen=True)
class RuleDelta:
    """One rule in both reports: ``a`` and ``b`` (None when the rule is not in that set)."""

    rule: str
    a: RuleSummary | None
    b: RuleSummary | None
    only_a: tuple[str, ...]  # nodes only the first set takes out
    only_b: tuple[str, ...]

    @property
    def nodes_out_delta(self) -> int:
        return (self.b.nodes_out if self.b else 0) - (self.a.nodes_out if self.a else 0)

    @property
    def node_hours_delta(self) -> float:
        return (self.b.node_hours if self.b else 0.0) - (self.a.node_hours if self.a else 0.0)


@dataclass(frozen=True)
class Comparison:
    """Two reports of the same window: ``a`` (current) and ``b`` (proposed)."""

    a: Report
    b: Report
    rules: list[RuleDelta]

    @property
    def changed(self) -> list[RuleDelta]:
        return [d for d in self.rules if d.only_a or d.only_b or abs(d.node_hours_delta) > 1e-9]


def compare(a: Report, b: Report) -> Comparison:
    """Per rule: the two summaries and the nodes one set takes out and the other does not."""
    names = sorted({r.rule for r in a.rules} | {r.rule for r in b.rules})
    out = []
    for name in names:
        na = {p.node for p in a.periods if p.rule == name}
        nb = {p.node for p in b.periods if p.rule == name}
        out.append(
            RuleDelta(name, a.rule(name), b.rule(name), tuple(sorted(na - nb)), tuple(sorted(nb - na)))
        )
    return Comparison(a, b, out)


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return round(value, 4)
    return value


def report_dict(report: Report) -> dict[str, Any]:
    """The report as JSON-ready data (times ISO 8601 UTC, hours rounded to 4 decimals)."""
    body = asdict(report)
    for rule, summary in zip(body["rules"], report.rules, strict=True):
        if (tally := summary.unresolved) is not None:
            # one level, as `healer evaluate -o json` has it (example_instance: the address to fix)
            first = tally.first
            rule["unresolved"] = {
                "ticks": tally.ticks,
                "series": tally.series,
                "node_labels": list(first.node_labels),
                "example": dict(first.example),
                "example_instance": first.example_instance,
                "why": first.why,
            }
    body["breaker_trips"] = [{"at": at, "reason": why} for at, why in report.breaker_trips]
    body["domain_incidents"] = [{"at": at, "domain": what} for at, what in report.domain_incidents]
    return dict(_plain(body))


def comparison_dict(comparison: Comparison) -> dict[str, Any]:
    """The comparison as JSON-ready data: both reports and the per-rule deltas."""
    return {
        "a": report_dict(comparison.a),
        "b": report_dict(comparison.b),
        "rules": [
            {
                "rule": d.rule,
                "nodes_out": [d.a.nodes_out if d.a else None, d.b.nodes_out if d.b else None],
                "node_hours": [
                    round(d.a.node_hours, 4) if d.a else None,
                    round(d.b.node_hours, 4) if d.b else None,
                ],
                "nodes_out_delta": d.nodes_out_delta,
                "node_hours_delta": round(d.node_hours_delta, 4),
                "only_a": list(d.only_a),
                "only_b": list(d.only_b),
            }
            for d in comparison.rules
        ],
    }
