"""What a human operator can do (CLI and dashboard share these): release a node, pause, reset the
circuit breaker, add a note. Each is recorded in the audit log (``actions``) with the user.

Node state has one writer, the controller's lifecycle table: a release here is a request written
on the node's open incident; the controller's next reconcile of the node (every tick) moves it, by
the table's "operator release" row, with the same fencing as every other transition.

Functions take the caller's session and never commit. They raise :class:`OperationError` with a
message fit for the user when the operation does not apply (unknown node, wrong state).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from healer.engine.lifecycle import RELEASABLE
from healer.errors import HealerError
from healer.model.states import ActionStatus
from healer.store import nodes as repo
from healer.store.models import Node

__all__ = ["RELEASABLE", "OperationError", "release_node"]


class OperationError(HealerError):
    """An operator action does not apply (unknown node, node not in a releasable state, ...)."""


def _node(session: Session, name: str) -> Node:
    node = session.scalar(select(Node).where(Node.name == name))
    if node is None:
        raise OperationError(f"unknown node {name!r}")
    return node


def release_node(session: Session, *, node_name: str, actor: str, now: datetime, reason: str = "") -> Node:
    """Tell healer the node is repaired: the request is recorded on its open incident, and the
    controller's next reconcile moves it to ``validating``; it returns to service once its rules
    stay clear for the recovery hold. The node's state is not changed here.

    Raises:
        OperationError: unknown node, not in a releasable state (e.g. already healthy), or no open
            incident to release.
    """
    node = _node(session, node_name)
    if node.state not in RELEASABLE:
        raise OperationError(
            f"node {node_name} is {node.state}; only {', '.join(sorted(RELEASABLE))} can be released"
        )
    incident = repo.open_incident(session, node)
    if incident is None:
        raise OperationError(f"node {node_name} is {node.state} but has no open incident to release")
    why = reason or "released by operator"
    incident.release_requested = {"actor": actor, "reason": why, "at": now.isoformat()}
    repo.record_action(
        session,
        kind="release",
        status=ActionStatus.PENDING,
        actor=actor,
        now=now,
        node=node,
        incident=incident,
        detail={"reason": why},
    )
    return node


def set_paused(session: Session, *, paused: bool, actor: str, now: datetime, reason: str = "") -> None:
    """Pause (no new quarantine, drain or ticket; detection and recording go on) or resume healer."""
    repo.set_switch(session, repo.SWITCH_PAUSED, {"paused": paused, "reason": reason}, now=now, by=actor)
    repo.record_action(
        session,
        kind="pause" if paused else "resume",
        status=ActionStatus.SUCCEEDED,
        actor=actor,
        now=now,
        target="healer",
        detail={"reason": reason} if reason else None,
    )


def is_paused(session: Session) -> bool:
    return bool(repo.get_switch(session, repo.SWITCH_PAUSED).get("paused", False))


def reset_breaker(session: Session, *, actor: str, now: datetime) -> list[str]:
    """Reset a tripped circuit breaker. Returns the nodes it held back; they are re-evaluated against
    fresh data on the next tick, not replayed.

    Raises:
        OperationError: the breaker is not tripped.
    """
    breaker = repo.get_switch(session, repo.SWITCH_BREAKER)
    if not breaker.get("tripped"):
        raise OperationError("the circuit breaker is not tripped")
    held = list(breaker.get("held", []))
    repo.set_switch(
        session,
        repo.SWITCH_BREAKER,
        {
            "tripped": False,
            "reset_at": now.isoformat(),
            "reset_by": actor,
            "last_reason": breaker.get("reason"),
        },
        now=now,
        by=actor,
    )
    repo.record_action(
        session,
        kind="breaker_reset",
        status=ActionStatus.SUCCEEDED,
        actor=actor,
        now=now,
        target="healer",
        detail={"held": held},
    )
    return held


def add_note(session: Session, *, node_name: str, actor: str, now: datetime, text: str) -> None:
    """Attach a free-text note to the node's audit trail (and its open incident, if any).

    Raises:
        OperationError: unknown node or empty note.
    """
    if not text.strip():
        raise OperationError("a note needs some text")
    node = _node(session, node_name)
    repo.record_action(
        session,
        kind="note",
        status=ActionStatus.SUCCEEDED,
        actor=actor,
        now=now,
        node=node,
        incident=repo.open_incident(session, node),
        detail={"text": text.strip()},
    )
