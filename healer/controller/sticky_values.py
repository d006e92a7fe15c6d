"""Sticky gauges in the database: the values a node's sticky series had at repair, read and kept.

The logic is :mod:`healer.engine.sticky`; this module stores its baseline on the node row
(``nodes.sticky_values``: ``{"incident": id, "values": {series key: value}}``). The baseline is
taken when a node is first seen in ``validating`` for an incident, from the values the provider was
asked to repair (the ticket's findings) and, for series not on a ticket, the incident's recorded
findings; it outlives the incident, so the old value does not re-open the node once it is back in
service.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from healer.engine import sticky
from healer.model.findings import Finding, TickFindings
from healer.model.states import NodeState
from healer.ruleset.schema import RuleSet
from healer.store.models import Finding as FindingRow
from healer.store.models import Incident, Node, Ticket


def _repair_values(session: Session, incident: Incident, sticky_rules: frozenset[str]) -> dict[str, float]:
    values: dict[str, float] = {}
    rows = session.execute(
        select(FindingRow.rule, FindingRow.series_key, FindingRow.value).where(
            FindingRow.incident_id == incident.id
        )
    )
    for rule, key, value in rows:
        if rule in sticky_rules and value is not None:
            values[key] = float(value)
    for findings in session.scalars(select(Ticket.findings).where(Ticket.incident_id == incident.id)):
        for f in findings or []:
            value = f.get("value")
            if f.get("rule") in sticky_rules and isinstance(value, int | float) and f.get("series_key"):
                values[str(f["series_key"])] = float(value)  # what the provider was asked to fix
    return values


def current(
    session: Session,
    node: Node,
    incident: Incident | None,
    findings: TickFindings,
    sticky_rules: frozenset[str],
) -> tuple[tuple[Finding, ...], tuple[Finding, ...]]:
    """The node's (firing, pending) findings this tick with old sticky values discounted; takes the
    baseline on the node's first validating tick of an incident and prunes it (row updated)."""
    firing = tuple(findings.firing.get(node.name, ()))
    pending = tuple(findings.pending.get(node.name, ()))
    if not sticky_rules:
        return firing, pending
    stored: dict[str, Any] = dict(node.sticky_values or {})
    values: Mapping[str, float] = stored.get("values") or {}
    if node.state == NodeState.VALIDATING and incident is not None and stored.get("incident") != incident.id:
        values = {**values, **_repair_values(session, incident, sticky_rules)}
        stored["incident"] = incident.id
    kept = sticky.prune(
        values, (*firing, *pending), frozen_rules=findings.frozen_rules, unknown=node.name in findings.unknown
    )
    after = {"incident": stored.get("incident"), "values": kept} if kept or stored.get("incident") else None
    if after != (node.sticky_values or None):
        node.sticky_values = after
    return sticky.discount(firing, kept, sticky_rules), sticky.discount(pending, kept, sticky_rules)


def baselines(session: Session, findings: TickFindings) -> dict[str, dict[str, float]]:
    """node → its remembered sticky values, pruned by this tick (a series no longer firing is
    forgotten, also on nodes the tick does not reconcile); for discounting the whole tick."""
    out: dict[str, dict[str, float]] = {}
    for node in session.scalars(select(Node).where(Node.sticky_values.is_not(None))):
        stored: dict[str, Any] = dict(node.sticky_values or {})
        found = (*findings.firing.get(node.name, ()), *findings.pending.get(node.name, ()))
        kept = sticky.prune(
            stored.get("values") or {},
            found,
            frozen_rules=findings.frozen_rules,
            unknown=node.name in findings.unknown,
        )
        if kept != (stored.get("values") or {}):
            node.sticky_values = {**stored, "values": kept}
        out[node.name] = kept
    return out


def sticky_rule_names(rules: RuleSet) -> frozenset[str]:
    """Names of the rules marked ``sticky`` in a rule set."""
    return frozenset(r.name for r in rules.rules if r.sticky)
