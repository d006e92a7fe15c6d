"""Observe: one node's facts for the lifecycle, from the database and the node read once.

:func:`read` is the reconcile's one read of the node from the API server; :func:`observe` joins it
with the database (the node row, its open incident and remediation memory, its ticket's status,
the notifications already sent) and this tick's findings into :class:`~healer.engine.lifecycle.NodeFacts`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta

from pydantic import TypeAdapter, ValidationError
from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from healer.actions.base import NodeActions
from healer.controller import sticky_values
from healer.engine import lifecycle as lc
from healer.errors import KubernetesError, KubernetesNotFound
from healer.model.drain import DrainOptions, DrainReport
from healer.model.findings import Finding, TickFindings
from healer.model.node import DEFAULT_POOL, NodeView, OwnershipKeys, pool_of
from healer.model.repair import RepairResult, result_key
from healer.model.states import FindingState, NodeState, TicketStatus
from healer.ruleset.schema import DrainAction, LadderStep
from healer.store import nodes as repo
from healer.store.evaluations import finding_from_row, open_findings
from healer.store.models import Action, Incident, Node, Ticket, Transition
from healer.store.models import Finding as FindingRow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Seen:
    """The node as the API server answered this reconcile: its view, gone (404), or the error."""

    view: NodeView | None
    deleted: bool = False
    error: str | None = None


def read(actions: NodeActions, name: str) -> Seen:
    """One GET of the node; a 404 is a fact (deleted), another failure an error to retry later."""
    try:
        return Seen(actions.read_node(name))
    except KubernetesNotFound:
        return Seen(None, deleted=True)
    except KubernetesError as exc:
        return Seen(None, error=str(exc))


#: Node reads a pass keeps in flight at once (independent GETs; the API server serves them in
#: parallel, and the client's connection pool holds 5 per CPU).
READS_IN_FLIGHT = 8


def read_all(actions: NodeActions, names: Sequence[str]) -> dict[str, Seen]:
    """Every node in ``names``, in that order: as the Node watch holds it
    (:meth:`~healer.actions.base.NodeActions.watched_nodes`), else :func:`read`, up to
    :data:`READS_IN_FLIGHT` GETs at a time (a pass waits for the slowest few reads, not for the
    sum of them). With a fresh watch a burst of newly firing nodes is planned without a GET each,
    so their cordons go out that much sooner; a node the store does not hold (deleted, or not yet
    heard of) is read, so a 404 is still a fact."""
    watched = actions.watched_nodes(names)
    missing = [name for name in names if name not in watched]
    got: dict[str, Seen] = {}
    if len(missing) < 2:
        got = {name: read(actions, name) for name in missing}
    else:
        with ThreadPoolExecutor(max_workers=READS_IN_FLIGHT, thread_name_prefix="healer-read") as pool:
            got = dict(zip(missing, pool.map(lambda name: read(actions, name), missing), strict=True))
    return {name: Seen(watched[name]) if name in watched else got[name] for name in names}


@dataclass(frozen=True)
class Labels:
    """Where healer reads its per-node switches: the opt-out and pool labels, the annotation domain."""

    domain: str
    opt_out_label: str
    pool_label: str
    pool_fallback_labels: tuple[str, ...] = ()
    #: (capacity rule, its burst nodes' labels): nodes no health rule quarantines or tickets.
    burst_nodes: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()

    def pool(self, view: NodeView | None) -> str:
        """The node's pool (:func:`~healer.model.node.pool_of`); ``default`` when not read."""
        if view is None:
            return DEFAULT_POOL
        return pool_of(view.labels, view.gpus, pool_labels=(self.pool_label, *self.pool_fallback_labels))

    def burst_rule(self, view: NodeView | None) -> str:
        """The capacity rule whose burst node ``view`` is ("" when none, or not read)."""
        if view is None:
            return ""
        return next(
            (
                rule
                for rule, selector in self.burst_nodes
                if all(view.labels.get(k) == v for k, v in selector)
            ),
            "",
        )

    def opted_out(self, view: NodeView | None) -> bool:
        return view is not None and view.labels.get(self.opt_out_label, "").lower() == "true"

    @property
    def taint_key(self) -> str:
        """healer's taint key, ``<domain>/quarantined``."""
        return f"{self.domain}/quarantined"

    def owned(self, view: NodeView | None) -> bool:
        return view is not None and OwnershipKeys.for_domain(self.domain).cordoned_by in view.annotations


@dataclass
class Rows:
    """The node's row and open incident as the current transaction holds them (read or written by
    an earlier stage of the same transaction, so a later stage does not SELECT them again), and the
    incident's ticket status once read there (``ticket_read``)."""

    node: Node
    incident: Incident | None
    ticket: TicketStatus | None = None
    ticket_read: bool = False


@dataclass
class Observation:
    """One node's row, open incident and lifecycle facts, read in the reconcile's transaction."""

    node: Node
    incident: Incident | None
    facts: lc.NodeFacts
    rows: Rows

    @property
    def drain_options(self) -> DrainOptions:
        """The options the drain started with (a row written before they had their own shape holds
        the rule's ``drain`` action)."""
        stored = (self.incident.drain_options if self.incident else None) or {}
        if "timeout_seconds" in stored:
            return DrainOptions(**stored)
        return DrainAction.model_validate(stored).options()


def observe(
    session: Session,
    name: str,
    seen: Seen,
    *,
    labels: Labels,
    findings: TickFindings | None,
    now: datetime,
    drain_due: bool = False,
    drain: DrainReport | None = None,
    sticky_rules: frozenset[str] = frozenset(),
    rows: Rows | None = None,
    attached: set[int] | None = None,
    notices: bool = True,
    skip_rules: frozenset[str] = frozenset(),
) -> Observation:
    """The node's facts now. A non-healthy node without an open incident gets one (its record needs
    one); the node's unattached findings are hung on the open incident. Findings of ``sticky_rules``
    still at their value seen at repair time are left out (:mod:`healer.engine.sticky`).

    ``rows``: the node's row and open incident as this transaction already holds them (not read
    again; the incident's ticket status once read is kept there). ``attached``: the incidents whose
    findings this pass has hung on them already (not updated again; the ids added here are added).
    ``notices``: whether the notifications already sent are read (only :func:`lifecycle.notices
    <healer.engine.lifecycle.notices>` needs them). ``skip_rules``: rules whose findings are
    never hung on an incident (shadow rules).
    """
    view = seen.view
    if rows is None:
        rows = Rows(*repo.node_and_open_incident(session, name, now=now, pool=labels.pool(view)))
    node = rows.node
    if view is not None and node.pool != (pool := labels.pool(view)):
        node.pool = pool
    incident = rows.incident
    if incident is None and node.state not in (NodeState.HEALTHY, NodeState.UNKNOWN):
        incident = rows.incident = repo.new_incident(
            session, node, now=now, summary=f"node {node.name}: {node.state}"
        )
        rows.ticket, rows.ticket_read = None, True
    if incident is not None and (attached is None or incident.id not in attached):
        repo.attach_findings(session, node, incident, skip_rules=skip_rules)
        if attached is not None:
            attached.add(incident.id)
    firing: tuple[Finding, ...] = ()
    pending: tuple[Finding, ...] = ()
    recorded: tuple[Finding, ...] = ()
    if findings is not None:
        firing, pending = sticky_values.current(session, node, incident, findings, sticky_rules)
    elif node.state == NodeState.DRAINING:  # the drain pass: a ladder starts on the recorded ones
        stored = open_findings(session, node=node.name)
        recorded = tuple(f for f in map(finding_from_row, stored) if f.state == FindingState.FIRING)
    facts = lc.NodeFacts(
        name=node.name,
        state=NodeState(node.state),
        incident=_incident_facts(session, rows),
        firing=firing,
        pending=pending,
        unknown=bool(findings and name in findings.unknown),
        frozen_rules=findings.frozen_rules if findings else frozenset(),
        view=view,
        deleted=seen.deleted,
        drain_due=drain_due,
        drain=drain,
        notified=_notified(session, node) if notices else frozenset(),
        owned=labels.owned(view),
        repair_result=RepairResult.parse(view.annotations.get(result_key(labels.domain))) if view else None,
        repeat_parts=(
            _repeat_parts(session, node, incident, firing or recorded, now)
            if _ladder_may_start(node)
            else frozenset()
        ),
        recorded_firing=recorded,
        taint_missing=view is not None and not any(t[0] == labels.taint_key for t in view.taints),
        opted_out=labels.opted_out(view),
    )
    return Observation(node=node, incident=incident, facts=facts, rows=rows)


# Statements run once per node step, built once (their parameters bound per call).
_TICKET_STATUS = (
    select(Ticket.status)
    .where(Ticket.incident_id == bindparam("incident_id"))
    .order_by(Ticket.id.desc())
    .limit(1)
)
_NOTIFIED = select(Action.detail).where(Action.node_id == bindparam("node_id"), Action.kind == "notify")


def _incident_facts(session: Session, rows: Rows) -> lc.IncidentFacts | None:
    incident = rows.incident
    if incident is None:
        return None
    if not rows.ticket_read:
        status = session.scalar(_TICKET_STATUS, {"incident_id": incident.id})
        rows.ticket, rows.ticket_read = (TicketStatus(status) if status else None), True
    return incident_facts(incident, ticket=rows.ticket)


def incident_facts(incident: Incident, *, ticket: TicketStatus | None = None) -> lc.IncidentFacts:
    """The incident row's remediation memory as the lifecycle reads it."""
    return lc.IncidentFacts(
        id=incident.id,
        rule=incident.rule,
        cordoned_by_healer=bool(incident.cordoned_by_healer),
        expect_unschedulable=incident.expect_unschedulable,
        drain_started_at=incident.drain_started_at,
        blocked_step=incident.blocked_step,
        clear_since=incident.clear_since,
        ticket=ticket,
        ladder=ladder_steps(incident.ladder),
        ladder_index=incident.ladder_index,
        ladder_started_at=incident.ladder_started_at,
        repair_nonce=incident.repair_nonce,
        validation=incident.validation,
        release_requested=incident.release_requested,
        domain_id=incident.domain_incident_id,
        capture=incident.capture,
    )


_STEPS: TypeAdapter[list[LadderStep]] = TypeAdapter(list[LadderStep])


def ladder_steps(stored: list[object] | None) -> tuple[LadderStep, ...]:
    """The incident's ladder as the rule schema's steps (a step no longer valid ends it there)."""
    if not stored:
        return ()
    try:
        return tuple(_STEPS.validate_python(stored))
    except ValidationError:
        log.warning("an incident's stored ladder no longer validates: treated as exhausted")
        return ()


def _ladder_may_start(node: Node) -> bool:
    return node.state in (NodeState.QUARANTINED, NodeState.DRAINING)


#: How far back a repaired part's failure counts as a repeat (days), as tickets' repeat window.
REPEAT_WINDOW = timedelta(days=30)


def _repeat_parts(
    session: Session, node: Node, incident: Incident | None, firing: tuple[Finding, ...], now: datetime
) -> frozenset[str]:
    """GPU UUIDs among ``firing`` that failed before, on any node, in an incident repaired (moved to
    ``repaired``) within :data:`REPEAT_WINDOW`: the parts ledger's repeat offenders, which go
    straight to replacement. Read from the evidence (series labels) of those incidents' steps."""
    uuids = {u for f in firing if (u := f.labels.get("UUID"))}
    if not uuids:
        return frozenset()
    repaired = select(Transition.incident_id).where(
        Transition.to_state == NodeState.REPAIRED.value, Transition.at >= now - REPEAT_WINDOW
    )
    query = select(Transition.evidence).where(
        Transition.incident_id.in_(repaired), Transition.to_state == NodeState.QUARANTINED.value
    )
    if incident is not None:
        query = query.where(Transition.incident_id != incident.id)
    seen: set[str] = set()
    for evidence in session.scalars(query):
        for item in (evidence or {}).get("findings") or []:
            uuid = ((item or {}).get("labels") or {}).get("UUID")
            if uuid in uuids:
                seen.add(uuid)
    return frozenset(seen)


def _notified(session: Session, node: Node) -> frozenset[str]:
    details = session.scalars(_NOTIFIED, {"node_id": node.id}).all()
    return frozenset(str(d["key"]) for d in details if d and d.get("key"))


def recorded_findings(session: Session, node: Node, incident: Incident) -> list[Finding]:
    """The incident's findings as detection recorded them (for a ticket requested outside a tick)."""
    rows = session.scalars(
        select(FindingRow).where(
            (FindingRow.incident_id == incident.id)
            | ((FindingRow.node_name == node.name) & FindingRow.resolved_at.is_(None))
        )
    ).all()
    return [finding_from_row(r) for r in rows if r.fired_at is not None]
