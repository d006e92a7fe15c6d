"""Fleet-wide facts a pass needs before it reconciles nodes one by one (constant SQL statements).

Which nodes to reconcile, in which order, how many of each pool are out of service (the budget),
and which nodes turned bad (the circuit breaker's input).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from healer.engine import safety
from healer.engine.fleet import order, turned_bad, turned_bad_on
from healer.model.findings import TickFindings
from healer.model.states import OUT_OF_SERVICE, NodeState
from healer.store.models import Incident, Node

__all__ = [
    "candidates",
    "order",
    "out_of_service",
    "parse_time",
    "pool_usage",
    "turned_bad",
    "turned_bad_on",
]

_OUT = (Node.state.in_([str(s) for s in OUT_OF_SERVICE])) | (
    (Node.state == NodeState.BLOCKED) & (Incident.blocked_step == "drain")
)


def pool_usage(session: Session) -> dict[str, safety.PoolUsage]:
    """Pool → (size, nodes out of service now); a blocked node counts when it is cordoned."""
    usage: dict[str, safety.PoolUsage] = {}
    rows = session.execute(
        select(Node.pool, Node.state, Incident.blocked_step).outerjoin(
            Incident, (Incident.node_id == Node.id) & Incident.closed_at.is_(None)
        )
    ).all()
    for pool, state, blocked_step in rows:
        out = state in OUT_OF_SERVICE or (state == NodeState.BLOCKED and blocked_step == "drain")
        current = usage.get(pool, safety.PoolUsage(size=0))
        usage[pool] = safety.PoolUsage(size=current.size + 1, out=current.out + int(out))
    return usage


def out_of_service(session: Session) -> frozenset[str]:
    """Nodes out of service now (as :func:`pool_usage` counts them: a blocked node when cordoned)."""
    rows = session.scalars(
        select(Node.name)
        .outerjoin(Incident, (Incident.node_id == Node.id) & Incident.closed_at.is_(None))
        .where(_OUT)
    )
    return frozenset(rows.all())


def candidates(session: Session, findings: TickFindings) -> list[str]:
    """Nodes the tick reconciles: those with findings, and every node not healthy (unknown nodes
    come back when their data does; deleted ones stay unknown: their read is a 404)."""
    names = set(findings.firing) | set(findings.pending) | set(findings.unknown)
    names |= set(session.scalars(select(Node.name).where(Node.state != NodeState.HEALTHY)).all())
    return sorted(names)


def parse_time(value: object) -> datetime | None:
    """An ISO 8601 time stored in a switch, or None."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None
