"""One node's reconcile, in the style of controller-runtime's ``Reconcile``, used by both passes.

::

    read the node once ─> observe ─> decide ─> judge ─> apply ─> record ─┐
                          (database    (engine.   (engine.  (Node-    (one   │ up to max_steps,
                           + the node)  lifecycle) safety)  Actions)   txn)  │ from the node as the
                              ▲                                              │ last write left it
                              └──────────────────────────────────────────────┘

Each step is short: one transaction observes, decides and judges (a refusal is recorded there);
the Kubernetes effects run with no transaction open; one transaction records the step. The
effects run before the record and are idempotent, so a crash in between repeats them harmlessly
next time instead of leaving the database claiming a cordon that never happened (which would
read as a human uncordon).

A :class:`~healer.errors.KubernetesError` ends the reconcile with the failed effect recorded (the
pass backs the node off); ``KubernetesNotFound`` means the node was deleted: its incident closes
and its budget slot frees. Database errors propagate (the pass fails and is retried whole).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from healer.actions.base import NodeActions
from healer.controller.apply import DrainPlan, apply
from healer.controller.observe import Labels, Observation, Seen, observe
from healer.controller.record import Recorder
from healer.engine import lifecycle as lc
from healer.engine import safety
from healer.errors import KubernetesNotFound
from healer.model.findings import TickFindings
from healer.model.states import OUT_OF_SERVICE, ActionStatus, NodeState
from healer.ruleset.schema import RuleSet
from healer.store import nodes as repo
from healer.store.session import transaction

#: Steps one node may take in one tick (healthy → suspect → quarantined → draining at most).
MAX_STEPS_PER_TICK = 4
#: States after which a reconcile stops: the next step needs new evidence or a human.
_SETTLED = frozenset({NodeState.HEALTHY, NodeState.RELEASED, NodeState.BLOCKED})


@dataclass(frozen=True)
class NodeOutcome:
    """What happened to one node in one pass.

    ``to_state`` is None when the node stayed; ``refused`` is the safety reason when a step was
    refused; ``error`` the Kubernetes error when an effect (or the read) failed.
    """

    node: str
    from_state: str
    to_state: str | None
    step: str = ""
    refused: str | None = None
    error: str | None = None


@dataclass
class Reconciler:
    """A pass's fixed inputs: the rules, the adapter, the database, the time and this tick's
    findings (None in the drain pass). ``held`` collects the nodes the circuit breaker held back."""

    rules: RuleSet
    actions: NodeActions
    sessions: sessionmaker[Session]
    labels: Labels
    now: datetime
    actor: str
    recovery_hold_seconds: float
    findings: TickFindings | None = None
    held: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ctx = lc.Context(
            rules=self.rules, now=self.now, recovery_hold_seconds=self.recovery_hold_seconds
        )
        self.record = Recorder(
            actor=self.actor, now=self.now, audited=self.actions.status == ActionStatus.DRY_RUN
        )

    def reconcile(
        self,
        name: str,
        state: safety.SafetyState,
        seen: Seen,
        *,
        max_steps: int = MAX_STEPS_PER_TICK,
        drain_due: bool = False,
    ) -> tuple[safety.SafetyState, NodeOutcome]:
        """Take ``name`` up to ``max_steps`` steps from ``seen`` (its one read this pass).

        ``drain_due`` (the drain pass) lets a draining node take one drain round, then the step its
        report calls for. Returns the safety state (budget used so far) and the node's outcome.
        """
        firing = list(self.findings.firing.get(name, ())) if self.findings else []
        outcome: NodeOutcome | None = None
        drain_report = None
        for i in range(max_steps):
            # observe → decide → judge (a refusal is recorded in the same transaction)
            with transaction(self.sessions) as session:
                obs = observe(
                    session,
                    name,
                    seen,
                    labels=self.labels,
                    findings=self.findings,
                    now=self.now,
                    drain_due=drain_due,
                    drain=drain_report,
                )
                outcome = outcome or NodeOutcome(name, obs.node.state, None)
                notices = lc.notices(obs.facts, self.ctx) if i == 0 else []
                notices, state = self._judge_notices(session, obs, notices, state)
                step = lc.decide(obs.facts, self.ctx)
                refusal: safety.Decision | None = None
                if step is not None:
                    decision, state = safety.judge(self._request(obs, step), state)
                    if not decision.approved:
                        refusal = decision
                        moved = self.record.refusal(session, obs.node, step, decision)
                        if decision.reason == safety.Refusal.BREAKER and name not in self.held:
                            self.held.append(name)
                incident_id = obs.facts.incident.id if obs.facts.incident else None
                plan = DrainPlan(
                    started_at=(obs.incident.drain_started_at if obs.incident else None) or self.now,
                    options=obs.drain_options,
                )
            for notice in notices:
                self._notify(name, seen, notice)
            if step is None:
                return state, outcome
            if refusal is not None:
                to = NodeState.BLOCKED.value if moved else outcome.to_state
                return state, replace(outcome, to_state=to, step=step.row, refused=str(refusal.reason))

            # apply (no transaction open)
            try:
                applied = (
                    apply(
                        self.actions,
                        seen.view,
                        step,
                        incident_id=incident_id,
                        now=self.now,
                        actor=self.actor,
                        drain=plan,
                    )
                    if seen.view is not None
                    else None
                )
            except KubernetesNotFound:
                seen, drain_report = Seen(None, deleted=True), None
                continue

            # record
            with transaction(self.sessions) as session:
                node = repo.get_or_create_node(session, name, now=self.now)
                done = applied.done if applied else []
                error = applied.error if applied else None
                if any(isinstance(e, lc.DrainStep) for e in step.effects):
                    report = applied.drain if applied else None
                    self.record.drain_progress(session, node, error=error, report=report)
                    done = [d for d in done if d.kind != "drainstep"]  # the drain row holds the round
                if error is not None:
                    self.record.effects(session, node, repo.open_incident(session, node), done, step)
                    return state, replace(outcome, step=step.row, error=error)
                self.record.step(session, node, step, done, firing=firing)
            if applied is not None:
                seen = Seen(applied.view)
                drain_report = applied.drain
            if applied is not None and applied.drain is not None:
                continue  # the round's report decides the next step
            outcome = replace(outcome, to_state=str(step.to) if step.to else outcome.to_state, step=step.row)
            if step.to is None or step.to in _SETTLED:
                return state, outcome
        assert outcome is not None
        return state, outcome

    # -- helpers --

    def _request(self, obs: Observation, step: lc.Step) -> safety.Request:
        view = obs.facts.view
        return safety.Request(
            node=obs.node.name,
            kind=step.kind,
            pool=obs.node.pool,
            opted_out=self.labels.opted_out(view),
            already_out=step.already_out or obs.node.state in OUT_OF_SERVICE,
        )

    def _judge_notices(
        self, session: Session, obs: Observation, notices: list[lc.Step], state: safety.SafetyState
    ) -> tuple[list[lc.Step], safety.SafetyState]:
        approved = []
        for notice in notices:
            decision, state = safety.judge(self._request(obs, notice), state)
            if decision.approved:
                approved.append(notice)
            else:
                self.record.refusal(session, obs.node, notice, decision)
        return approved, state

    def _notify(self, name: str, seen: Seen, notice: lc.Step) -> None:
        """Send a notify rule's Event and record it (its key keeps it from being sent twice)."""
        if seen.view is None:
            return
        try:
            applied = apply(self.actions, seen.view, notice, incident_id=None, now=self.now, actor=self.actor)
        except KubernetesNotFound:
            return
        with transaction(self.sessions) as session:
            node = repo.get_or_create_node(session, name, now=self.now)
            self.record.effects(session, node, repo.open_incident(session, node), applied.done, notice)
