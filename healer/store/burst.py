"""The burst's records: its transitions (``burst_transitions``), its returns (``actions`` rows of
kind ``burst_return``) and its last observation (the ``burst`` switch). Written by
:mod:`healer.controller.burst` only; read by the dashboard and ``/metrics``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from healer.store.models import Action, BurstTransition

#: ``actions.kind`` of a pod evicted off a closed burst node (or, in dry-run, that would have been).
RETURN_KIND = "burst_return"
#: The switch holding the last observation: ``{"at": iso, "rules": [{rule, enabled, capacity,
#: nodes: [{node, state, by_hand, out: [pod...], stay: {pod: reason}}]}]}``.
SWITCH_BURST = "burst"


def last_transitions(session: Session) -> dict[tuple[str, str], BurstTransition]:
    """(rule, node) → its latest transition (one query)."""
    latest = (
        select(BurstTransition.rule, BurstTransition.node, func.max(BurstTransition.id).label("id"))
        .group_by(BurstTransition.rule, BurstTransition.node)
        .subquery()
    )
    rows = session.scalars(select(BurstTransition).join(latest, BurstTransition.id == latest.c.id))
    return {(r.rule, r.node): r for r in rows}


def history(session: Session, *, limit: int = 200) -> list[BurstTransition]:
    """The latest transitions, newest first."""
    return list(session.scalars(select(BurstTransition).order_by(BurstTransition.id.desc()).limit(limit)))


def record_transition(session: Session, **values: Any) -> BurstTransition:
    """Add one transition row (columns of :class:`BurstTransition` as keywords)."""
    row = BurstTransition(**values)
    session.add(row)
    return row


def last_return_at(session: Session) -> datetime | None:
    """When the latest pod was sent back off a burst node (for the pace after a restart)."""
    return session.scalar(select(func.max(Action.created_at)).where(Action.kind == RETURN_KIND))


def returned(session: Session) -> dict[tuple[str, str], int]:
    """(rule, node) → pods evicted back into the cluster (``succeeded`` returns), ever."""
    rows = session.execute(
        select(Action.detail).where(Action.kind == RETURN_KIND, Action.status == "succeeded")
    ).scalars()
    out: dict[tuple[str, str], int] = {}
    for detail in rows:
        key = (str((detail or {}).get("rule", "")), str((detail or {}).get("node", "")))
        out[key] = out.get(key, 0) + 1
    return out


def recent_returns(session: Session, *, limit: int = 100) -> list[Action]:
    """The latest returns (any status), newest first."""
    return list(
        session.scalars(
            select(Action).where(Action.kind == RETURN_KIND).order_by(Action.id.desc()).limit(limit)
        )
    )
