"""Repository for outcomes: each closed incident's outcome, operators' edits of it, shadow rules'
decisions, and the facts :mod:`healer.engine.outcomes` judges them on. Never commits.

Times are aware UTC and passed in (``now``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from healer.engine import outcomes as oc
from healer.errors import HealerError
from healer.model.states import ActionStatus, TicketStatus
from healer.store import nodes as repo
from healer.store.models import Gpu, Incident, Node, ShadowDecision, Ticket, Transition

#: ``outcome_by`` of an outcome healer derived (an operator's edit names the operator).
DERIVED = "healer"


class OutcomeError(HealerError):
    """An outcome edit that does not apply: no such incident, or the incident is still open."""


def gpu_counts(session: Session, node_ids: Iterable[int]) -> dict[int, int]:
    """node id → its GPUs known by UUID (dcgm-exporter's ``UUID`` label); absent: none known."""
    ids = sorted(set(node_ids))
    if not ids:
        return {}
    rows = session.execute(
        select(Gpu.node_id, func.count(Gpu.id)).where(Gpu.node_id.in_(ids)).group_by(Gpu.node_id)
    )
    return {node_id: int(n) for node_id, n in rows}


def stories(session: Session, incidents: Sequence[Incident]) -> dict[int, oc.IncidentStory]:
    """incident id → what happened in it (closed incidents only), in a constant number of queries."""
    closed = [i for i in incidents if i.closed_at is not None]
    ids = [i.id for i in closed]
    if not ids:
        return {}
    steps: dict[int, list[oc.Step]] = defaultdict(list)
    repeat: set[int] = set()
    for inc_id, at, to_state, actor, evidence in session.execute(
        select(
            Transition.incident_id, Transition.at, Transition.to_state, Transition.actor, Transition.evidence
        )
        .where(Transition.incident_id.in_(ids))
        .order_by(Transition.at, Transition.id)
    ):
        steps[inc_id].append(oc.Step(at=at, to_state=to_state, actor=actor))
        ladder = (evidence or {}).get("ladder") if isinstance(evidence, dict) else None
        if isinstance(ladder, dict) and ladder.get("repeat_parts"):
            repeat.add(inc_id)
    said: dict[int, list[str | None]] = defaultdict(list)
    for inc_id, resolution in session.execute(
        select(Ticket.incident_id, Ticket.resolution).where(
            Ticket.incident_id.in_(ids), Ticket.status == TicketStatus.RESOLVED
        )
    ):
        said[inc_id].append(resolution)
    nodes = {n.id: n for n in session.scalars(select(Node).where(Node.id.in_({i.node_id for i in closed})))}
    gpus = gpu_counts(session, nodes)
    out = {}
    for i in closed:
        assert i.closed_at is not None
        node = nodes.get(i.node_id)
        out[i.id] = oc.IncidentStory(
            rule=i.rule,
            pool=node.pool if node is not None else "default",
            opened_at=i.opened_at,
            closed_at=i.closed_at,
            close_reason=i.close_reason,
            steps=tuple(steps.get(i.id, ())),
            resolutions=tuple(said.get(i.id, ())),
            validation=str(i.validation.get("status")) if i.validation else None,
            repeat_part=i.id in repeat,
            gpus=i.gpus if i.gpus is not None else gpus.get(i.node_id, 0),
        )
    return out


def settle(
    session: Session, incident: Incident, *, now: datetime, gpus: int | None = None
) -> oc.Judgement | None:
    """Derive and store the outcome of ``incident``, just closed (its transitions recorded). An
    outcome an operator set is kept. ``gpus``: the node's GPU capacity as read now (kept for its
    GPU-hours). Returns the judgement (None when the incident is open)."""
    if incident.closed_at is None:
        return None
    if gpus is not None:
        incident.gpus = gpus
    story = stories(session, [incident]).get(incident.id)
    if story is None:
        return None
    judgement = oc.judge(story)
    if incident.outcome_by not in (None, DERIVED):
        return judgement
    incident.outcome = str(judgement.outcome) if judgement.outcome is not None else None
    incident.outcome_basis = judgement.basis
    incident.outcome_at = now
    incident.outcome_by = DERIVED
    return judgement


def set_outcome(
    session: Session,
    *,
    incident_id: int,
    outcome: oc.Outcome | None,
    actor: str,
    now: datetime,
    reason: str = "",
) -> Incident:
    """An operator sets a closed incident's outcome (None: back to what healer derives), with an
    audit row (kind ``outcome``: from, to, reason).

    Raises:
        OutcomeError: no such incident, or it is still open (it has no outcome yet).
    """
    incident = session.get(Incident, incident_id)
    if incident is None:
        raise OutcomeError(f"incident {incident_id} not found")
    if incident.closed_at is None:
        raise OutcomeError(f"incident {incident_id} is still open: its outcome is known once it closes")
    before = {"outcome": incident.outcome, "basis": incident.outcome_basis, "by": incident.outcome_by}
    if outcome is None:
        incident.outcome_by = None
        settle(session, incident, now=now)
    else:
        incident.outcome = str(outcome)
        incident.outcome_basis = "operator"
        incident.outcome_at = now
        incident.outcome_by = actor
    node = session.get(Node, incident.node_id)
    repo.record_action(
        session,
        kind="outcome",
        status=ActionStatus.SUCCEEDED,
        actor=actor,
        now=now,
        node=node,
        incident=incident,
        detail={
            "from": before,
            "to": {"outcome": incident.outcome, "basis": incident.outcome_basis, "by": incident.outcome_by},
            "reason": reason,
        },
    )
    return incident


def judged_since(session: Session, since: datetime) -> list[oc.Judged]:
    """The incidents closed at or after ``since`` with their recorded outcome (derived now for one
    closed before outcomes were recorded)."""
    incidents = list(
        session.scalars(select(Incident).where(Incident.closed_at >= since).order_by(Incident.id))
    )
    told = stories(session, incidents)
    out = []
    for i in incidents:
        story = told.get(i.id)
        if story is None:
            continue
        if i.outcome_by is None:
            j = oc.judge(story)
            out.append(oc.Judged(story, j.outcome, j.basis))
        else:
            outcome = oc.Outcome(i.outcome) if i.outcome else None
            out.append(oc.Judged(story, outcome, i.outcome_basis or ""))
    return out


# --- shadow rules -----------------------------------------------------------------------------------


def open_shadow(session: Session) -> dict[tuple[str, str], ShadowDecision]:
    """(rule, node) → the shadow decision still open there."""
    rows = session.scalars(select(ShadowDecision).where(ShadowDecision.closed_at.is_(None)))
    return {(r.rule, r.node_name): r for r in rows}


def record_shadow(
    session: Session,
    *,
    firing: Mapping[str, Mapping[str, dict[str, Any]]],
    would: Mapping[str, Sequence[str]],
    evaluated: Iterable[str],
    now: datetime,
    actor: str,
    capacity: Callable[[str], int | None] | None = None,
) -> tuple[list[ShadowDecision], list[ShadowDecision]]:
    """Open a decision for each (shadow rule, node) newly firing, with a ``dry_run`` audit row per
    action it would take; close the open ones of ``evaluated`` rules no longer firing on their
    node. A rule not evaluated this tick (not due, or its query failed) keeps its decisions as they
    are: no data is not recovery.

    ``firing``: rule → node → evidence of its first firing finding there. ``would``: rule → the
    actions it would take. ``capacity``: a node's ``nvidia.com/gpu`` capacity (None: unknown; the
    GPUs healer knows by UUID count then), read for new decisions only. Returns (opened, closed).
    """
    evaluated = set(evaluated)
    current = open_shadow(session)
    closed = []
    for (rule, name), row in current.items():
        if rule in evaluated and name not in firing.get(rule, {}):
            row.closed_at = now
            closed.append(row)
    names = {n for per_node in firing.values() for n in per_node}
    nodes = (
        {n.name: n for n in session.scalars(select(Node).where(Node.name.in_(sorted(names))))}
        if names
        else {}
    )
    gpus = gpu_counts(session, (n.id for n in nodes.values()))
    opened = []
    for rule in sorted(firing):
        for node_name in sorted(firing[rule]):
            if (rule, node_name) in current:
                continue
            known = nodes.get(node_name)
            read = capacity(node_name) if capacity is not None else None
            row = ShadowDecision(
                rule=rule,
                node_name=node_name,
                pool=known.pool if known is not None else "default",
                gpus=read if read is not None else (gpus.get(known.id, 0) if known is not None else 0),
                would=list(would.get(rule, ())),
                evidence=firing[rule][node_name],
                opened_at=now,
                closed_at=None,
            )
            session.add(row)
            opened.append(row)
            for kind in row.would:
                repo.record_action(
                    session,
                    kind=kind,
                    status=ActionStatus.DRY_RUN,
                    actor=actor,
                    now=now,
                    node=known,
                    target=node_name,
                    detail={
                        "rule": rule,
                        "shadow": True,
                        "why": f"shadow rule {rule} would {kind} {node_name}",
                    },
                )
    return opened, closed


def shadow_judged(
    session: Session, *, since: datetime, now: datetime
) -> list[tuple[oc.ShadowDecision, oc.Judgement]]:
    """The shadow decisions open at some time between ``since`` and ``now``, each with its
    outcome from what happened to its node (acting rules' incidents on it)."""
    rows = list(
        session.scalars(
            select(ShadowDecision)
            .where((ShadowDecision.closed_at.is_(None)) | (ShadowDecision.closed_at >= since))
            .order_by(ShadowDecision.id)
        )
    )
    if not rows:
        return []
    names = sorted({r.node_name for r in rows})
    incidents = list(
        session.execute(
            select(Node.name, Incident)
            .join(Incident, Incident.node_id == Node.id)
            .where(Node.name.in_(names))
        )
    )
    told = stories(session, [i for _, i in incidents if i.outcome_by is None])
    by_node: dict[str, list[oc.NodeIncident]] = defaultdict(list)
    for name, i in incidents:
        basis: str | None
        if i.outcome_by is None and i.id in told:
            j = oc.judge(told[i.id])
            outcome, basis = j.outcome, j.basis or None
        else:
            outcome = oc.Outcome(i.outcome) if i.outcome else None
            basis = i.outcome_basis
        by_node[name].append(oc.NodeIncident(i.id, i.opened_at, i.closed_at, outcome, basis))
    out = []
    for r in rows:
        d = oc.ShadowDecision(
            id=r.id,
            rule=r.rule,
            node=r.node_name,
            pool=r.pool,
            opened_at=r.opened_at,
            closed_at=r.closed_at,
            would=tuple(r.would or ()),
            gpus=r.gpus,
        )
        out.append((d, oc.judge_shadow(d, by_node.get(r.node_name, []), now=now)))
    return out


#: Tickets still waiting on the provider (a missed target is still overdue).
_OPEN_TICKETS = (
    TicketStatus.SENT,
    TicketStatus.ACKNOWLEDGED,
    TicketStatus.IN_PROGRESS,
    TicketStatus.NEEDS_INFO,
)


def overdue_tickets(session: Session) -> list[Ticket]:
    """Open tickets that missed a repair target (``overdue_escalated`` names it; the outbox job
    escalates a target the moment it is missed), oldest first."""
    rows = session.scalars(
        select(Ticket)
        .where(Ticket.status.in_([str(s) for s in _OPEN_TICKETS]), Ticket.overdue_escalated.is_not(None))
        .order_by(Ticket.id)
    )
    return [t for t in rows if overdue_on(t)]


def overdue_on(ticket: Ticket) -> list[str]:
    """The targets ``ticket`` is overdue on now: ``repair`` once missed (until resolved), ``ack``
    once missed until it is acknowledged; none once the ticket is no longer open."""
    missed = ticket.overdue_escalated or {}
    if ticket.status not in _OPEN_TICKETS:
        return []
    return [t for t in ("ack", "repair") if t in missed and not (t == "ack" and ticket.acknowledged_at)]


def overdue_counts(session: Session) -> dict[tuple[str, str], int]:
    """(provider, target) → open tickets overdue on it (``ack``: not acknowledged yet;
    ``repair``: not resolved)."""
    out: dict[tuple[str, str], int] = defaultdict(int)
    for t in overdue_tickets(session):
        for target in overdue_on(t):
            out[t.provider, target] += 1
    return dict(out)
