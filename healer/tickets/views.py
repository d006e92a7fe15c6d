"""The ticket read model: one ticket as the CLI, the dashboard and the JSON API show it.

Built from the ``tickets`` row and its latest outbox message (one outbox query for any number of
tickets); no payload, no secrets (errors redacted once more here: providers echo URLs and tokens).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from healer.model.states import OutboxStatus, TicketStatus
from healer.redaction import redact_text
from healer.store.models import Node, OutboxMessage, Ticket
from healer.store.outcomes import overdue_on

#: Ticket statuses after which nothing more happens on the provider's side.
CLOSED_TICKETS = (TicketStatus.RESOLVED, TicketStatus.REJECTED, TicketStatus.FAILED, TicketStatus.CLOSED)


@dataclass(frozen=True)
class TicketView:
    """A ticket as listed. ``attempts``, ``next_attempt_at`` and ``idempotency_key`` are its latest
    outbox message's; ``delivery_error`` is that message's last error (with the HTTP status) while
    it is not delivered, else the ticket's ``last_error``. Times are aware UTC."""

    id: int
    node: str
    incident_id: int
    provider: str
    status: str
    escalated: bool
    external_id: str | None
    idempotency_key: str
    attempts: int
    next_attempt_at: datetime | None
    last_error: str | None
    delivery_error: str | None
    reason: str | None
    created_at: datetime
    sent_at: datetime | None
    acknowledged_at: datetime | None
    resolved_at: datetime | None
    closed_by: str | None
    #: The provider's repair targets it is past (``ack``, ``repair``; healer.tickets.targets).
    overdue: list[str] = field(default_factory=list)

    @property
    def open(self) -> bool:
        """The provider may still act on it (not resolved, rejected, failed or closed)."""
        return self.status not in CLOSED_TICKETS

    @property
    def time_to_acknowledge_seconds(self) -> float | None:
        """From delivery (or creation) to the provider's acknowledgement, seconds."""
        started = self.sent_at or self.created_at
        return (self.acknowledged_at - started).total_seconds() if self.acknowledged_at else None

    @property
    def time_to_repair_seconds(self) -> float | None:
        """From delivery (or creation) to the provider's resolution, seconds."""
        started = self.sent_at or self.created_at
        return (self.resolved_at - started).total_seconds() if self.resolved_at else None


def ticket_views(
    session: Session, tickets: Sequence[Ticket], *, node_names: Mapping[int, str] | None = None
) -> list[TicketView]:
    """The views of ``tickets``, in their order (node names looked up unless given)."""
    if not tickets:
        return []
    names = dict(node_names) if node_names is not None else _node_names(session, (t.node_id for t in tickets))
    latest: dict[int, OutboxMessage] = {}
    for message in session.scalars(
        select(OutboxMessage)
        .where(OutboxMessage.ticket_id.in_([t.id for t in tickets]))
        .order_by(OutboxMessage.created_at.desc(), OutboxMessage.id.desc())
    ):
        latest.setdefault(message.ticket_id, message)
    return [_view(t, latest.get(t.id), names.get(t.node_id, "")) for t in tickets]


def _view(t: Ticket, msg: OutboxMessage | None, node: str) -> TicketView:
    delivery_error = t.last_error
    if msg is not None and msg.last_error and msg.status != OutboxStatus.DELIVERED:
        code = f"HTTP {msg.last_status_code}: " if msg.last_status_code else ""
        delivery_error = f"{code}{msg.last_error}"
    return TicketView(
        id=t.id,
        node=node,
        incident_id=t.incident_id,
        provider=t.provider,
        status=t.status,
        escalated=t.escalated,
        external_id=t.external_id,
        idempotency_key=msg.idempotency_key if msg else t.idempotency_key,
        attempts=msg.attempts if msg else 0,
        next_attempt_at=msg.next_attempt_at if msg and msg.status == OutboxStatus.PENDING else None,
        # A provider may echo back a URL or token: every reader (CLI, API, pages) sees it redacted.
        last_error=redact_text(t.last_error) if t.last_error else None,
        delivery_error=redact_text(delivery_error) if delivery_error else None,
        reason=redact_text(t.reason) if t.reason else None,
        created_at=t.created_at,
        sent_at=t.sent_at,
        acknowledged_at=t.acknowledged_at,
        resolved_at=t.resolved_at,
        closed_by=t.closed_by,
        overdue=overdue_on(t),
    )


def _node_names(session: Session, ids: Iterable[int]) -> dict[int, str]:
    wanted = set(ids)
    return {i: n for i, n in session.execute(select(Node.id, Node.name).where(Node.id.in_(wanted)))}
