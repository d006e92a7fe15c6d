"""Provider repair targets: a ticket not acknowledged within ``ack_within_seconds`` of its
delivery, or not resolved within ``repair_within_seconds``, is overdue; each missed target is
escalated once (an outbox message of its own, rendered with the provider's
``escalation_template``, and an audit row), never again for that ticket and target.

The escalation message's key is the ticket's plus ``-overdue-ack`` or ``-overdue-repair``, so a
provider sees it as its own request, and a failover never sends it twice (the ticket's
``overdue_escalated`` records it in the transaction that queues it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from healer.config import ProviderSettings, TicketSettings
from healer.model.states import ActionStatus, TicketStatus
from healer.store import nodes as repo
from healer.store.models import Incident, Node, Ticket
from healer.tickets import outbox

log = logging.getLogger(__name__)

#: Tickets still waiting on the provider (a target can still be missed).
OPEN = (TicketStatus.SENT, TicketStatus.ACKNOWLEDGED, TicketStatus.IN_PROGRESS, TicketStatus.NEEDS_INFO)
#: Marker in an escalation message's key: ``<ticket key>-overdue-<target>``.
OVERDUE_KEY = "-overdue-"


@dataclass(frozen=True)
class Miss:
    """A target a ticket missed: ``target`` (``ack`` or ``repair``), its limit (seconds) and when
    it fell due."""

    target: str
    within_seconds: float
    due_at: datetime


def missed(
    *,
    status: str,
    sent_at: datetime | None,
    acknowledged_at: datetime | None,
    ack_within_seconds: float | None,
    repair_within_seconds: float | None,
    now: datetime,
) -> list[Miss]:
    """The targets an open ticket has missed by ``now`` (measured from its delivery, ``sent_at``);
    none for a ticket not delivered yet or no longer open."""
    if sent_at is None or status not in OPEN:
        return []
    out = []
    if ack_within_seconds is not None and acknowledged_at is None:
        due = sent_at + timedelta(seconds=ack_within_seconds)
        if now >= due:
            out.append(Miss("ack", ack_within_seconds, due))
    if repair_within_seconds is not None:
        due = sent_at + timedelta(seconds=repair_within_seconds)
        if now >= due:
            out.append(Miss("repair", repair_within_seconds, due))
    return out


def misses_of(ticket: Ticket, provider: ProviderSettings | None, now: datetime) -> list[Miss]:
    """:func:`missed` for ``ticket`` under ``provider``'s targets (none without a provider)."""
    if provider is None:
        return []
    return missed(
        status=ticket.status,
        sent_at=ticket.sent_at,
        acknowledged_at=ticket.acknowledged_at,
        ack_within_seconds=provider.ack_within_seconds,
        repair_within_seconds=provider.repair_within_seconds,
        now=now,
    )


def escalate_overdue(session: Session, *, tickets: TicketSettings, now: datetime) -> list[tuple[int, str]]:
    """Queue one escalation per open ticket and missed target not escalated yet; returns the
    (ticket id, target) pairs queued. Never commits."""
    providers = {p.name: p for p in tickets.providers if p.ack_within_seconds or p.repair_within_seconds}
    if not providers:
        return []
    rows = session.scalars(
        select(Ticket).where(
            Ticket.status.in_([str(s) for s in OPEN]), Ticket.provider.in_(sorted(providers))
        )
    )
    queued = []
    for ticket in rows:
        done = dict(ticket.overdue_escalated or {})
        for miss in misses_of(ticket, providers[ticket.provider], now):
            if miss.target in done:
                continue
            done[miss.target] = now.isoformat()
            key = f"{ticket.idempotency_key}{OVERDUE_KEY}{miss.target}"
            outbox.queue(session, ticket, key=key, now=now)
            repo.record_action(
                session,
                kind="ticket_overdue",
                status=ActionStatus.SUCCEEDED,
                actor="healer",
                now=now,
                node=session.get(Node, ticket.node_id),
                incident=session.get(Incident, ticket.incident_id),
                target=ticket.provider,
                detail={
                    "ticket_id": ticket.id,
                    "target": miss.target,
                    "within_seconds": miss.within_seconds,
                    "due_at": miss.due_at.isoformat(),
                    "key": key,
                },
            )
            log.warning(
                "ticket %d (%s) missed its %s target (%.0f s): escalation queued",
                ticket.id,
                ticket.provider,
                miss.target,
                miss.within_seconds,
            )
            queued.append((ticket.id, miss.target))
        if done != (ticket.overdue_escalated or {}):
            ticket.overdue_escalated = done
            ticket.updated_at = now
    return queued


def overdue_target(key: str) -> str | None:
    """The target an escalation message's key names (``ack``/``repair``), None for a ticket's own."""
    _, sep, target = key.rpartition(OVERDUE_KEY)
    return target if sep else None
