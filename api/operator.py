"""Operator actions, shared by the dashboard forms and the JSON API.

Each runs in its own transaction and delegates to :mod:`healer.operations` (or :mod:`healer.tickets.service`),
which records the action in the audit log with the user. Refusals become :class:`ApiError`:
404 for an unknown node or ticket, 409 when the action does not apply now, 422 for bad input.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from api import queries
from api.errors import ApiError
from api.schemas import OperationOut
from healer import operations
from healer.errors import HealerError
from healer.store.models import Node
from healer.tickets import service as tickets


def _node_summary(session: Session, node: Node) -> Any:
    (summary,) = queries.summarize_nodes(session, [node])
    return summary


def release(
    factory: sessionmaker[Session], *, node: str, actor: str, now: datetime, reason: str = ""
) -> OperationOut:
    """Ask for ``node``'s release: the controller's next tick moves it to ``validating``, and it is
    back in service once its rules stay clear."""
    with factory() as session, session.begin():
        queries.get_node(session, node)
        try:
            row = operations.release_node(session, node_name=node, actor=actor, now=now, reason=reason)
        except operations.OperationError as exc:
            raise ApiError(409, str(exc)) from exc
        message = (
            f"{node} release requested: the controller moves it from {row.state} to validating "
            "at its next tick"
        )
        return OperationOut(message=message, node=_node_summary(session, row))


def add_note(
    factory: sessionmaker[Session], *, node: str, actor: str, now: datetime, text: str
) -> OperationOut:
    """Attach a note to ``node``'s audit trail."""
    if not text.strip():
        raise ApiError(422, "a note needs some text", code="validation_error")
    with factory() as session, session.begin():
        row = queries.get_node(session, node)
        try:
            operations.add_note(session, node_name=node, actor=actor, now=now, text=text)
        except operations.OperationError as exc:
            raise ApiError(409, str(exc)) from exc
        return OperationOut(message=f"note added to {node}", node=_node_summary(session, row))


def set_paused(
    factory: sessionmaker[Session], *, paused: bool, actor: str, now: datetime, reason: str = ""
) -> OperationOut:
    """Pause (no new quarantine, drain or ticket) or resume healer."""
    with factory() as session, session.begin():
        operations.set_paused(session, paused=paused, actor=actor, now=now, reason=reason)
    return OperationOut(message="healer paused" if paused else "healer resumed")


def reset_breaker(factory: sessionmaker[Session], *, actor: str, now: datetime) -> OperationOut:
    """Reset the tripped circuit breaker; what it held is re-evaluated on fresh data, not replayed."""
    with factory() as session, session.begin():
        try:
            held = operations.reset_breaker(session, actor=actor, now=now)
        except operations.OperationError as exc:
            raise ApiError(409, str(exc)) from exc
    return OperationOut(message=f"circuit breaker reset ({len(held)} node(s) were held)", held=held)


def close_ticket(
    factory: sessionmaker[Session], *, ticket_id: int, actor: str, now: datetime, reason: str = ""
) -> OperationOut:
    """Close a ticket on healer's side (the SRE handled it another way); a pending delivery is cancelled."""
    with factory() as session, session.begin():
        ticket = queries.get_ticket(session, ticket_id)
        try:
            tickets.close_ticket(session, ticket_id=ticket_id, actor=actor, now=now, reason=reason)
        except HealerError as exc:
            raise ApiError(409, str(exc)) from exc
        session.flush()
        (row,) = queries.ticket_rows(session, [ticket], None, now=now)
        return OperationOut(message=f"ticket {ticket_id} closed", ticket=row)


def set_outcome(
    factory: sessionmaker[Session],
    *,
    incident_id: int,
    outcome: str | None,
    actor: str,
    now: datetime,
    reason: str = "",
) -> OperationOut:
    """Set a closed incident's outcome by hand (null: back to the derived one), audited."""
    from healer.engine.outcomes import Outcome
    from healer.store import outcomes

    with factory() as session, session.begin():
        try:
            row = outcomes.set_outcome(
                session,
                incident_id=incident_id,
                outcome=Outcome(outcome) if outcome else None,
                actor=actor,
                now=now,
                reason=reason,
            )
        except outcomes.OutcomeError as exc:
            raise ApiError(404 if "not found" in str(exc) else 409, str(exc)) from exc
        return OperationOut(
            message=(
                f"incident {incident_id} outcome: {row.outcome or 'none'} "
                f"({row.outcome_basis}, by {row.outcome_by})"
            )
        )
