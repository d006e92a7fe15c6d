"""Ticket operations shared by the CLI, the dashboard and the provider callback.

- :func:`apply_provider_status`: a provider's (verified) status callback moves a ticket forward.
- :func:`close_ticket`, :func:`retry_ticket`: what an SRE can do by hand.
- :func:`list_tickets`, :func:`provider_stats`: what the CLI and the dashboard show.

Functions take the caller's session and never commit. Times are aware UTC, passed in.

Status order (a callback never moves a ticket backwards, so duplicates and out-of-order callbacks
are harmless)::

    pending, sent, failed  <  acknowledged  <  in_progress = needs_info  <  resolved
    rejected, resolved, closed: final

Duplicates arriving at the same moment are serialised on the ticket's row: the callback reads the
ticket ``SELECT ... FOR UPDATE`` (PostgreSQL; SQLite has one writer at a time anyway), so the
second waits for the first to commit, then sees its status and changes nothing (one audit row, one
``changed: true``, the node's validation clock started once).

A late ``acknowledged`` after ``in_progress`` or ``resolved`` changes nothing; ``needs_info`` and
``in_progress`` may alternate; ``resolved`` or ``rejected`` end it. ``resolved`` moves the node
``repaired`` → ``validating`` (when it is waiting for the repair), which returns it to service
once its rules stay clear for the recovery hold.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from healer.model.states import ActionStatus, OutboxStatus, TicketStatus
from healer.model.states import TicketResolution as Resolution
from healer.operations import OperationError
from healer.store import nodes as repo
from healer.store.models import Incident, Node, OutboxMessage, Ticket
from healer.tickets.views import TicketView, ticket_views

log = logging.getLogger(__name__)

#: Statuses a provider may report in a callback.
CALLBACK_STATUSES = frozenset(
    {
        TicketStatus.ACKNOWLEDGED,
        TicketStatus.IN_PROGRESS,
        TicketStatus.NEEDS_INFO,
        TicketStatus.RESOLVED,
        TicketStatus.REJECTED,
    }
)
#: Statuses that need a reason in the callback.
NEEDS_REASON = frozenset({TicketStatus.NEEDS_INFO, TicketStatus.REJECTED})
#: Tickets in these statuses are finished.
FINAL = frozenset({TicketStatus.RESOLVED, TicketStatus.REJECTED, TicketStatus.CLOSED})
#: Tickets in these statuses count as open (waiting on the provider or on delivery).
OPEN = frozenset(
    {
        TicketStatus.PENDING,
        TicketStatus.SENT,
        TicketStatus.ACKNOWLEDGED,
        TicketStatus.IN_PROGRESS,
        TicketStatus.NEEDS_INFO,
    }
)
_RANK = {
    TicketStatus.PENDING: 0,
    TicketStatus.SENT: 0,
    TicketStatus.FAILED: 0,
    TicketStatus.ACKNOWLEDGED: 1,
    TicketStatus.IN_PROGRESS: 2,
    TicketStatus.NEEDS_INFO: 2,
    TicketStatus.RESOLVED: 3,
    TicketStatus.REJECTED: 3,
    TicketStatus.CLOSED: 3,
}


class TicketNotFound(OperationError):
    """No ticket has this id."""


@dataclass(frozen=True)
class StatusChange:
    """Result of one provider callback: ``changed`` is False when it was a duplicate or came late."""

    ticket_id: int
    status: str
    previous: str
    changed: bool
    node_state: str | None = None  # the node's state as recorded (the controller moves it next tick)


def _ticket(session: Session, ticket_id: int) -> Ticket:
    ticket = session.get(Ticket, ticket_id)
    if ticket is None:
        raise TicketNotFound(f"unknown ticket {ticket_id}")
    return ticket


def _locked_ticket(session: Session, ticket_id: int) -> Ticket:
    """The ticket, its row locked until the caller's transaction ends, read fresh (not from the
    session's identity map, which could hold a copy from before another callback committed)."""
    ticket = session.scalar(
        select(Ticket)
        .where(Ticket.id == ticket_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    if ticket is None:
        raise TicketNotFound(f"unknown ticket {ticket_id}")
    return ticket


def apply_provider_status(
    session: Session,
    *,
    ticket_id: int,
    status: TicketStatus,
    now: datetime,
    at: datetime | None = None,
    reason: str | None = None,
    external_id: str | None = None,
    resolution: str | None = None,
) -> StatusChange:
    """Apply a provider's status report (already verified) to the ticket.

    ``at`` is the provider's time of the change (for time to acknowledge and to repair), ``now``
    when it is absent. The actor in ``actions`` and ``transitions`` is ``provider:<name>``.

    Raises:
        TicketNotFound: no such ticket.
        ValueError: ``status`` is not one a provider may report, a ``needs_info``/``rejected``
            without a reason, or a ``resolution`` not with ``resolved`` (or not one of
            :class:`~healer.engine.outcomes.Resolution`).

    ``resolution``: with ``resolved``, what the repair found (``replaced``, ``fault_found``,
    ``no_fault_found``); it decides the incident's outcome (:mod:`healer.engine.outcomes`).
    """
    status = TicketStatus(status)
    if status not in CALLBACK_STATUSES:
        raise ValueError(f"a provider cannot report status {status!r}")
    if status in NEEDS_REASON and not (reason or "").strip():
        raise ValueError(f"status {status} needs a reason")
    if resolution is not None:
        if status != TicketStatus.RESOLVED:
            raise ValueError(f"a resolution goes with status resolved, not {status}")
        resolution = str(Resolution(resolution))
    ticket = _locked_ticket(session, ticket_id)
    previous = ticket.status
    when = at or now
    actor = f"provider:{ticket.provider}"
    current = TicketStatus(previous)
    moves = current not in FINAL and (
        _RANK[status] > _RANK[current]
        or {status, current} == {TicketStatus.IN_PROGRESS, TicketStatus.NEEDS_INFO}
    )
    if not moves:
        log.info("ticket %d: %s callback ignored, ticket is %s", ticket.id, status, previous)
        return StatusChange(ticket.id, previous, previous, changed=False)

    ticket.status = status
    ticket.updated_at = now
    if external_id and not ticket.external_id:
        ticket.external_id = external_id[:200]
    if reason:
        ticket.reason = reason
    # A provider that reports progress or a result has seen the ticket.
    if ticket.acknowledged_at is None:
        ticket.acknowledged_at = when
    if ticket.sent_at is None:
        ticket.sent_at = min(when, now)
    if status in (TicketStatus.RESOLVED, TicketStatus.REJECTED):
        ticket.resolved_at = when
        ticket.resolution = resolution
        _cancel_delivery(session, ticket, why=f"ticket {status} by the provider")

    node = session.get(Node, ticket.node_id)
    incident = session.get(Incident, ticket.incident_id)
    node_state = None
    detail: dict[str, Any] = {
        "ticket_id": ticket.id,
        "from": previous,
        "to": str(status),
        "at": when.isoformat(),
    }
    if reason:
        detail["reason"] = reason
    if resolution:
        detail["resolution"] = resolution
    if node is not None:
        # The ticket's status is an input: the controller's next reconcile of the node moves it
        # (a resolved ticket: repaired, then validating) by the lifecycle table, fenced like every
        # transition. Node state has one writer.
        node_state = node.state
    repo.record_action(
        session,
        kind="ticket_status",
        status=ActionStatus.SUCCEEDED,
        actor=actor,
        now=now,
        node=node,
        incident=incident,
        target=ticket.external_id or f"ticket {ticket.id}",
        detail=detail,
    )
    log.info("ticket %d: %s -> %s by %s", ticket.id, previous, status, actor)
    return StatusChange(ticket.id, str(status), previous, changed=True, node_state=node_state)


def _cancel_delivery(session: Session, ticket: Ticket, *, why: str) -> None:
    for message in session.scalars(
        select(OutboxMessage).where(
            OutboxMessage.ticket_id == ticket.id, OutboxMessage.status == OutboxStatus.PENDING
        )
    ):
        message.status = OutboxStatus.FAILED
        message.last_error = f"cancelled: {why}"


def close_ticket(session: Session, *, ticket_id: int, actor: str, now: datetime, reason: str) -> Ticket:
    """Close a ticket by hand (an SRE: the provider was called, the node was replaced, ...).

    A delivery still pending is cancelled. The node is not moved: release it separately
    (``healer node release``) when it is repaired.

    ``reason`` is recorded on the ticket and in the audit log (empty: "closed by <actor>").

    Raises:
        TicketNotFound: no such ticket.
        OperationError: the ticket is already resolved or closed.
    """
    reason = reason.strip() or f"closed by {actor}"
    ticket = _ticket(session, ticket_id)
    if ticket.status in (TicketStatus.RESOLVED, TicketStatus.CLOSED):
        raise OperationError(f"ticket {ticket_id} is already {ticket.status}")
    previous = ticket.status
    ticket.status = TicketStatus.CLOSED
    ticket.closed_by = actor
    ticket.reason = reason
    ticket.updated_at = now
    _cancel_delivery(session, ticket, why=f"ticket closed by {actor}")
    repo.record_action(
        session,
        kind="ticket_close",
        status=ActionStatus.SUCCEEDED,
        actor=actor,
        now=now,
        node=session.get(Node, ticket.node_id),
        incident=session.get(Incident, ticket.incident_id),
        target=ticket.external_id or f"ticket {ticket.id}",
        detail={"ticket_id": ticket.id, "from": previous, "reason": reason},
    )
    return ticket


def retry_ticket(session: Session, *, ticket_id: int, actor: str, now: datetime) -> Ticket:
    """Queue a failed ticket for delivery again (after fixing a template, URL or the provider side).

    The same idempotency key is reused, so the provider still sees one ticket.

    Raises:
        TicketNotFound: no such ticket.
        OperationError: the ticket is not ``failed``.
    """
    ticket = _ticket(session, ticket_id)
    if ticket.status != TicketStatus.FAILED:
        raise OperationError(f"ticket {ticket_id} is {ticket.status}; only failed tickets can be retried")
    message = session.scalar(
        select(OutboxMessage).where(OutboxMessage.ticket_id == ticket.id).order_by(OutboxMessage.id.desc())
    )
    if message is None:
        raise OperationError(f"ticket {ticket_id} has no delivery to retry")
    message.status = OutboxStatus.PENDING
    message.next_attempt_at = now
    ticket.status = TicketStatus.PENDING
    ticket.updated_at = now
    repo.record_action(
        session,
        kind="ticket_retry",
        status=ActionStatus.SUCCEEDED,
        actor=actor,
        now=now,
        node=session.get(Node, ticket.node_id),
        incident=session.get(Incident, ticket.incident_id),
        target=f"ticket {ticket.id}",
        detail={"ticket_id": ticket.id, "previous_error": ticket.last_error},
    )
    return ticket


def list_tickets(
    session: Session, *, status: list[str] | None = None, node: str | None = None, limit: int = 100
) -> list[TicketView]:
    """Tickets, newest first, optionally only in ``status`` or for ``node`` (name)."""
    query = (
        select(Ticket)
        .join(Node, Node.id == Ticket.node_id)
        .order_by(Ticket.created_at.desc(), Ticket.id.desc())
        .limit(limit)
    )
    if status:
        query = query.where(Ticket.status.in_(status))
    if node:
        query = query.where(Node.name == node)
    return ticket_views(session, list(session.scalars(query)))


@dataclass(frozen=True)
class ProviderStats:
    """Per provider: tickets open now, and medians in seconds (``None`` without data).

    Time to acknowledge = ``acknowledged_at - sent_at``; time to repair = ``resolved_at - sent_at``
    (only tickets the provider resolved, not rejected or closed by hand). Both use the provider's
    own timestamps from its callbacks.
    """

    provider: str
    open: int
    total: int
    failed: int
    median_ack_seconds: float | None
    median_repair_seconds: float | None


def provider_stats(session: Session, *, since: datetime | None = None) -> list[ProviderStats]:
    """Per-provider open count and median times to acknowledge and to repair, sorted by provider.

    ``since`` limits the medians and totals to tickets created at or after it (open counts are
    always current).
    """
    query = select(
        Ticket.provider,
        Ticket.status,
        Ticket.created_at,
        Ticket.sent_at,
        Ticket.acknowledged_at,
        Ticket.resolved_at,
    )
    acc: dict[str, dict[str, Any]] = {}
    for provider, status, created_at, sent_at, ack_at, resolved_at in session.execute(query):
        entry = acc.setdefault(provider, {"open": 0, "total": 0, "failed": 0, "ack": [], "repair": []})
        if status in OPEN:
            entry["open"] += 1
        if since is not None and created_at < since:
            continue
        entry["total"] += 1
        if status == TicketStatus.FAILED:
            entry["failed"] += 1
        start = sent_at or created_at
        if ack_at is not None:
            entry["ack"].append(max((ack_at - start).total_seconds(), 0.0))
        if resolved_at is not None and status == TicketStatus.RESOLVED:
            entry["repair"].append(max((resolved_at - start).total_seconds(), 0.0))
    return [
        ProviderStats(
            provider=name,
            open=e["open"],
            total=e["total"],
            failed=e["failed"],
            median_ack_seconds=statistics.median(e["ack"]) if e["ack"] else None,
            median_repair_seconds=statistics.median(e["repair"]) if e["repair"] else None,
        )
        for name, e in sorted(acc.items())
    ]
