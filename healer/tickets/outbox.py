"""The transactional outbox: requesting a ticket writes rows, delivery happens later.

:func:`request_ticket` runs inside the caller's transaction (the tick that moved the node), so the
ticket exists if and only if the lifecycle step that asked for it was committed. It never does
I/O and never renders: the payload is rendered at delivery time (:mod:`healer.tickets.delivery`),
where settings (cluster name, templates, provider URL) are at hand, so a broken template fails the
delivery visibly instead of rolling back the tick.

Idempotency: one ticket per (incident, provider), found by its key ``incident-<id>-<provider>``
(unique in ``tickets``). On the wire the key carries the cluster name too
(``healer-<cluster>-incident-<id>-<provider>``, :func:`wire_key`) so two clusters reporting to
one provider never collide; it is fixed on the outbox row at the first attempt and sent unchanged
on every retry.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from healer.model.findings import Finding
from healer.model.states import ActionStatus, OutboxStatus, TicketStatus
from healer.store import nodes as repo
from healer.store.models import DomainIncident, Incident, Node, OutboxMessage, Ticket

log = logging.getLogger(__name__)

#: Actor recorded for tickets healer requests on its own.
ACTOR = "healer"


def ticket_key(incident_id: int, provider: str) -> str:
    """The ticket's key in the database: ``incident-<id>-<provider>``."""
    return f"incident-{incident_id}-{provider}"


def domain_ticket_key(domain_incident_id: int, provider: str) -> str:
    """A domain ticket's key in the database: ``domain-<id>-<provider>``."""
    return f"domain-{domain_incident_id}-{provider}"


def wire_key(cluster: str, key: str) -> str:
    """The ``Idempotency-Key`` sent to the provider: ``healer-<cluster>-<key>``."""
    return key if key.startswith("healer-") else f"healer-{cluster}-{key}"


def _json_value(value: float | None) -> float | str | None:
    # PostgreSQL's JSON refuses NaN/Infinity tokens; write them as Prometheus does.
    if value is None or math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "+Inf" if value > 0 else "-Inf"


def finding_record(finding: Finding) -> dict[str, Any]:
    """A finding as the ticket keeps it (JSON-safe).

    Shape: ``{"rule", "series_key", "gpu", "severity", "value" (float, "NaN", "+Inf", "-Inf" or
    None), "unit", "labels" {str: str}, "since" (ISO 8601 or None), "fired_at", "summary"}``.
    """
    return {
        "rule": finding.rule,
        "series_key": finding.series_key,
        "gpu": finding.gpu,
        "severity": finding.severity,
        "value": _json_value(finding.value),
        "unit": finding.unit,
        "labels": {str(k): str(v) for k, v in finding.labels.items()},
        "since": finding.active_since.isoformat() if finding.active_since else None,
        "fired_at": finding.fired_at.isoformat() if finding.fired_at else None,
        "summary": finding.summary,
    }


def _merge(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``old`` with ``new`` added; a finding of a series already listed replaces it (fresher value)."""
    merged = {f["series_key"]: f for f in old}
    for record in new:
        merged[record["series_key"]] = record
    return list(merged.values())


def get_ticket(session: Session, *, incident_id: int, provider: str) -> Ticket | None:
    """The ticket requested for ``incident_id`` from ``provider`` (the requested name, before any
    escalation rerouting), if any."""
    return session.scalar(select(Ticket).where(Ticket.idempotency_key == ticket_key(incident_id, provider)))


def pending_message(session: Session, ticket: Ticket) -> OutboxMessage | None:
    """The ticket's outbox message still waiting to be delivered, if any."""
    return session.scalar(
        select(OutboxMessage)
        .where(OutboxMessage.ticket_id == ticket.id, OutboxMessage.status == OutboxStatus.PENDING)
        .order_by(OutboxMessage.id.desc())
        .limit(1)
    )


def queue(
    session: Session, ticket: Ticket, *, key: str, now: datetime, due: datetime | None = None
) -> OutboxMessage:
    """Add a pending outbox message for ``ticket`` under ``key``, due at ``now`` (or at ``due``
    when later: a ticket held for its log bundle), rendered at delivery. Never commits."""
    message = OutboxMessage(
        ticket_id=ticket.id,
        provider=ticket.provider,
        idempotency_key=key,
        body="",
        status=OutboxStatus.PENDING,
        attempts=0,
        next_attempt_at=max(now, due) if due is not None else now,
        created_at=now,
    )
    session.add(message)
    return message


def request_ticket(
    session: Session,
    *,
    incident: Incident,
    node: Node,
    provider: str,
    template: str | None,
    findings: list[Finding],
    now: datetime,
    hold_until: datetime | None = None,
) -> Ticket:
    """Ask ``provider`` to repair ``node`` for ``incident``, listing ``findings``. Never commits.

    Call it in the same transaction as the lifecycle step that wants the ticket. Idempotent per
    (incident, provider):

    - first call: a ``pending`` ticket and a ``pending`` outbox message due at ``now``, and an
      ``actions`` row (kind ``ticket``);
    - later calls: the existing ticket is returned, no second row. New findings (another rule on
      the same node) are added to it while it is still waiting for delivery, so the provider gets
      one ticket listing all of them; once sent, nothing is resent (the dashboard shows the rest).

    ``template`` is the rule's template override (a name: a built-in such as ``slack.json.j2`` or a
    file in ``tickets.templates_dir``); ``None`` uses the provider's. Whether the ticket escalates
    (a repeat offender) is decided at delivery, against the settings' ``repeat_window_days``.

    ``hold_until``: a new ticket's message is not due before then (the node agent's log bundle is
    on its way; :func:`release_held` makes it due once it is recorded).
    """
    records = [finding_record(f) for f in findings]
    ticket = get_ticket(session, incident_id=incident.id, provider=provider)
    if ticket is not None:
        merged = _merge(ticket.findings or [], records)
        if merged == (ticket.findings or []):
            return ticket
        if ticket.status == TicketStatus.PENDING and pending_message(session, ticket) is not None:
            ticket.findings = merged
            ticket.updated_at = now
            log.info(
                "ticket %s for node %s now lists %d findings", ticket.idempotency_key, node.name, len(merged)
            )
        else:
            log.info(
                "ticket %s for node %s is already %s; new findings are not resent",
                ticket.idempotency_key,
                node.name,
                ticket.status,
            )
        return ticket

    key = ticket_key(incident.id, provider)
    ticket = _new_ticket(session, incident, node, provider, key, records, template, now=now, due=hold_until)
    log.info("ticket %s requested from %s for node %s", key, provider, node.name)
    return ticket


def _new_ticket(
    session: Session,
    incident: Incident,
    node: Node,
    provider: str,
    key: str,
    findings: list[dict[str, Any]],
    template: str | None,
    *,
    now: datetime,
    audit: dict[str, Any] | None = None,
    due: datetime | None = None,
    **columns: Any,
) -> Ticket:
    """A ``pending`` ticket (created ``now``, with more ``columns``), its outbox message, due at
    ``now`` (or ``due`` when later), and its ``ticket`` audit row: on the node and incident, or
    with ``audit`` added to its detail and on neither (a domain's ticket)."""
    ticket = Ticket(
        incident_id=incident.id,
        node_id=node.id,
        provider=provider,
        idempotency_key=key,
        status=TicketStatus.PENDING,
        escalated=False,
        created_at=now,
        updated_at=now,
        findings=findings,
        template=template,
        **columns,
    )
    session.add(ticket)
    session.flush()
    queue(session, ticket, key=key, now=now, due=due)
    repo.record_action(
        session,
        kind="ticket",
        status=ActionStatus.PENDING,
        actor=ACTOR,
        now=now,
        node=None if audit else node,
        incident=None if audit else incident,
        target=provider,
        detail={
            "ticket_id": ticket.id,
            "key": key,
            **(audit or {}),
            "rules": sorted({r["rule"] for r in findings}),
        },
    )
    return ticket


def request_domain_ticket(
    session: Session,
    *,
    domain: DomainIncident,
    anchor: Incident,
    node: Node,
    provider: str,
    template: str | None,
    findings: list[Finding],
    now: datetime,
) -> Ticket:
    """Ask ``provider`` (the domain kind's queue: a switch or rack team) to repair ``domain``, once
    per (domain incident, provider). Never commits; call it in the transaction that links the
    domain's members. ``anchor`` and ``node`` are a member's open incident and node (the ticket
    row's incident and node; the payload names the domain and every member).
    """
    key = domain_ticket_key(domain.id, provider)
    found = session.scalar(select(Ticket).where(Ticket.idempotency_key == key))
    if found is not None:
        return found
    records = [finding_record(f) for f in findings]
    ticket = _new_ticket(
        session,
        anchor,
        node,
        provider,
        key,
        records,
        template,
        now=now,
        # A domain's repair is not a node's repeat: no repeat-offender escalation.
        escalation={"escalated": False, "window_days": 0, "reason": "", "previous": []},
        domain_incident_id=domain.id,
        # the audit row names the domain, not its first member (whose own history it is not)
        audit={"domain": {"id": domain.id, "kind": domain.kind, "name": domain.name}},
    )
    log.info("ticket %s requested from %s for %s %s", key, provider, domain.kind, domain.name)
    return ticket


def release_held(session: Session, *, incident_id: int, now: datetime) -> int:
    """Make the incident's tickets held for its log bundle due at ``now`` (their messages still
    pending, never attempted, due later). Never commits; returns how many were released."""
    tickets = select(Ticket.id).where(Ticket.incident_id == incident_id)
    result = session.execute(
        update(OutboxMessage)
        .where(
            OutboxMessage.ticket_id.in_(tickets),
            OutboxMessage.status == OutboxStatus.PENDING,
            OutboxMessage.attempts == 0,
            OutboxMessage.next_attempt_at > now,
        )
        .values(next_attempt_at=now)
        .execution_options(synchronize_session=False)
    )
    return int(getattr(result, "rowcount", 0) or 0)
