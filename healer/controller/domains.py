"""Domain incidents in the tick (docs/topology.md): correlate before the nodes move, link and
ticket after.

* :func:`correlate` (before the reconcile, in its own transaction): the tick's findings and the
  topology through :func:`healer.engine.correlation.correlate`; a new domain fault opens a
  ``domain_incidents`` row, a node of an open one that turns bad joins it. Returns each absorbed
  node's :class:`~healer.engine.lifecycle.DomainFacts` for the lifecycle (which alone moves the
  nodes: taint, wait for the domain's repair, validate) and for safety (a domain counts once in
  the budget and the breaker).
* :func:`settle` (after the reconcile): the members' open incidents point at the domain incident;
  the domain's one ticket goes to its kind's provider (not while paused); a domain incident with
  no member incident open any more closes.

The drain pass reads the same facts back from the incidents' links (:func:`linked_facts`), so a
drained member waits for the domain's repair instead of asking for its own ticket.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from healer.config import TopologySettings
from healer.controller.fence import Fence
from healer.engine import correlation as engine
from healer.engine import lifecycle as lc
from healer.model.findings import Finding, TickFindings
from healer.model.node import TaintEffect
from healer.model.states import ActionStatus, TicketStatus
from healer.ruleset.schema import RuleSet
from healer.store import nodes as repo
from healer.store.models import DomainIncident, Incident, Node, Ticket

log = logging.getLogger(__name__)

#: Findings a domain's ticket lists at most (16 nodes x 8 GPUs is already 128).
TICKET_FINDINGS = 64


@dataclass
class Domains:
    """One tick's domain facts: node → the domain incident absorbing it, and the open rows' ids."""

    facts: dict[str, lc.DomainFacts] = field(default_factory=dict)
    opened: list[int] = field(default_factory=list)

    def keys(self) -> dict[str, str]:
        """node → ``domain-<id>`` (the budget's and the breaker's key: one domain counts once)."""
        return {node: f"domain-{f.id}" for node, f in self.facts.items()}


def _taint_effect(settings: TopologySettings, kind: str) -> TaintEffect:
    kinds = settings.kinds()
    return kinds[kind].taint_effect if kind in kinds else "NoSchedule"


def _ticket_status(session: Session, domain_id: int) -> TicketStatus | None:
    status = session.scalar(
        select(Ticket.status)
        .where(Ticket.domain_incident_id == domain_id)
        .order_by(Ticket.id.desc())
        .limit(1)
    )
    return TicketStatus(status) if status else None


def _facts(session: Session, row: DomainIncident, settings: TopologySettings) -> lc.DomainFacts:
    return lc.DomainFacts(
        id=row.id,
        kind=row.kind,
        name=row.name,
        ticket=_ticket_status(session, row.id),
        taint_effect=_taint_effect(settings, row.kind),
    )


def correlate(
    session: Session,
    *,
    findings: TickFindings,
    rules: RuleSet,
    topology: engine.Topology,
    settings: TopologySettings,
    now: datetime,
    actor: str,
    fence: Fence,
) -> Domains:
    """Open the new domain incidents and add the nodes that joined open ones (in ``session``);
    returns every absorbed node's facts. No topology and no open domain incident: nothing read."""
    rows = list(session.scalars(select(DomainIncident).where(DomainIncident.closed_at.is_(None))))
    if not topology and not rows:
        return Domains()
    from healer.topology import thresholds

    limits = thresholds(settings)
    result = engine.correlate(
        findings=engine.bad_findings(findings, rules),
        topology=topology,
        thresholds=limits,
        now=now,
        already_open=[
            engine.OpenDomain(
                engine.DomainKey(r.kind, r.name), frozenset(str(m["node"]) for m in r.members), r.first_seen
            )
            for r in rows
        ],
        kind_order=list(settings.kinds()),
    )
    by_key = {engine.DomainKey(r.kind, r.name): r for r in rows}
    out = Domains()
    for fault in result.faults:
        row = by_key.get(fault.key)
        if row is None:
            row = _open(session, fault, limits[fault.key.kind], now=now, actor=actor, fence=fence)
            out.opened.append(row.id)
            by_key[fault.key] = row
        else:
            known = {str(m["node"]) for m in row.members}
            joined = [n for n in fault.nodes if n not in known]
            if joined:
                fence.check_db(session)
                row.members = [*row.members, *({"node": n, "joined_at": now.isoformat()} for n in joined)]
                log.warning(
                    "%s %s: %s joined domain incident %d", row.kind, row.name, ", ".join(joined), row.id
                )
        facts = _facts(session, row, settings)
        for node in fault.nodes:
            out.facts[node] = facts
    return out


def _open(
    session: Session,
    fault: engine.DomainFault,
    threshold: engine.Threshold,
    *,
    now: datetime,
    actor: str,
    fence: Fence,
) -> DomainIncident:
    fence.check_db(session)
    summary = (
        f"{len(fault.nodes)} of {fault.size} node(s) of {fault.key.kind} {fault.key.name} turned bad "
        f"within {threshold.window_seconds:g} s (a domain fault from {threshold.needed(fault.size)})"
    )
    row = DomainIncident(
        kind=fault.key.kind,
        name=fault.key.name,
        size=fault.size,
        first_seen=fault.first_seen,
        opened_at=now,
        summary=summary,
        members=[{"node": n, "joined_at": now.isoformat()} for n in fault.nodes],
        evidence={
            "min_nodes": threshold.min_nodes,
            "min_percent": threshold.min_percent,
            "window_seconds": threshold.window_seconds,
            "needed": threshold.needed(fault.size),
            "rules": sorted(threshold.rules),
        },
    )
    session.add(row)
    session.flush()
    _audit(session, row, {"nodes": list(fault.nodes), "summary": summary}, actor=actor, now=now)
    log.warning("domain incident %d opened: %s", row.id, summary)
    return row


def _audit(
    session: Session, row: DomainIncident, detail: dict[str, object], *, actor: str, now: datetime
) -> None:
    """The audit row of a domain incident opened or closed (kind ``domain_incident``)."""
    repo.record_action(
        session,
        kind="domain_incident",
        status=ActionStatus.SUCCEEDED,
        actor=actor,
        now=now,
        target=f"{row.kind}/{row.name}",
        detail={"domain_incident_id": row.id, **detail},
    )


def settle(
    session: Session,
    *,
    domains: Domains,
    findings: TickFindings,
    settings: TopologySettings,
    now: datetime,
    actor: str,
    paused: bool,
    fence: Fence,
) -> None:
    """Link the members' open incidents, ask for each open domain's ticket, close the domains with
    no member incident open (see the module doc)."""
    rows = list(session.scalars(select(DomainIncident).where(DomainIncident.closed_at.is_(None))))
    for row in rows:
        names = sorted(str(m["node"]) for m in row.members)
        members = list(
            session.execute(
                select(Incident, Node)
                .join(Node, Node.id == Incident.node_id)
                .where(Node.name.in_(names), Incident.closed_at.is_(None))
                .order_by(Node.name)
            )
        )
        repaired = _ticket_status(session, row.id) == TicketStatus.RESOLVED
        for incident, node in members:
            # once the domain is repaired, a member's new incident is its own fault
            if incident.domain_incident_id is None and node.name in domains.facts and not repaired:
                fence.check_db(session)
                incident.domain_incident_id = row.id
        linked = [(i, n) for i, n in members if i.domain_incident_id == row.id]
        if not linked:
            status = _ticket_status(session, row.id)
            fence.check_db(session)
            row.closed_at = now
            row.close_reason = (
                "repaired: every member back in service"
                if status == TicketStatus.RESOLVED
                else "no member is out of service any more"
            )
            _audit(session, row, {"closed": row.close_reason}, actor=actor, now=now)
            log.info("domain incident %d closed: %s", row.id, row.close_reason)
            continue
        if paused or _ticket_status(session, row.id) is not None:
            continue
        kind = settings.kinds().get(row.kind)
        if kind is None:
            continue
        from healer.tickets.outbox import request_domain_ticket

        anchor, node = linked[0]
        evidence: list[Finding] = []
        for name in names:
            evidence += findings.firing.get(name, ()) or findings.pending.get(name, ())
        fence.check_db(session)
        request_domain_ticket(
            session,
            domain=row,
            anchor=anchor,
            node=node,
            provider=kind.provider,
            template=kind.template,
            findings=evidence[:TICKET_FINDINGS],
            now=now,
        )


def linked_facts(session: Session, names: list[str], settings: TopologySettings) -> dict[str, lc.DomainFacts]:
    """node → the open domain incident its open incident is linked to (the drain pass's facts)."""
    if not names:
        return {}
    rows = session.execute(
        select(Node.name, DomainIncident)
        .join(Incident, (Incident.node_id == Node.id) & Incident.closed_at.is_(None))
        .join(DomainIncident, DomainIncident.id == Incident.domain_incident_id)
        .where(Node.name.in_(names), DomainIncident.closed_at.is_(None))
    )
    return {name: _facts(session, row, settings) for name, row in rows}


def topology_of(
    labels: Mapping[str, Mapping[str, str]] | None,
    settings: TopologySettings,
    file_map: Mapping[str, Mapping[str, str]] | None = None,
) -> engine.Topology:
    """node → {kind: domain} (:func:`healer.topology.build`); empty when correlation is off."""
    if not settings.kinds() or labels is None:
        return {}
    from healer.topology import build

    return build(labels, settings, file_map=file_map)
