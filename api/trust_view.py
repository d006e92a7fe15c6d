"""What the Trust page and ``GET /api/v1/trust`` show: each rule's record from its incidents'
outcomes (:mod:`healer.engine.outcomes`), per rule and per rule x node pool, and what each shadow
rule would have done had it acted, over the last ``days`` days.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from healer.engine import outcomes as oc
from healer.ruleset.schema import RuleSet
from healer.store import outcomes as store
from healer.store.models import Node


@dataclass(frozen=True)
class ShadowRow:
    """One shadow decision as listed: the rule, node, when, what it would have done, its outcome."""

    decision: oc.ShadowDecision
    judgement: oc.Judgement


@dataclass(frozen=True)
class OverdueTicket:
    """An open ticket past its provider's target: which targets, since when it was delivered."""

    ticket_id: int
    provider: str
    node: str
    status: str
    targets: list[str]
    sent_at: datetime | None
    escalated_at: dict[str, str]


@dataclass(frozen=True)
class TrustPage:
    """The window (days, ending ``now``), rule records (per rule, per rule x pool), the shadow
    rules' would-be records and their latest decisions, and each rule's mode."""

    days: int
    now: datetime
    rules: list[oc.RuleRecord]
    pools: list[oc.RuleRecord]
    shadow: list[oc.ShadowRecord]
    decisions: list[ShadowRow]
    modes: dict[str, str]
    overdue: list[OverdueTicket]

    def as_json(self) -> dict[str, Any]:
        def record(r: oc.RuleRecord) -> dict[str, Any]:
            return {
                "rule": r.rule,
                **({"pool": r.pool} if r.pool is not None else {"mode": self.modes.get(r.rule)}),
                "decided": r.decided,
                "confirmed": r.confirmed,
                "not_confirmed": r.not_confirmed,
                "false_quarantines": r.false_quarantines,
                "undetermined": r.undetermined,
                "precision": r.precision,
                "gpu_hours": round(r.gpu_hours, 3),
                "node_hours": round(r.node_hours, 3),
                "median_time_to_repair_seconds": r.median_time_to_repair_seconds,
                "bases": dict(sorted(r.bases.items())),
            }

        return {
            "days": self.days,
            "rules": [record(r) for r in self.rules],
            "rule_pools": [record(r) for r in self.pools],
            "shadow": [
                {
                    "rule": s.rule,
                    "decisions": s.decisions,
                    "nodes": sorted(s.nodes),
                    "gpu_hours": round(s.gpu_hours, 3),
                    "tickets": s.tickets,
                    "confirmed": s.confirmed,
                    "not_confirmed": s.not_confirmed,
                    "pending": s.pending,
                    "precision": s.precision,
                }
                for s in self.shadow
            ],
            "shadow_decisions": [
                {
                    "id": d.decision.id,
                    "rule": d.decision.rule,
                    "node": d.decision.node,
                    "pool": d.decision.pool,
                    "opened_at": d.decision.opened_at.isoformat(),
                    "closed_at": d.decision.closed_at.isoformat() if d.decision.closed_at else None,
                    "would": list(d.decision.would),
                    "outcome": str(d.judgement.outcome) if d.judgement.outcome else None,
                    "basis": d.judgement.basis,
                }
                for d in self.decisions
            ],
            "overdue_tickets": [
                {
                    "ticket_id": t.ticket_id,
                    "provider": t.provider,
                    "node": t.node,
                    "status": t.status,
                    "overdue": t.targets,
                    "sent_at": t.sent_at.isoformat() if t.sent_at else None,
                    "escalated_at": t.escalated_at,
                }
                for t in self.overdue
            ],
        }


#: The most shadow decisions listed (newest first); the records count them all.
MAX_DECISIONS_SHOWN = 200


def trust_page(session: Session, *, now: datetime, days: int, ruleset: RuleSet | None = None) -> TrustPage:
    """The record of the incidents closed and the shadow decisions open in the last ``days`` days."""
    since = now - timedelta(days=days)
    rules, pools = oc.records(store.judged_since(session, since))
    judged = store.shadow_judged(session, since=since, now=now)
    modes: dict[str, str] = {r.name: r.mode for r in ruleset.rules} if ruleset is not None else {}
    decisions = [ShadowRow(d, j) for d, j in sorted(judged, key=lambda x: -x[0].id)[:MAX_DECISIONS_SHOWN]]
    return TrustPage(
        days=days,
        now=now,
        rules=rules,
        pools=pools,
        shadow=oc.shadow_records(judged, since=since, now=now),
        decisions=decisions,
        modes=modes,
        overdue=_overdue(session),
    )


def _overdue(session: Session) -> list[OverdueTicket]:
    tickets = store.overdue_tickets(session)
    names = (
        dict(
            session.execute(select(Node.id, Node.name).where(Node.id.in_({t.node_id for t in tickets}))).all()
        )
        if tickets
        else {}
    )
    return [
        OverdueTicket(
            ticket_id=t.id,
            provider=t.provider,
            node=names.get(t.node_id, ""),
            status=t.status,
            targets=store.overdue_on(t),
            sent_at=t.sent_at,
            escalated_at=dict(t.overdue_escalated or {}),
        )
        for t in tickets
    ]
