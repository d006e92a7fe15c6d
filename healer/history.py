"""Incident and node history: the read queries behind ``healer incident list|show`` and
``healer node show``, shared with the dashboard's JSON API (``api.queries`` lists incidents through
:func:`incident_query`), so the CLI and ``/api/v1/incidents`` filter alike.

Lives beside :mod:`healer.operations` (what an operator does) rather than in ``api``: the CLI may
not import the dashboard. All functions take the caller's session; times are aware UTC. The records
hold store rows (:mod:`healer.store.models`), read while the session is open, and ticket views
(:mod:`healer.tickets.views`: delivery errors redacted).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Select, exists, or_, select
from sqlalchemy.orm import Session

from healer.engine.lifecycle import finding_story
from healer.engine.outcomes import Outcome
from healer.model.states import FindingState
from healer.store.evaluations import finding_from_row
from healer.store.models import Action, DomainIncident, Finding, Gpu, Incident, Node, Ticket, Transition
from healer.tickets.views import TicketView, ticket_views

IncidentState = Literal["open", "closed"]

#: How many of each history :func:`node_record` reads by default.
NODE_ROWS = 10


@dataclass(frozen=True)
class IncidentFilter:
    """Which incidents to list; every field given narrows the list (None: no condition).

    ``rule``: the rule healer follows for it, or one of its findings' rules; ``pool``: its node's
    pool; ``state``: ``open`` (not closed yet) or ``closed``; ``since``/``until``: open at some time
    in that window (opened at or before ``until``, and still open or closed at or after ``since``);
    ``node``: its node's name; ``search``: a case-insensitive substring of its rule, node name or
    summary (its headline); ``outcome``: whether its decision was right (``confirmed`` or
    ``not_confirmed``: :mod:`healer.engine.outcomes`), else how it closed (its ``close_reason``,
    e.g. ``returned to service``).
    """

    rule: str | None = None
    pool: str | None = None
    state: IncidentState | None = None
    since: datetime | None = None
    until: datetime | None = None
    node: str | None = None
    search: str | None = None
    outcome: str | None = None


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def incident_query(flt: IncidentFilter) -> Select[Incident]:
    """The incidents ``flt`` keeps, joined to their node (unordered: the caller orders and pages)."""
    query = select(Incident).join(Node, Node.id == Incident.node_id)
    if flt.node:
        query = query.where(Node.name == flt.node)
    if flt.pool:
        query = query.where(Node.pool == flt.pool)
    if flt.state == "open":
        query = query.where(Incident.closed_at.is_(None))
    elif flt.state == "closed":
        query = query.where(Incident.closed_at.is_not(None))
    if flt.since is not None:
        query = query.where(or_(Incident.closed_at.is_(None), Incident.closed_at >= flt.since))
    if flt.until is not None:
        query = query.where(Incident.opened_at <= flt.until)
    if flt.outcome in set(Outcome):
        query = query.where(Incident.outcome == flt.outcome)
    elif flt.outcome:
        query = query.where(Incident.close_reason == flt.outcome)
    if flt.rule:
        found = exists().where(Finding.incident_id == Incident.id, Finding.rule == flt.rule)
        query = query.where(or_(Incident.rule == flt.rule, found))
    if flt.search:
        pattern = _like(flt.search)
        query = query.where(
            or_(
                Incident.rule.ilike(pattern, escape="\\"),
                Node.name.ilike(pattern, escape="\\"),
                Incident.summary.ilike(pattern, escape="\\"),
            )
        )
    return query


@dataclass(frozen=True)
class IncidentRow:
    """One incident as listed: its node and pool, the rule healer follows for it (None before the
    controller chose one) and its findings' rules, when it opened and closed, its summary
    (told by its latest finding, :func:`latest_finding`; ``first_summary``: the words it opened
    with)."""

    id: int
    node: str
    pool: str
    rule: str | None
    rules: list[str]
    opened_at: datetime
    closed_at: datetime | None
    summary: str
    close_reason: str | None
    escalated: bool
    blocked_reason: str | None
    first_summary: str = ""
    #: The domain incident (:mod:`healer.engine.correlation`) this node's incident is part of:
    #: ``{"id", "kind", "name", "open"}`` (a rack, switch or NVLink domain), or None.
    domain: dict[str, Any] | None = None

    @property
    def state(self) -> IncidentState:
        """``open`` until it is closed."""
        return "open" if self.closed_at is None else "closed"

    @property
    def shown_rule(self) -> str | None:
        """The rule to show: healer's, else its findings' (comma-separated); None without either."""
        return self.rule or (", ".join(self.rules) or None)


#: Findings still pending or firing.
ACTIVE_FINDINGS = (FindingState.PENDING, FindingState.FIRING)


def latest_finding(findings: Iterable[Finding], rule: str | None) -> Finding | None:
    """The finding an incident is told by (its headline follows the latest evidence, not the
    value it opened with): its rule's (the one healer follows) first, then one still pending or
    firing, then the latest seen; None without findings."""

    def key(f: Finding) -> tuple[bool, bool, datetime, int]:
        return (f.rule == rule, f.state in ACTIVE_FINDINGS, f.last_seen_at, f.id)

    return max(findings, key=key, default=None)


def incident_rows(session: Session, incidents: Sequence[Incident]) -> list[IncidentRow]:
    """``incidents`` as rows, in their order: two queries (node names and pools, their findings),
    and a third for their domain incidents when some have one."""
    if not incidents:
        return []
    node_ids = {i.node_id for i in incidents}
    nodes = {
        node_id: (name, pool)
        for node_id, name, pool in session.execute(
            select(Node.id, Node.name, Node.pool).where(Node.id.in_(node_ids))
        )
    }
    found: dict[int, list[Finding]] = defaultdict(list)
    for f in session.scalars(select(Finding).where(Finding.incident_id.in_([i.id for i in incidents]))):
        if f.incident_id is not None:
            found[f.incident_id].append(f)

    domains: dict[int, dict[str, Any]] = {}
    if domain_ids := {i.domain_incident_id for i in incidents if i.domain_incident_id is not None}:
        for d in session.scalars(select(DomainIncident).where(DomainIncident.id.in_(domain_ids))):
            domains[d.id] = {"id": d.id, "kind": d.kind, "name": d.name, "open": d.closed_at is None}

    def summary(i: Incident) -> str:
        latest = latest_finding(found.get(i.id, ()), i.rule)
        return finding_story(finding_from_row(latest), None) if latest is not None else i.summary

    return [
        IncidentRow(
            id=i.id,
            node=nodes.get(i.node_id, ("", ""))[0],
            pool=nodes.get(i.node_id, ("", ""))[1],
            rule=i.rule,
            rules=sorted({f.rule for f in found.get(i.id, ())}),
            opened_at=i.opened_at,
            closed_at=i.closed_at,
            summary=summary(i),
            first_summary=i.summary,
            close_reason=i.close_reason,
            escalated=i.escalated,
            blocked_reason=i.blocked_reason,
            domain=domains.get(i.domain_incident_id or 0),
        )
        for i in incidents
    ]


def find_incidents(session: Session, flt: IncidentFilter, *, limit: int = 50) -> list[IncidentRow]:
    """The incidents ``flt`` keeps, newest opened first, at most ``limit``."""
    query = incident_query(flt).order_by(Incident.opened_at.desc(), Incident.id.desc()).limit(limit)
    return incident_rows(session, list(session.scalars(query)))


@dataclass(frozen=True)
class IncidentRecord:
    """One incident with everything attached to it, oldest first (its story in order): findings
    (by when they became active), healer's and operators' actions, tickets, the node's transitions."""

    incident: IncidentRow
    findings: list[Finding]
    actions: list[Action]
    tickets: list[TicketView]
    transitions: list[Transition]


def incident_record(session: Session, incident_id: int) -> IncidentRecord | None:
    """Incident ``incident_id`` with its findings, actions, tickets and transitions; None when there
    is no such incident."""
    incident = session.get(Incident, incident_id)
    if incident is None:
        return None
    (row,) = incident_rows(session, [incident])
    tickets = list(
        session.scalars(
            select(Ticket).where(Ticket.incident_id == incident.id).order_by(Ticket.created_at, Ticket.id)
        )
    )
    return IncidentRecord(
        incident=row,
        findings=list(
            session.scalars(
                select(Finding)
                .where(Finding.incident_id == incident.id)
                .order_by(Finding.active_since, Finding.id)
            )
        ),
        actions=list(
            session.scalars(
                select(Action).where(Action.incident_id == incident.id).order_by(Action.created_at, Action.id)
            )
        ),
        tickets=ticket_views(session, tickets, node_names={incident.node_id: row.node}),
        transitions=list(
            session.scalars(
                select(Transition)
                .where(Transition.incident_id == incident.id)
                .order_by(Transition.at, Transition.id)
            )
        ),
    )


@dataclass(frozen=True)
class NodeRecord:
    """One node as ``healer node show`` prints it: the node, its GPUs, its open incident, its recent
    incidents, tickets and transitions (newest first), and its active findings (pending or firing)."""

    node: Node
    gpus: list[Gpu]
    open_incident: IncidentRow | None
    incidents: list[IncidentRow]
    tickets: list[TicketView]
    transitions: list[Transition]
    findings: list[Finding]


def node_record(session: Session, name: str, *, rows: int = NODE_ROWS) -> NodeRecord | None:
    """Node ``name`` with the latest ``rows`` of each history; None when healer does not know it."""
    node = session.scalar(select(Node).where(Node.name == name))
    if node is None:
        return None
    latest = list(
        session.scalars(
            incident_query(IncidentFilter(node=name))
            .order_by(Incident.opened_at.desc(), Incident.id.desc())
            .limit(rows)
        )
    )
    open_one = session.scalar(incident_query(IncidentFilter(node=name, state="open")))
    if open_one is not None and open_one not in latest:
        latest.append(open_one)  # older than the latest rows (a long incident): still shown
    incidents = incident_rows(session, latest)
    tickets = list(
        session.scalars(
            select(Ticket)
            .where(Ticket.node_id == node.id)
            .order_by(Ticket.created_at.desc(), Ticket.id.desc())
            .limit(rows)
        )
    )
    return NodeRecord(
        node=node,
        gpus=list(node.gpus),
        open_incident=next((i for i in incidents if i.closed_at is None), None),
        incidents=incidents[:rows],
        tickets=ticket_views(session, tickets, node_names={node.id: node.name}),
        transitions=list(
            session.scalars(
                select(Transition)
                .where(Transition.node_id == node.id)
                .order_by(Transition.at.desc(), Transition.id.desc())
                .limit(rows)
            )
        ),
        findings=list(
            session.scalars(
                select(Finding)
                .where(
                    Finding.node_name == node.name,
                    Finding.state.in_([str(FindingState.PENDING), str(FindingState.FIRING)]),
                )
                .order_by(Finding.active_since.desc(), Finding.id.desc())
            )
        ),
    )
