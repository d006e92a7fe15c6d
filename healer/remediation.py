"""The remediation executor: findings → lifecycle → safety → NodeActions → the record.

Two jobs, each called by the scheduler with ``now`` (only the leader calls them):

* :func:`remediate` (every tick, after evaluation): for each node with findings or not healthy,
  read it fresh from the API server, decide its next step (:mod:`healer.engine.lifecycle`), judge
  it (:mod:`healer.engine.safety`), run its effects through :class:`~healer.actions.base.NodeActions`
  and record the transition, every action (refused ones too) and the ticket request.
* :func:`advance_drains` (every ``scheduler.drain_interval_seconds``): one ``kubectl drain`` step
  per draining node; done → ``awaiting_repair`` (+ ticket), past the deadline → ``blocked`` with
  the pods and PodDisruptionBudgets named and a ``HealerDrainBlocked`` Event.

I/O happens only here, at the edges. Each node step is short: a transaction to load, the
Kubernetes calls with no transaction open, then one transaction that records the transition, the
actions and the ticket (the outbox row is written in the same transaction, so a ticket exists if
and only if its step was recorded). The Kubernetes effects run before the record, and are
idempotent, so a crash in between repeats them harmlessly on the next tick instead of leaving the
database claiming a cordon that never happened (which would read as a human uncordon).

Everything needed to resume lives in the database (state, incident, drain start and options,
ownership, recovery clock) and on the node (ownership annotations), so a new process picks up a
drain where the old one left it (Cluster API MachineHealthCheck measures from persisted times for
the same reason).

Errors: a :class:`~healer.errors.KubernetesError` on one node is recorded as a failed action and
the node is retried next tick; ``KubernetesNotFound`` means the node was deleted: its incident
closes and its budget slot frees. Database errors propagate (the tick fails and is retried whole).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from healer.actions.base import DrainReport, NodeActions, NodeView, Ownership
from healer.config import Settings
from healer.engine import lifecycle as lc
from healer.engine import safety
from healer.engine.findings import Finding, TickFindings
from healer.engine.states import OUT_OF_SERVICE, ActionStatus, NodeState, TicketStatus
from healer.errors import KubernetesError, KubernetesNotFound
from healer.ruleset.schema import DrainAction, RuleSet
from healer.store import nodes as repo
from healer.store.evaluations import finding_from_row
from healer.store.models import Action, Incident, Node, Ticket
from healer.store.models import Finding as FindingRow

log = logging.getLogger(__name__)

#: Steps one node may take in one tick (healthy → suspect → quarantined → draining at most).
MAX_STEPS_PER_TICK = 4


@dataclass(frozen=True)
class NodeOutcome:
    """What happened to one node in one job run.

    ``to_state`` is None when the node stayed; ``refused`` is the safety reason when a step was
    refused; ``error`` the Kubernetes error when an effect failed.
    """

    node: str
    from_state: str
    to_state: str | None
    step: str = ""
    refused: str | None = None
    error: str | None = None


@dataclass
class RemediationResult:
    """One :func:`remediate` (or :func:`advance_drains`) run: per-node outcomes and the switches."""

    at: datetime
    outcomes: list[NodeOutcome] = field(default_factory=list)
    paused: bool = False
    breaker_tripped: bool = False
    breaker: safety.BreakerVerdict | None = None
    held: list[str] = field(default_factory=list)  # nodes the breaker held back (all so far)

    def states(self) -> dict[str, str]:
        """node → the state it ended in (nodes that moved)."""
        out: dict[str, str] = {}
        for o in self.outcomes:
            if o.to_state is not None:
                out[o.node] = o.to_state
        return out

    def refused(self) -> dict[str, str]:
        """node → the last refusal reason (``budget``, ``breaker``, ``paused`` ...)."""
        return {o.node: o.refused for o in self.outcomes if o.refused}


# --- reading the record ---------------------------------------------------------------------------


def _incident_facts(session: Session, incident: Incident | None) -> lc.IncidentFacts | None:
    if incident is None:
        return None
    status = session.scalar(
        select(Ticket.status).where(Ticket.incident_id == incident.id).order_by(Ticket.id.desc()).limit(1)
    )
    return lc.IncidentFacts(
        id=incident.id,
        rule=incident.rule,
        cordoned_by_healer=bool(incident.cordoned_by_healer),
        expect_unschedulable=incident.expect_unschedulable,
        drain_started_at=incident.drain_started_at,
        blocked_step=incident.blocked_step,
        clear_since=incident.clear_since,
        ticket=TicketStatus(status) if status else None,
    )


def _notified(session: Session, node: Node) -> frozenset[str]:
    details = session.scalars(
        select(Action.detail).where(Action.node_id == node.id, Action.kind == "notify")
    ).all()
    return frozenset(str(d["key"]) for d in details if d and d.get("key"))


def _owned(view: NodeView | None, domain: str) -> bool:
    return view is not None and f"{domain}/cordoned-by" in view.annotations


def _recorded_findings(session: Session, node: Node, incident: Incident) -> list[Finding]:
    """The incident's findings as detection recorded them (for a ticket requested outside a tick)."""
    rows = session.scalars(
        select(FindingRow).where(
            (FindingRow.incident_id == incident.id)
            | ((FindingRow.node_name == node.name) & FindingRow.resolved_at.is_(None))
        )
    ).all()
    return [finding_from_row(r) for r in rows if r.fired_at is not None]


# --- the executor ---------------------------------------------------------------------------------


class _Executor:
    """Shared by both jobs: runs one node's steps and records them."""

    def __init__(
        self,
        *,
        rules: RuleSet,
        actions: NodeActions,
        session_factory: sessionmaker[Session],
        settings: Settings,
        now: datetime,
        actor: str,
        recovery_hold_seconds: float,
        findings: TickFindings | None,
    ) -> None:
        self.rules = rules
        self.actions = actions
        self.sessions = session_factory
        self.settings = settings
        self.now = now
        self.actor = actor
        self.findings = findings
        self.ctx = lc.Context(rules=rules, now=now, recovery_hold_seconds=recovery_hold_seconds)
        self.domain = settings.kubernetes.domain
        self.done_status = ActionStatus.DRY_RUN if settings.safety.dry_run else ActionStatus.SUCCEEDED
        # The dry-run recorder writes its own rows for cordon, taint ...; notify rows stay ours
        # (they de-duplicate notifications).
        self.recorder_writes = settings.safety.dry_run
        self.held: list[str] = []

    # -- node facts --

    def read(self, name: str) -> tuple[NodeView | None, bool, str | None]:
        """(view, deleted, error) for ``name``, read fresh from the API server."""
        try:
            return self.actions.read_node(name), False, None
        except KubernetesNotFound:
            return None, True, None
        except KubernetesError as exc:
            log.warning("cannot read node %s: %s", name, exc)
            return None, False, str(exc)

    def facts(
        self,
        session: Session,
        node: Node,
        view: NodeView | None,
        *,
        deleted: bool,
        drain: DrainReport | None = None,
    ) -> lc.NodeFacts:
        incident = repo.open_incident(session, node)
        if incident is None and node.state not in (NodeState.HEALTHY, NodeState.UNKNOWN):
            # A non-healthy node always has an incident to hang its record on.
            incident = repo.ensure_incident(
                session, node, now=self.now, summary=f"node {node.name}: {node.state}"
            )
        if incident is not None:
            self._attach_findings(session, node, incident)
        facts_incident = _incident_facts(session, incident)
        if self.settings.safety.dry_run and view is not None and facts_incident is not None:
            # Dry-run never changes the node: read it as healer would have left it, or the missing
            # cordon would look like a human uncordon.
            expected = facts_incident.expect_unschedulable
            if expected is not None:
                view = replace(view, unschedulable=expected)
        tick = self.findings
        return lc.NodeFacts(
            name=node.name,
            state=NodeState(node.state),
            incident=facts_incident,
            firing=tuple(tick.firing.get(node.name, ())) if tick else (),
            pending=tuple(tick.pending.get(node.name, ())) if tick else (),
            unknown=bool(tick and node.name in tick.unknown),
            frozen_rules=tick.frozen_rules if tick else frozenset(),
            view=view,
            deleted=deleted,
            drain=drain,
            notified=_notified(session, node),
            owned=_owned(view, self.domain),
        )

    def _attach_findings(self, session: Session, node: Node, incident: Incident) -> None:
        session.execute(
            update(FindingRow)
            .where(
                FindingRow.node_name == node.name,
                FindingRow.incident_id.is_(None),
                FindingRow.resolved_at.is_(None),
            )
            .values(incident_id=incident.id)
        )

    def request(self, node: Node, view: NodeView | None, step: lc.Step) -> safety.Request:
        opt_out = self.settings.kubernetes.opt_out_label
        return safety.Request(
            node=node.name,
            kind=step.kind,
            pool=node.pool,
            opted_out=view is not None and view.labels.get(opt_out, "").lower() == "true",
            already_out=step.already_out or node.state in OUT_OF_SERVICE,
        )

    # -- effects --

    def run_effects(
        self, name: str, step: lc.Step, incident_id: int | None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """Run the step's Kubernetes effects in order; stop at the first error.

        Returns the done effects as action records and the error (None when all ran). Raises
        ``KubernetesNotFound`` (the node is gone).
        """
        done: list[dict[str, Any]] = []
        for effect in step.effects:
            record: dict[str, Any] | None = None
            try:
                match effect:
                    case lc.Cordon(reason=reason):
                        ownership = Ownership(
                            incident_id=incident_id or 0, reason=reason, at=self.now, actor=self.actor
                        )
                        self.actions.cordon(name, ownership)
                        record = {"kind": "cordon", "detail": {"reason": reason}}
                    case lc.Taint(value=value, effect=taint_effect):
                        self.actions.taint(name, value=value, effect=taint_effect)
                        record = {"kind": "taint", "detail": {"value": value, "effect": taint_effect}}
                    case lc.SetCondition(healthy=healthy, reason=reason, message=message):
                        self.actions.set_condition(
                            name, healthy=healthy, reason=reason, message=message, now=self.now
                        )
                        record = {"kind": "condition", "detail": {"healthy": healthy, "reason": reason}}
                    case lc.Event(reason=reason, message=message, warning=warning, key=key):
                        self.actions.event(name, reason=reason, message=message, warning=warning)
                        detail: dict[str, Any] = {"reason": reason, "message": message}
                        if key:
                            detail["key"] = key
                        record = {"kind": "notify" if key else "event", "detail": detail}
                    case lc.Release():
                        self.actions.release(name)
                        record = {"kind": "release", "detail": {}}
                    case lc.StartDrain() | lc.RequestTicket():
                        pass  # recorded in the step's transaction
            except KubernetesNotFound:
                raise
            except KubernetesError as exc:
                kind = type(effect).__name__.lower()
                done.append({"kind": kind, "status": ActionStatus.FAILED, "error": str(exc), "detail": {}})
                return done, str(exc)
            if record is not None:
                done.append(record)
        return done, None

    # -- recording --

    def record_step(
        self,
        session: Session,
        node: Node,
        step: lc.Step,
        done: list[dict[str, Any]],
        *,
        firing: list[Finding],
    ) -> Incident | None:
        """Record the step: incident changes, memory, transition, actions, drain start, tickets."""
        incident = repo.open_incident(session, node)
        if step.new_incident and incident is not None:
            repo.close_incident(session, node, now=self.now, reason=step.close_incident or "superseded")
            session.flush()
            incident = None
        if incident is None and (step.open_incident or step.new_incident):
            incident = repo.ensure_incident(session, node, now=self.now, summary=step.reason)
            self._attach_findings(session, node, incident)
        if incident is not None:
            self._remember(incident, step)
        for effect in step.effects:
            if isinstance(effect, lc.StartDrain) and incident is not None:
                incident.drain_started_at = self.now
                incident.drain_options = effect.options.model_dump(mode="json")
                repo.record_action(
                    session,
                    kind="drain",
                    status=ActionStatus.RUNNING,
                    actor=self.actor,
                    now=self.now,
                    node=node,
                    incident=incident,
                    detail={"rule": effect.rule, "options": incident.drain_options},
                )
        self._record_effects(session, node, incident, done, step)
        tickets = [e for e in step.effects if isinstance(e, lc.RequestTicket)]
        if tickets and incident is not None:
            from healer.tickets.outbox import request_ticket

            evidence = firing or _recorded_findings(session, node, incident)
            for t in tickets:
                request_ticket(
                    session,
                    incident=incident,
                    node=node,
                    provider=t.provider,
                    template=t.template,
                    findings=evidence,
                    now=self.now,
                )
        if step.to is not None:
            repo.transition(
                session,
                node,
                step.to,
                now=self.now,
                actor=self.actor,
                reason=step.reason,
                evidence=step.evidence,
                incident=incident,
            )
        if step.close_incident is not None and not step.new_incident:
            repo.close_incident(session, node, now=self.now, reason=step.close_incident)
        return incident

    def _remember(self, incident: Incident, step: lc.Step) -> None:
        m = step.memory
        if m.rule is not None:
            incident.rule = m.rule
        if m.cordoned_by_healer is not None:
            incident.cordoned_by_healer = m.cordoned_by_healer
        if m.forget_hold:
            incident.expect_unschedulable = None
        elif m.expect_unschedulable is not None:
            incident.expect_unschedulable = m.expect_unschedulable
        if m.blocked_step is not None:
            incident.blocked_step = m.blocked_step
            incident.blocked_reason = step.reason
        if m.reset_clear:
            incident.clear_since = None
        elif m.clear_since is not None:
            incident.clear_since = m.clear_since
        if step.to is not None and step.to != NodeState.BLOCKED and m.blocked_step is None:
            incident.blocked_step = None
            incident.blocked_reason = None

    def record_refusal(self, session: Session, node: Node, step: lc.Step, decision: safety.Decision) -> bool:
        """Record a refused step once per reason while the node stays in its state; a refusal that
        blocks moves the node to ``blocked``. Returns whether the node moved."""
        incident = repo.open_incident(session, node)
        reason = str(decision.reason)
        seen = session.scalar(
            select(Action.id)
            .where(
                Action.node_id == node.id,
                Action.kind == str(step.kind),
                Action.status == ActionStatus.REFUSED,
                Action.error == reason,
                Action.created_at >= node.state_since,
            )
            .limit(1)
        )
        if seen is None:
            repo.record_action(
                session,
                kind=str(step.kind),
                status=ActionStatus.REFUSED,
                actor=self.actor,
                now=self.now,
                node=node,
                incident=incident,
                error=reason,
                detail={"message": decision.message, "wanted": step.to and str(step.to), "step": step.row},
            )
        if not decision.blocks:
            return False
        if incident is not None:
            if incident.blocked_step is None:
                incident.blocked_step = "quarantine"
            incident.blocked_reason = f"{reason}: {decision.message}"
        if node.state == NodeState.BLOCKED:
            return False
        repo.transition(
            session,
            node,
            NodeState.BLOCKED,
            now=self.now,
            actor=self.actor,
            reason=f"{reason}: {decision.message}",
            evidence=step.evidence,
            incident=incident,
        )
        return True

    # -- one node --

    def run_node(
        self,
        name: str,
        state: safety.SafetyState,
        *,
        view: NodeView | None,
        deleted: bool,
        drain: DrainReport | None = None,
        max_steps: int = MAX_STEPS_PER_TICK,
    ) -> tuple[safety.SafetyState, NodeOutcome]:
        """Take up to ``max_steps`` steps on ``name``; ``view`` is its fresh read (re-read between
        steps, before anything destructive)."""
        with self.sessions() as session, session.begin():
            node = repo.get_or_create_node(session, name, now=self.now, pool=self._pool(view))
            first_state = node.state
        outcome = NodeOutcome(name, first_state, None)
        firing = list(self.findings.firing.get(name, ())) if self.findings else []
        for i in range(max_steps):
            if i > 0:
                view, deleted, error = self.read(name)
                if error:
                    return state, replace(outcome, error=error)
            with self.sessions() as session, session.begin():
                node = repo.get_or_create_node(session, name, now=self.now)
                if view is not None:
                    node.pool = self._pool(view)
                facts = self.facts(session, node, view, deleted=deleted, drain=drain if i == 0 else None)
                notices = lc.notices(facts, self.ctx) if i == 0 else []
                step = lc.decide(facts, self.ctx)
                refusal: safety.Decision | None = None
                if step is not None:
                    decision, state = safety.judge(self.request(node, view, step), state)
                    if not decision.approved:
                        refusal = decision
                        moved = self.record_refusal(session, node, step, decision)
                        if decision.reason == safety.Refusal.BREAKER and name not in self.held:
                            self.held.append(name)
                incident_id = facts.incident.id if facts.incident else None
            for notice in notices:
                state = self._notify(name, view, notice, state)
            if step is None:
                return state, outcome
            if refusal is not None:
                to = NodeState.BLOCKED.value if moved else outcome.to_state
                return state, replace(outcome, to_state=to, step=step.row, refused=str(refusal.reason))
            try:
                done, error = self.run_effects(name, step, incident_id)
            except KubernetesNotFound:
                view, deleted, drain = None, True, None
                continue
            with self.sessions() as session, session.begin():
                node = repo.get_or_create_node(session, name, now=self.now)
                if error is not None:
                    self._record_failed(session, node, done, step)
                    return state, replace(outcome, step=step.row, error=error)
                self.record_step(session, node, step, done, firing=firing)
            outcome = replace(outcome, to_state=str(step.to) if step.to else outcome.to_state, step=step.row)
            if step.to is None or step.to in (NodeState.HEALTHY, NodeState.RELEASED, NodeState.BLOCKED):
                return state, outcome
            drain = None
        return state, outcome

    def _notify(
        self, name: str, view: NodeView | None, step: lc.Step, state: safety.SafetyState
    ) -> safety.SafetyState:
        with self.sessions() as session, session.begin():
            node = repo.get_or_create_node(session, name, now=self.now)
            decision, state = safety.judge(self.request(node, view, step), state)
            if not decision.approved:
                self.record_refusal(session, node, step, decision)
                return state
        try:
            done, error = self.run_effects(name, step, None)
        except KubernetesNotFound:
            return state
        with self.sessions() as session, session.begin():
            node = repo.get_or_create_node(session, name, now=self.now)
            if error is not None:
                self._record_failed(session, node, done, step)
            else:
                self._record_effects(session, node, repo.open_incident(session, node), done, step)
        return state

    def _record_failed(self, session: Session, node: Node, done: list[dict[str, Any]], step: lc.Step) -> None:
        self._record_effects(session, node, repo.open_incident(session, node), done, step)

    def _record_effects(
        self,
        session: Session,
        node: Node,
        incident: Incident | None,
        done: list[dict[str, Any]],
        step: lc.Step,
    ) -> None:
        for record in done:
            if self.recorder_writes and record["kind"] != "notify" and "error" not in record:
                continue
            repo.record_action(
                session,
                kind=record["kind"],
                status=record.get("status", self.done_status),
                actor=self.actor,
                now=self.now,
                node=node,
                incident=incident,
                error=record.get("error"),
                detail={**record.get("detail", {}), "step": step.row},
            )

    def _pool(self, view: NodeView | None) -> str:
        if view is None:
            return "default"
        return view.labels.get(self.settings.kubernetes.pool_label, "default")


# --- fleet-wide facts -----------------------------------------------------------------------------


def _pool_usage(session: Session) -> dict[str, safety.PoolUsage]:
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


def turned_bad(findings: TickFindings, rules: RuleSet) -> dict[str, datetime]:
    """node → when its earliest quarantining finding fired (the circuit breaker's input).

    Findings of frozen rules, unknown nodes and rules not in the rule set are left out: no data and
    stale state never trip the breaker.
    """
    names = {r.name: r for r in rules.rules}
    out: dict[str, datetime] = {}
    for node, found in findings.firing.items():
        if node in findings.unknown:
            continue
        for f in found:
            rule = names.get(f.rule)
            if rule is None or f.rule in findings.frozen_rules:
                continue
            if not {a.kind for a in rule.actions} & {"quarantine", "taint"}:
                continue
            at = f.fired_at or findings.at
            if node not in out or at < out[node]:
                out[node] = at
    return out


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _candidates(session: Session, findings: TickFindings) -> list[str]:
    names = set(findings.firing) | set(findings.pending) | set(findings.unknown)
    names |= set(
        session.scalars(
            select(Node.name).where(Node.state.not_in([NodeState.HEALTHY, NodeState.UNKNOWN]))
        ).all()
    )
    # Unknown nodes come back when their data does; deleted ones stay unknown (read → 404).
    names |= set(session.scalars(select(Node.name).where(Node.state == NodeState.UNKNOWN)).all())
    return sorted(names)


def _order(names: Iterable[str], findings: TickFindings, states: Mapping[str, str]) -> list[str]:
    """Nodes healer already holds first (their steps need no budget), then new ones by when their
    finding fired (first come, first served for the budget), then by name."""

    def key(name: str) -> tuple[object, ...]:
        held = states.get(name) in OUT_OF_SERVICE
        fired = min(
            ((f.fired_at or findings.at) for f in findings.firing.get(name, ())),
            default=findings.at,
        )
        return (not held, fired, name)

    return sorted(names, key=key)


# --- the jobs -------------------------------------------------------------------------------------


def remediate(
    *,
    findings: TickFindings,
    rules: RuleSet,
    actions: NodeActions,
    session_factory: sessionmaker[Session],
    settings: Settings,
    now: datetime,
    actor: str = "healer",
    fleet: Mapping[str, str] | None = None,
    recovery_hold_seconds: float | None = None,
) -> RemediationResult:
    """Advance every node with findings or not healthy by up to :data:`MAX_STEPS_PER_TICK` steps.

    Args:
        findings: this tick's findings (``healer.engine.evaluation``).
        rules: the rule set the findings came from (actions, drain options, recovery hold).
        actions: the Kubernetes adapter (or the dry-run recorder); every call is idempotent.
        session_factory: one short transaction per node step.
        settings: ``safety`` (budget, breaker, windows, dry_run) and ``kubernetes`` (opt-out and
            pool labels, annotation domain).
        now: the tick's time (aware UTC).
        actor: who the transitions and actions are recorded as.
        fleet: node → pool of every node in the cluster, when known (sizes the budget's % and the
            breaker's %); otherwise the nodes healer has recorded.
        recovery_hold_seconds: how long a validating node must stay clear before it is handed
            back, counted from when its last finding resolved (after the rule's ``keep_firing_for``);
            default ``settings.safety.recovery_hold_seconds``.

    Returns:
        The per-node outcomes, pause and breaker status, and the nodes the breaker holds.

    The circuit breaker is judged once per tick, before any node moves; when it trips, no node
    is quarantined that tick or after until ``healer breaker reset``.
    """
    ex = _Executor(
        rules=rules,
        actions=actions,
        session_factory=session_factory,
        settings=settings,
        now=now,
        actor=actor,
        recovery_hold_seconds=(
            settings.safety.recovery_hold_seconds if recovery_hold_seconds is None else recovery_hold_seconds
        ),
        findings=findings,
    )
    result = RemediationResult(at=now)
    with session_factory() as session, session.begin():
        for name, pool in (fleet or {}).items():
            node = repo.get_or_create_node(session, name, now=now, pool=pool)
            node.pool = pool
        names = _candidates(session, findings)
        states = {name: st for name, st in session.execute(select(Node.name, Node.state)).all()}

    views: dict[str, tuple[NodeView | None, bool, str | None]] = {name: ex.read(name) for name in names}
    with session_factory() as session, session.begin():
        for name, (view, _, _) in views.items():
            node = repo.get_or_create_node(session, name, now=now, pool=ex._pool(view))
            if view is not None:
                node.pool = ex._pool(view)
        paused = bool(repo.get_switch(session, repo.SWITCH_PAUSED).get("paused", False))
        breaker_row = repo.get_switch(session, repo.SWITCH_BREAKER)
        fleet_size = len(fleet) if fleet else len(session.scalars(select(Node.id)).all())
        verdict = safety.breaker(
            turned_bad=turned_bad(findings, rules),
            fleet_size=fleet_size,
            settings=settings.safety,
            now=now,
            reset_at=_parse_time(breaker_row.get("reset_at")),
        )
        tripped = bool(breaker_row.get("tripped"))
        if not tripped and verdict.trip:
            tripped = True
            breaker_row = {
                "tripped": True,
                "reason": verdict.reason,
                "tripped_at": now.isoformat(),
                "held": [],
                "nodes": list(verdict.nodes),
            }
            repo.set_switch(session, repo.SWITCH_BREAKER, breaker_row, now=now, by=actor)
            repo.record_action(
                session,
                kind="breaker_trip",
                status=ActionStatus.SUCCEEDED,
                actor=actor,
                now=now,
                target="healer",
                detail={"reason": verdict.reason, "nodes": list(verdict.nodes)},
            )
            log.warning("circuit breaker tripped: %s", verdict.reason)
        ex.held = list(breaker_row.get("held", [])) if tripped else []
        pools = _pool_usage(session)
    state = safety.SafetyState(
        settings=settings.safety, now=now, paused=paused, breaker_tripped=tripped, pools=pools
    )
    result.paused, result.breaker_tripped, result.breaker = paused, tripped, verdict
    held_before = list(ex.held)
    for name in _order(names, findings, states):
        view, deleted, error = views[name]
        if error is not None:
            result.outcomes.append(NodeOutcome(name, states.get(name, NodeState.HEALTHY), None, error=error))
            continue
        state, outcome = ex.run_node(name, state, view=view, deleted=deleted)
        result.outcomes.append(outcome)
    if tripped and ex.held != held_before:
        with session_factory() as session, session.begin():
            row = repo.get_switch(session, repo.SWITCH_BREAKER)
            row["held"] = sorted(set(row.get("held", [])) | set(ex.held))
            repo.set_switch(session, repo.SWITCH_BREAKER, row, now=now, by=actor)
    result.held = sorted(ex.held)
    return result


def advance_drains(
    *,
    rules: RuleSet,
    actions: NodeActions,
    session_factory: sessionmaker[Session],
    settings: Settings,
    now: datetime,
    actor: str = "healer",
) -> RemediationResult:
    """One drain step for every ``draining`` node, resumed from the database.

    The drain's start (its deadline runs from there), its options (the rule's ``DrainAction`` at
    start) and the incident are read from the ``incidents`` row, so a restarted controller goes on
    where the last one stopped, without repeating what was done. A node a human uncordoned is not
    drained: it becomes ``released``. A paused controller or a maintenance window skips the step
    (refusal recorded once); the deadline keeps running.
    """
    ex = _Executor(
        rules=rules,
        actions=actions,
        session_factory=session_factory,
        settings=settings,
        now=now,
        actor=actor,
        recovery_hold_seconds=settings.safety.recovery_hold_seconds,
        findings=None,
    )
    result = RemediationResult(at=now)
    with session_factory() as session, session.begin():
        names = [n.name for n in repo.nodes_in_states(session, [NodeState.DRAINING])]
        paused = bool(repo.get_switch(session, repo.SWITCH_PAUSED).get("paused", False))
        result.breaker_tripped = bool(repo.get_switch(session, repo.SWITCH_BREAKER).get("tripped"))
    result.paused = paused
    state = safety.SafetyState(settings=settings.safety, now=now, paused=paused)
    for name in names:
        view, deleted, error = ex.read(name)
        if error is not None:
            result.outcomes.append(NodeOutcome(name, NodeState.DRAINING, None, error=error))
            continue
        with session_factory() as session, session.begin():
            node = repo.get_or_create_node(session, name, now=now)
            facts = ex.facts(session, node, view, deleted=deleted)
            incident = repo.open_incident(session, node)
            started = incident.drain_started_at if incident else None
            options = (
                DrainAction.model_validate(incident.drain_options or {})
                if incident
                else DrainAction.model_validate({})
            )
            pool = node.pool
        if deleted or lc.decide(facts, ex.ctx) is not None:
            state, outcome = ex.run_node(name, state, view=view, deleted=deleted, max_steps=1)
            result.outcomes.append(outcome)
            continue
        req = safety.Request(
            node=name,
            kind=lc.StepKind.DRAIN,
            pool=pool,
            opted_out=view is not None
            and view.labels.get(settings.kubernetes.opt_out_label, "").lower() == "true",
            already_out=True,
        )
        decision, state = safety.judge(req, state)
        if not decision.approved:
            with session_factory() as session, session.begin():
                node = repo.get_or_create_node(session, name, now=now)
                step = lc.Step(lc.StepKind.DRAIN, None, "drain step", row="drain step")
                ex.record_refusal(session, node, step, decision)
            result.outcomes.append(
                NodeOutcome(name, NodeState.DRAINING, None, "drain step", str(decision.reason))
            )
            continue
        try:
            report = actions.drain_step(
                name,
                started_at=started or now,
                now=now,
                timeout_seconds=options.timeout,
                grace_period_seconds=options.grace_period,
                delete_emptydir_data=options.delete_emptydir_data,
                ignore_daemonsets=options.ignore_daemonsets,
                force=options.force,
                delete_after_timeout=options.delete_after_timeout,
                concurrency=options.concurrency,
            )
        except KubernetesNotFound:
            state, outcome = ex.run_node(name, state, view=None, deleted=True, max_steps=1)
            result.outcomes.append(outcome)
            continue
        except KubernetesError as exc:
            _drain_progress(session_factory, name, now=now, error=str(exc), report=None)
            result.outcomes.append(NodeOutcome(name, NodeState.DRAINING, None, "drain step", error=str(exc)))
            continue
        _drain_progress(session_factory, name, now=now, error=None, report=report)
        if getattr(report, "stopped", ""):
            # The adapter found the node schedulable again: re-read, the lifecycle sees the human.
            view, deleted, error = ex.read(name)
            state, outcome = ex.run_node(name, state, view=view, deleted=deleted, max_steps=1)
        else:
            state, outcome = ex.run_node(name, state, view=view, deleted=False, drain=report, max_steps=1)
        result.outcomes.append(outcome)
    return result


def _drain_progress(
    session_factory: sessionmaker[Session],
    name: str,
    *,
    now: datetime,
    error: str | None,
    report: DrainReport | None,
) -> None:
    """Update the drain's action row: attempts, evicted pods so far, and its final status."""
    with session_factory() as session, session.begin():
        node = session.scalar(select(Node).where(Node.name == name))
        if node is None:
            return
        row = session.scalar(
            select(Action)
            .where(Action.node_id == node.id, Action.kind == "drain", Action.status == ActionStatus.RUNNING)
            .order_by(Action.id.desc())
            .limit(1)
        )
        if row is None:
            return
        detail = dict(row.detail or {})
        row.attempts += 1
        row.updated_at = now
        row.error = error
        if report is not None:
            detail["evicted"] = sorted(set(detail.get("evicted", [])) | set(report.evicted))
            detail["remaining"] = list(report.remaining)
            detail["kept"] = list(getattr(report, "kept", ()))
            if report.deleted:
                detail["deleted"] = sorted(set(detail.get("deleted", [])) | set(report.deleted))
            if report.done:
                row.status = ActionStatus.SUCCEEDED
            elif report.blocked or report.refused:
                row.status = ActionStatus.BLOCKED
                detail["blocked_pods"] = list(report.blocked_pods)
                detail["budgets"] = list(report.budgets)
                detail["refused"] = dict(report.refused)
                row.error = "drain blocked" if report.blocked else "drain refused"
        row.detail = detail
