"""The topology page (racks, switches, NVLink domains as a grid coloured by health) and the domain
incident page (its member nodes and evidence). Read from the record only: the ``topology`` switch
the leader writes when the topology changes, the nodes' states, ``domain_incidents`` and their
tickets, so any replica serves them (docs/topology.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from healer.model.states import OUT_OF_SERVICE
from healer.store.models import DomainIncident, Incident, Node, Ticket
from healer.store.models import Finding as FindingRow
from healer.store.nodes import SWITCH_TOPOLOGY, get_switch

#: Open domain incidents and recently closed ones the topology page lists.
RECENT_DOMAIN_INCIDENTS = 20


def _health(state: str | None) -> str:
    """A node's colour on the grid: ``ok``, ``warn`` (suspect, validating, unknown) or ``bad``."""
    if state in (None, "healthy"):
        return "ok"
    if state in OUT_OF_SERVICE or state == "blocked":
        return "bad"
    return "warn"


@dataclass(frozen=True)
class DomainCell:
    """One domain on the grid: its nodes (name, state, colour), how many are out, and the open
    domain incident on it (None: none)."""

    kind: str
    name: str
    nodes: list[dict[str, str]]
    bad: int
    incident: int | None

    @property
    def health(self) -> str:
        if self.incident is not None:
            return "bad"
        return "warn" if self.bad else "ok"


@dataclass(frozen=True)
class TopologyPage:
    """What ``topology.html`` shows: kind → its domains, and the domain incidents (open first)."""

    kinds: dict[str, list[DomainCell]] = field(default_factory=dict)
    incidents: list[DomainIncident] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "kinds": {
                kind: [
                    {
                        "name": c.name,
                        "health": c.health,
                        "bad": c.bad,
                        "incident": c.incident,
                        "nodes": c.nodes,
                    }
                    for c in cells
                ]
                for kind, cells in self.kinds.items()
            },
            "incidents": [incident_json(i) for i in self.incidents],
        }


def incident_json(row: DomainIncident) -> dict[str, Any]:
    """A domain incident, JSON-safe."""
    return {
        "id": row.id,
        "kind": row.kind,
        "name": row.name,
        "size": row.size,
        "summary": row.summary,
        "first_seen": row.first_seen.isoformat(),
        "opened_at": row.opened_at.isoformat(),
        "closed_at": row.closed_at.isoformat() if row.closed_at else None,
        "close_reason": row.close_reason,
        "members": list(row.members),
        "evidence": row.evidence,
    }


def topology_page(session: Session) -> TopologyPage:
    """The grid from the ``topology`` switch and the nodes' states now."""
    domains: dict[str, dict[str, list[str]]] = get_switch(session, SWITCH_TOPOLOGY).get("domains") or {}
    states = dict(session.execute(select(Node.name, Node.state)).all())
    incidents = list(
        session.scalars(
            select(DomainIncident)
            .order_by(DomainIncident.closed_at.is_not(None), DomainIncident.id.desc())
            .limit(RECENT_DOMAIN_INCIDENTS)
        )
    )
    open_on = {(i.kind, i.name): i.id for i in incidents if i.closed_at is None}
    kinds: dict[str, list[DomainCell]] = {}
    for kind, by_name in sorted(domains.items()):
        for name, nodes in sorted(by_name.items()):
            shown = [
                {"name": n, "state": states.get(n, "healthy"), "health": _health(states.get(n))}
                for n in nodes
            ]
            bad = sum(1 for n in shown if n["health"] == "bad")
            kinds.setdefault(kind, []).append(DomainCell(kind, name, shown, bad, open_on.get((kind, name))))
    return TopologyPage(kinds, incidents)


@dataclass(frozen=True)
class DomainIncidentPage:
    """What ``domain.html`` shows: the incident, its members (state, the node's incident, its
    findings) and its tickets."""

    incident: DomainIncident
    members: list[dict[str, Any]]
    tickets: list[Ticket]

    def as_json(self) -> dict[str, Any]:
        return {
            **incident_json(self.incident),
            "members": self.members,
            "tickets": [
                {
                    "id": t.id,
                    "provider": t.provider,
                    "status": t.status,
                    "external_id": t.external_id,
                    "created_at": t.created_at.isoformat(),
                    "resolved_at": t.resolved_at.isoformat() if t.resolved_at else None,
                }
                for t in self.tickets
            ],
        }


def domain_incident_page(session: Session, incident_id: int) -> DomainIncidentPage | None:
    """The domain incident ``incident_id`` (None: no such incident)."""
    row = session.get(DomainIncident, incident_id)
    if row is None:
        return None
    names = [str(m["node"]) for m in row.members]
    states = dict(session.execute(select(Node.name, Node.state).where(Node.name.in_(names))).all())
    linked = {
        name: incident_id
        for name, incident_id in session.execute(
            select(Node.name, Incident.id)
            .join(Incident, Incident.node_id == Node.id)
            .where(Incident.domain_incident_id == row.id)
        )
    }
    findings: dict[str, list[dict[str, Any]]] = {}
    if linked:
        for f in session.scalars(select(FindingRow).where(FindingRow.incident_id.in_(linked.values()))):
            findings.setdefault(f.node_name, []).append(
                {
                    "rule": f.rule,
                    "gpu": f.gpu,
                    "state": f.state,
                    "value": f.value,
                    "unit": f.unit,
                    "summary": f.summary,
                    "since": _iso(f.active_since),
                }
            )
    members = [
        {
            "node": str(m["node"]),
            "joined_at": m.get("joined_at"),
            "state": states.get(str(m["node"]), "healthy"),
            "incident": linked.get(str(m["node"])),
            "findings": findings.get(str(m["node"]), []),
        }
        for m in row.members
    ]
    tickets = list(session.scalars(select(Ticket).where(Ticket.domain_incident_id == row.id)))
    return DomainIncidentPage(row, members, tickets)


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at else None


def domain_of(session: Session, incident_id: int) -> DomainIncident | None:
    """The domain incident the node incident ``incident_id`` is part of (None: its own fault)."""
    domain_id = session.scalar(select(Incident.domain_incident_id).where(Incident.id == incident_id))
    return session.get(DomainIncident, domain_id) if domain_id is not None else None
