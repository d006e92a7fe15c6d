"""One node's reconcile, in the style of controller-runtime's ``Reconcile``, used by both passes.

::

    read the node once ─> observe ─> decide ─> judge ─> apply ─> record ─┐
                          (database    (engine.   (engine.  (Node-    (one   │ up to max_steps,
                           + the node)  lifecycle) safety)  Actions)   txn)  │ from the node as the
                              ▲                                              │ last write left it
                              └──────────────────────────────────────────────┘

Each step is short: observe, decide and judge run in a transaction (a refusal is recorded there);
the Kubernetes effects run with no transaction open; the record follows in a transaction. A
step's record and the next step's plan share one transaction, and a step with no cluster write is
recorded in the transaction that planned it: the transaction is committed before every cluster
write and at the end, so a node going healthy → suspect → quarantined → awaiting_repair in one
pass takes two transactions, not seven. The effects run before the record and are idempotent, so
a crash in between repeats them harmlessly next time instead of leaving the database claiming a
cordon that never happened (which would read as a human uncordon).

Crash consistency: the step's intent (step, from, to, holder, fencing number) is written to the
node's row in the transaction that decides it, before the first cluster write; the record clears
it. A process killed in between leaves the intent and the node's ownership annotations behind,
and :mod:`healer.controller.ownership` settles them on the next start (released, or adopted by
the incident its still-firing finding opens).

Fencing (:mod:`healer.controller.fence`): leadership is re-checked before every cluster write and
every record, and the database's fencing number in the record's transaction; the transition is a
compare-and-set on the state the step was decided from. :class:`~healer.errors.NotLeader` ends the
pass (nothing more is written); :class:`~healer.errors.StaleState` drops that node's step (the
next pass decides again from the state now recorded).

A :class:`~healer.errors.KubernetesError` ends the reconcile with the failed effect recorded (the
pass backs the node off); ``KubernetesNotFound`` means the node was deleted: its incident closes
and its budget slot frees. Database errors propagate (the pass fails and is retried whole).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from healer.actions.base import NodeActions
from healer.actions.validation import Validator
from healer.controller import sticky_values
from healer.controller.apply import Applied, DrainPlan, apply
from healer.controller.fence import Fence
from healer.controller.observe import Labels, Observation, Rows, Seen, observe
from healer.controller.record import Recorder
from healer.controller.repair import RepairPublisher
from healer.engine import lifecycle as lc
from healer.engine import pools as engine_pools
from healer.engine import safety
from healer.errors import KubernetesError, KubernetesNotFound, StaleState
from healer.model.drain import DrainReport
from healer.model.findings import TickFindings
from healer.model.states import OUT_OF_SERVICE, ActionStatus, NodeState
from healer.ruleset.schema import RuleSet
from healer.ruleset.xid_catalog import XidCatalog
from healer.store import nodes as repo
from healer.store.session import LazyTransaction, transaction

log = logging.getLogger(__name__)

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
class _Plan:
    """One step as decided and judged: the step (None = nothing to do), the notices approved, the
    refusal (and whether it blocked the node), and what applying it needs."""

    from_state: str
    step: lc.Step | None
    notices: list[lc.Step]
    incident_id: int | None
    drain: DrainPlan
    refusal: safety.Decision | None = None
    blocked: bool = False


@dataclass
class Reconciler:
    """A pass's fixed inputs: the rules, the adapter, the database, the time and this tick's
    findings (None in the drain pass). ``held`` collects the nodes the circuit breaker held back;
    ``pools`` are this tick's rule pools (None: each node counts in its labelled pool only)."""

    rules: RuleSet
    actions: NodeActions
    sessions: sessionmaker[Session]
    labels: Labels
    now: datetime
    actor: str
    recovery_hold_seconds: float
    findings: TickFindings | None = None
    held: list[str] = field(default_factory=list)
    fence: Fence = field(default_factory=Fence)
    pools: engine_pools.Pools | None = None
    repair: RepairPublisher | None = None
    xid_catalog: XidCatalog | None = None
    validator: Validator | None = None

    def __post_init__(self) -> None:
        self._removing = set(engine_pools.removing_rules(self.rules))
        self.ctx = lc.Context(
            rules=self.rules,
            now=self.now,
            recovery_hold_seconds=self.recovery_hold_seconds,
            xid_catalog=self.xid_catalog,
            repair_actions=self.repair.actions if self.repair else frozenset(),
            validate_with_job=self.validator is not None,
        )
        self.sticky_rules = sticky_values.sticky_rule_names(self.rules)
        self._attached: set[int] = set()  # incidents whose findings this pass attached
        self._notifies = lc.notifies(self.rules)
        self.record = Recorder(
            actor=self.actor,
            now=self.now,
            audited=self.actions.status == ActionStatus.DRY_RUN,
            holder=self.fence.holder,
            fencing_token=self.fence.token,
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

        Transactions: a step's record and the next step's plan share one, and a step that writes
        nothing to the cluster is recorded in the transaction that planned it; the transaction is
        committed before every cluster write (so the step's intent is durable first) and at the
        end. So a node going healthy → quarantined → awaiting_repair in one pass takes two.
        """
        run = _Run(self.sessions, self.fence)
        try:
            state, outcome = self._steps(run, name, state, seen, max_steps=max_steps, drain_due=drain_due)
        except BaseException:
            run.rollback()
            raise
        self._commit(run)
        return state, outcome

    def _steps(
        self,
        run: _Run,
        name: str,
        state: safety.SafetyState,
        seen: Seen,
        *,
        max_steps: int,
        drain_due: bool,
    ) -> tuple[safety.SafetyState, NodeOutcome]:
        outcome: NodeOutcome | None = None
        report: DrainReport | None = None
        for i in range(max_steps):
            plan, state = self._plan(
                run, name, seen, state, notices=i == 0, drain_due=drain_due, report=report
            )
            outcome = outcome or NodeOutcome(name, plan.from_state, None)
            if plan.notices:
                self._commit(run)
                for notice in plan.notices:
                    self._notify(name, seen, notice)
            step = plan.step
            if step is None:
                return state, outcome
            if plan.refusal is not None:
                to = NodeState.BLOCKED.value if plan.blocked else outcome.to_state
                return state, replace(outcome, to_state=to, step=step.row, refused=str(plan.refusal.reason))
            if seen.view is not None and step.effects:
                self._commit(run)  # the step's intent is durable before its first cluster write
                try:
                    applied = self._apply(seen, plan)
                except KubernetesNotFound:
                    seen, report = Seen(None, deleted=True), None
                    continue
            else:
                applied = Applied(view=seen.view)  # nothing to write to the cluster
                if run.txn.records and not run.txn.holds_write:
                    self._commit(run)  # a stale transition must not roll back an earlier record
            try:
                self._record(run, name, plan, applied)
            except StaleState as exc:
                log.warning("%s", exc)
                run.rollback()
                self._record_effects(run, name, plan, applied)  # what was done is audited all the same
                self._commit(run)
                return state, replace(outcome, step=step.row, refused="stale")
            if applied.error is not None:
                return state, replace(outcome, step=step.row, error=applied.error)
            seen, report = Seen(applied.view, deleted=seen.deleted), applied.drain
            if report is not None:
                continue  # the drain round's report decides the next step
            outcome = replace(outcome, to_state=str(step.to) if step.to else outcome.to_state, step=step.row)
            if step.to is None or step.to in _SETTLED:
                return state, outcome
        assert outcome is not None
        return state, outcome

    def _commit(self, run: _Run) -> None:
        """Commit the reconcile's open transaction; the incidents it attached findings to count as
        attached for the rest of the pass."""
        run.txn.commit()
        self._attached |= run.attached
        run.attached, run.rows = set(), None

    # -- the stages --

    def _plan(
        self,
        run: _Run,
        name: str,
        seen: Seen,
        state: safety.SafetyState,
        *,
        notices: bool,
        drain_due: bool,
        report: DrainReport | None,
    ) -> tuple[_Plan, safety.SafetyState]:
        """Observe → decide → judge, in the open transaction (a refusal is recorded there)."""
        session = run.txn.session()
        obs = observe(
            session,
            name,
            seen,
            labels=self.labels,
            findings=self.findings,
            now=self.now,
            drain_due=drain_due,
            drain=report,
            sticky_rules=self.sticky_rules,
            rows=run.rows,
            attached=self._attached | run.attached,
            notices=notices and self._notifies,
        )
        if obs.incident is not None:
            run.attached.add(obs.incident.id)
        run.rows = obs.rows
        obs.facts = self._with_validation(obs.facts)
        wanted = lc.notices(obs.facts, self.ctx) if notices else []
        approved, state = self._judge_notices(session, obs, wanted, state)
        plan = _Plan(
            from_state=obs.node.state,
            step=lc.decide(obs.facts, self.ctx),
            notices=approved,
            incident_id=obs.incident.id if obs.incident else None,
            drain=DrainPlan(
                started_at=(obs.incident.drain_started_at if obs.incident else None) or self.now,
                options=obs.drain_options,
            ),
        )
        if plan.step is not None:
            decision, state = safety.judge(self._request(obs, plan.step), state)
            if not decision.approved:
                plan.refusal = decision
                plan.blocked = self.record.refusal(session, obs.node, plan.step, decision)
                if decision.reason == safety.Refusal.BREAKER and name not in self.held:
                    self.held.append(name)
            elif seen.view is not None and plan.step.effects:
                obs.node.intent = {
                    "step": plan.step.row,
                    "from": plan.from_state,
                    "to": str(plan.step.to) if plan.step.to else None,
                    "holder": self.fence.holder,
                    "fencing_token": self.fence.token,
                    "at": self.now.isoformat(),
                }
        return plan, state

    def _apply(self, seen: Seen, plan: _Plan) -> Applied:
        """The step's effects on the node as last seen (no transaction open)."""
        assert plan.step is not None
        if seen.view is None:  # a deleted node: its step is a record only
            return Applied(view=None)
        return apply(
            self.actions,
            seen.view,
            plan.step,
            incident_id=plan.incident_id,
            now=self.now,
            actor=self.actor,
            drain=plan.drain,
            check=self.fence.check,
            repair=self.repair,
            validator=self.validator,
        )

    def _rows(self, run: _Run, name: str) -> tuple[Session, Rows]:
        """The open transaction and the node's rows in it (read when this transaction has not)."""
        session = run.txn.session()
        if run.rows is None:
            run.rows = Rows(*repo.node_and_open_incident(session, name, now=self.now))
        return session, run.rows

    def _record(self, run: _Run, name: str, plan: _Plan, applied: Applied) -> None:
        """The step (or its failure) in the open transaction; a drain round updates the drain's row."""
        step = plan.step
        assert step is not None
        firing = list(self.findings.firing.get(name, ())) if self.findings else []
        session, rows = self._rows(run, name)
        node = rows.node
        # Clear this step's own intent; one a dead process left waits for the ownership reconcile.
        intent = node.intent or {}
        ours = (intent.get("step"), intent.get("at")) == (step.row, self.now.isoformat())
        if ours and applied.error is not None:
            node.intent = None
        done = applied.done
        if any(isinstance(e, lc.DrainStep) for e in step.effects):
            self.record.drain_progress(session, node, error=applied.error, report=applied.drain)
            done = [d for d in done if d.kind != "drainstep"]  # the drain's row holds the round
        run.txn.records += 1
        if applied.error is not None:
            self.record.effects(session, node, rows.incident, done, step)
        else:
            self.record.step(
                session,
                rows,
                step,
                done,
                firing=firing,
                expect=plan.from_state,
                attached=run.attached,
                clear_intent=ours,
            )
            run.txn.holds_write = run.txn.holds_write or step.to is not None

    def _record_effects(self, run: _Run, name: str, plan: _Plan, applied: Applied) -> None:
        """Only the audit rows of the effects performed (a step whose transition went stale)."""
        assert plan.step is not None
        session, rows = self._rows(run, name)
        self.record.effects(session, rows.node, rows.incident, applied.done, plan.step)

    # -- helpers --

    def _with_validation(self, facts: lc.NodeFacts) -> lc.NodeFacts:
        """The facts with the running validation Job's outcome read (one list of its pods)."""
        inc = facts.incident
        job = inc.validation if inc is not None else None
        if self.validator is None or not job or job.get("status") != "running":
            return facts
        try:
            result = self.validator.result(str(job["job"]))
        except KubernetesError as exc:
            log.warning("node %s: validation job %s not read: %s", facts.name, job.get("job"), exc)
            return facts
        return replace(facts, validation=result)

    def _request(self, obs: Observation, step: lc.Step) -> safety.Request:
        view = obs.facts.view
        name = obs.node.name
        pools: tuple[str, ...] = ()
        if self.pools is not None:
            # every rule taking the node out counts: the step must fit each of their pools
            firing = {f.rule for f in self.findings.firing.get(name, ())} if self.findings else set()
            pools = self.pools.pools_of(name, sorted(firing & self._removing))
        return safety.Request(
            node=name,
            kind=step.kind,
            pool=obs.node.pool,
            opted_out=self.labels.opted_out(view),
            already_out=step.already_out or obs.node.state in OUT_OF_SERVICE,
            pools=pools,
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
            applied = apply(
                self.actions,
                seen.view,
                notice,
                incident_id=None,
                now=self.now,
                actor=self.actor,
                check=self.fence.check,
            )
        except KubernetesNotFound:
            return
        with transaction(self.sessions) as session:
            self.fence.check_db(session)
            node = repo.get_or_create_node(session, name, now=self.now)
            self.record.effects(session, node, repo.open_incident(session, node), applied.done, notice)


class _Run:
    """One reconcile's open transaction, the node's rows in it, and the incidents whose findings it
    attached (they count as attached for the pass once committed)."""

    def __init__(self, sessions: sessionmaker[Session], fence: Fence) -> None:
        self.txn = LazyTransaction(sessions, fence.check_db)
        self.rows: Rows | None = None
        self.attached: set[int] = set()

    def rollback(self) -> None:
        self.txn.rollback()
        self.rows, self.attached = None, set()
