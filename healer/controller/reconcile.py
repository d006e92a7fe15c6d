"""The nodes' reconcile, in the style of controller-runtime's ``Reconcile``, used by both passes.

::

    read the node once ─> observe ─> decide ─> judge ─> apply ─> record ─┐
                          (database    (engine.   (engine.  (Node-    (the   │ up to max_steps,
                           + the node)  lifecycle) safety)  Actions)  wave's │ from the node as the
                              ▲                                        txn)  │ last write left it
                              └──────────────────────────────────────────────┘

A pass's nodes move in waves (:meth:`Reconciler.reconcile_all`). In a wave, node after node in the
pass's order, the last cluster writes are recorded and the next step is observed, decided and
judged (a refusal is recorded there), all in one transaction; a step with no cluster write is
recorded in the wave that planned it. The transaction is committed, then the wave's cluster writes
run with no transaction open, several nodes at once (each node's own writes in order). So a burst
of nodes going healthy → suspect → quarantined → awaiting_repair takes two transactions in all,
and their cordons go out together rather than one node after another. The effects run before the
record and are idempotent, so a crash in between repeats them harmlessly next time instead of
leaving the database claiming a cordon that never happened (which would read as a human uncordon).

Crash consistency: the step's intent (step, from, to, holder, fencing number) is written to the
node's row in the transaction that decides it, before the first cluster write; the record clears
it. A process killed in between leaves the intent and the node's ownership annotations behind,
and :mod:`healer.controller.ownership` settles them on the next start (released, or adopted by
the incident its still-firing finding opens).

Fencing (:mod:`healer.controller.fence`): leadership is re-checked before every cluster write and
every node's record, and the database's fencing number when a wave's transaction opens and again
before it commits; the transition is a compare-and-set on the state the step was decided from,
sent before anything else of the record. :class:`~healer.errors.NotLeader` ends the pass (the
wave's transaction rolls back: nothing more is written); :class:`~healer.errors.StaleState` drops
that node's step, having written nothing of its record (the next pass decides again from the
state now recorded), and the wave goes on.

A :class:`~healer.errors.KubernetesError` ends that node's reconcile with the failed effect recorded
(the pass backs the node off); ``KubernetesNotFound`` means the node was deleted: its incident
closes and its budget slot frees. Database errors propagate: the pass fails, the wave's records
are lost with its transaction (the intents committed before its writes stay, and the next pass
repeats the idempotent writes and records them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from healer.actions.base import NodeActions
from healer.actions.validation import Validator
from healer.controller import sticky_values
from healer.controller.apply import Applied, DrainPlan, apply, fence_off
from healer.controller.fence import Fence
from healer.controller.observe import Labels, Observation, Rows, Seen, observe
from healer.controller.record import Recorder
from healer.controller.repair import RepairPublisher
from healer.engine import lifecycle as lc
from healer.engine import pools as engine_pools
from healer.engine import safety
from healer.engine import shadow as engine_shadow
from healer.errors import KubernetesError, KubernetesNotFound, StaleState
from healer.model.drain import DrainReport
from healer.model.findings import TickFindings
from healer.model.states import OUT_OF_SERVICE, ActionStatus, NodeState, TicketStatus
from healer.ruleset.schema import RuleSet
from healer.ruleset.xid_catalog import XidCatalog
from healer.store import nodes as repo
from healer.store.session import LazyTransaction, transaction

log = logging.getLogger(__name__)

#: Steps one node may take in one tick (healthy → suspect → quarantined → draining at most).
MAX_STEPS_PER_TICK = 4
#: States after which a reconcile stops: the next step needs new evidence or a human.
_SETTLED = frozenset({NodeState.HEALTHY, NodeState.RELEASED, NodeState.BLOCKED})
#: Nodes whose cluster writes a pass keeps in flight at once (each node's own writes stay in
#: order; the dry-run recorder, which writes to the database, goes one node at a time).
WRITES_IN_FLIGHT = 8
#: Cordon-and-taint patches (one per node) a wave keeps in flight: the patch that stops new pods
#: landing on a bad node goes out for every node of a burst before any node's other writes.
#: Measured with ``bench/remediation_scale_bench.py --kube`` (bench/README.md): 102 cordons at
#: 2,048 KWOK nodes took 0.90 s 8 at a time, 0.60 s 24 at a time and 0.59 s 48 at a time on two
#: cores (the API server's own CPU is the bound above about 24).
FENCE_OFF_IN_FLIGHT = 24
#: Nodes moved together, wave after wave, before the next ones start (bounds how long a wave's
#: transaction holds its locks, and the rows it keeps in memory).
WAVE_NODES = 500


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
    gpus: int | None = None  # the node's nvidia.com/gpu capacity as read (GPU-hours of its outcome)


@dataclass(frozen=True)
class _Write:
    """A node's step, planned and judged, waiting for its cluster writes (after the wave's commit)."""

    seen: Seen
    plan: _Plan


@dataclass(frozen=True)
class _Result:
    """What a :class:`_Write` came to: the effects applied, the node gone (404), or an error that
    ends the pass (``NotLeader``, or a failure no effect maps)."""

    applied: Applied | None = None
    gone: bool = False
    error: BaseException | None = None


_Steps = Generator[_Write, _Result, NodeOutcome]


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
    #: node → the domain incident absorbing it this pass (:mod:`healer.controller.domains`).
    domains: Mapping[str, lc.DomainFacts] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._removing = set(engine_pools.removing_rules(self.rules))
        # A log capture is asked where an agent answers: not in dry-run (nothing reaches the node).
        acting = self.actions.status != ActionStatus.DRY_RUN
        self._capture_wait = self.repair.capture_wait_seconds if self.repair and acting else 0.0
        self.ctx = lc.Context(
            rules=self.rules,
            now=self.now,
            recovery_hold_seconds=self.recovery_hold_seconds,
            xid_catalog=self.xid_catalog,
            repair_actions=self.repair.actions if self.repair else frozenset(),
            validate_with_job=self.validator is not None,
            capture_logs=self._capture_wait > 0,
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
            skip_rules=engine_shadow.shadow_rules(self.rules),
            capture_wait_seconds=self._capture_wait,
        )

    def reconcile_all(
        self,
        nodes: Sequence[tuple[str, Seen]],
        state: safety.SafetyState,
        *,
        max_steps: int = MAX_STEPS_PER_TICK,
        drain_due: bool = False,
    ) -> tuple[safety.SafetyState, list[NodeOutcome]]:
        """Take each node in ``nodes`` (its name and its one read this pass, in the pass's order) up
        to ``max_steps`` steps; returns the safety state (budget used so far) and the outcomes, in
        the same order.

        ``drain_due`` (the drain pass) lets a draining node take one drain round, then the step its
        report calls for.

        The nodes move in waves. A wave records what the previous wave's cluster writes did and
        plans each node's next step, node after node in the pass's order (so the budget and the
        breaker judge the same sequence as one node at a time), in one transaction; the transaction
        is committed (every step's intent durable first), then the wave's cluster writes run, up to
        :data:`WRITES_IN_FLIGHT` nodes at once, each node's own in order. A step that writes
        nothing to the cluster is recorded in the wave that planned it. So a burst of nodes going
        healthy → quarantined → awaiting_repair takes two transactions in all, not two per node,
        and their cordons go out together. Leadership is re-checked before each node's record and
        plan, and the database's fencing number before each commit. Nodes go in groups of
        :data:`WAVE_NODES`, one group's waves after the other's.
        """
        self._safety = state
        outcomes: list[NodeOutcome] = []
        for start in range(0, len(nodes), WAVE_NODES):
            outcomes += self._waves(
                nodes[start : start + WAVE_NODES], max_steps=max_steps, drain_due=drain_due
            )
        return self._safety, outcomes

    def _waves(
        self, nodes: Sequence[tuple[str, Seen]], *, max_steps: int, drain_due: bool
    ) -> list[NodeOutcome]:
        """:meth:`reconcile_all` of up to :data:`WAVE_NODES` nodes."""
        wave = _Wave(self.sessions, self.fence, [name for name, _ in nodes])
        runs = wave.runs
        steps: list[_Steps] = [
            self._steps(run, name, seen, max_steps=max_steps, drain_due=drain_due)
            for run, (name, seen) in zip(runs, nodes, strict=True)
        ]
        outcomes: dict[int, NodeOutcome] = {}
        try:
            starts: dict[int, _Result | None] = dict.fromkeys(range(len(steps)))
            waiting = self._advance(wave, steps, starts, outcomes)
            while waiting:
                self._commit(wave)  # every waiting step's intent is durable before its first cluster write
                order = sorted(waiting)
                results = self._write_all([waiting[i] for i in order])
                waiting = self._advance(wave, steps, dict(zip(order, results, strict=True)), outcomes)
            self._commit(wave)
        except BaseException:
            wave.rollback()
            raise
        return [outcomes[i] for i in range(len(nodes))]

    def _advance(
        self,
        wave: _Wave,
        steps: list[_Steps],
        results: dict[int, _Result | None],
        outcomes: dict[int, NodeOutcome],
    ) -> dict[int, _Write]:
        """Run each node in ``results`` (None: its first step; else what its writes did), in the
        pass's order, to its next cluster write or its end; returns the nodes waiting for writes."""
        # the nodes about to observe or record: their rows in one SELECT, not one per node
        wave.prefetch([i for i, r in results.items() if r is None or not r.gone])
        waiting: dict[int, _Write] = {}
        for i, result in results.items():
            self.fence.check()
            try:
                waiting[i] = next(steps[i]) if result is None else steps[i].send(result)
            except StopIteration as end:
                outcomes[i] = end.value
        return waiting

    def _write_all(self, writes: list[_Write]) -> list[_Result]:
        """The waiting steps' cluster writes, up to :data:`WRITES_IN_FLIGHT` nodes at once; raises
        the first error that ends the pass (nothing of the wave is recorded then: the intents
        committed stay for the ownership reconcile, the effects are idempotent).

        Two rounds: every node's cordon and taint (:func:`~.apply.fence_off`, one patch each,
        :data:`FENCE_OFF_IN_FLIGHT` at once) first, then the rest of each node's step (condition,
        Event, drain...) in order. The cordon is what stops new pods landing on a bad node, so a
        burst of 100 newly firing nodes has all its cordons out before the first condition or
        Event, not the last cordon behind 99 nodes' other writes."""

        def safely(write: _Write, effects: slice, so_far: Applied | None) -> _Result:
            try:
                return _Result(applied=self._apply(write.seen, write.plan, effects=effects, so_far=so_far))
            except KubernetesNotFound:
                return _Result(gone=True)
            except BaseException as exc:
                return _Result(error=exc)

        def first(write: _Write) -> _Result | None:
            assert write.plan.step is not None
            n = fence_off(write.plan.step)
            return safely(write, slice(None, n), None) if n else None

        def rest(write: _Write, before: _Result | None) -> _Result:
            if before is None:
                return safely(write, slice(None), None)
            if before.applied is None or before.applied.error is not None:
                return before  # gone, or the patch failed: the step ends there
            assert write.plan.step is not None
            return safely(write, slice(fence_off(write.plan.step), None), before.applied)

        fenced = self._each(lambda i: first(writes[i]), len(writes), FENCE_OFF_IN_FLIGHT)
        done = self._each(lambda i: rest(writes[i], fenced[i]), len(writes))
        return [result for result in done if result is not None]

    def _each(
        self, do: Callable[[int], _Result | None], n: int, in_flight: int = WRITES_IN_FLIGHT
    ) -> list[_Result | None]:
        """``do(i)`` for each ``i < n``, up to ``in_flight`` at once (one at a time in dry-run,
        stopping at the first error); raises the first error that ends the pass."""
        workers = min(in_flight, n)
        results: list[_Result | None] = []
        if workers < 2 or self.actions.status == ActionStatus.DRY_RUN:
            for i in range(n):
                results.append(do(i))
                if (result := results[-1]) is not None and result.error is not None:
                    break
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="healer-write") as pool:
                results = list(pool.map(do, range(n)))
        for result in results:
            if result is not None and result.error is not None:
                raise result.error
        return results

    def _steps(
        self,
        run: _Run,
        name: str,
        seen: Seen,
        *,
        max_steps: int,
        drain_due: bool,
    ) -> _Steps:
        """One node's steps: yields each step whose cluster writes are due (and is sent what they
        did), returns the node's outcome."""
        outcome: NodeOutcome | None = None
        report: DrainReport | None = None
        for i in range(max_steps):
            try:
                plan, self._safety = self._plan(
                    run, name, seen, self._safety, notices=i == 0, drain_due=drain_due, report=report
                )
            except StaleState as exc:  # a refusal's move to blocked: another writer moved the node
                log.warning("%s", exc)
                return replace(outcome or NodeOutcome(name, "", None), refused="stale")
            outcome = outcome or NodeOutcome(name, plan.from_state, None)
            if plan.notices:
                self._commit(run.wave)
                for notice in plan.notices:
                    self._notify(name, seen, notice)
            step = plan.step
            if step is None:
                return outcome
            if plan.refusal is not None:
                to = NodeState.BLOCKED.value if plan.blocked else outcome.to_state
                return replace(outcome, to_state=to, step=step.row, refused=str(plan.refusal.reason))
            if seen.view is not None and step.effects:
                result = yield _Write(seen, plan)  # after the wave's commit: the intent is durable
                if result.gone:
                    seen, report = Seen(None, deleted=True), None
                    continue
                assert result.applied is not None
                applied = result.applied
            else:
                applied = Applied(view=seen.view)  # nothing to write to the cluster
            try:
                self._record(run, name, plan, applied)
            except StaleState as exc:
                log.warning("%s", exc)  # the compare-and-set came first: nothing of it was written
                self._record_effects(run, name, plan, applied)  # what was done is audited all the same
                return replace(outcome, step=step.row, refused="stale")
            if applied.error is not None:
                return replace(outcome, step=step.row, error=applied.error)
            seen, report = Seen(applied.view, deleted=seen.deleted), applied.drain
            if report is not None:
                continue  # the drain round's report decides the next step
            outcome = replace(outcome, to_state=str(step.to) if step.to else outcome.to_state, step=step.row)
            if step.to is None or step.to in _SETTLED:
                return outcome
        assert outcome is not None
        return outcome

    def _commit(self, wave: _Wave) -> None:
        """Commit the wave's open transaction (the fencing number read again first); the incidents
        its nodes attached findings to count as attached for the rest of the pass."""
        if wave.txn.open:
            self.fence.check_db(wave.txn.session())
        wave.txn.commit()
        for run in wave.runs:
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
        session = run.wave.txn.session()
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
            skip_rules=self.record.skip_rules,
        )
        if obs.incident is not None:
            run.attached.add(obs.incident.id)
        run.rows = obs.rows
        obs.facts = self._with_validation(obs.facts)
        if name in self.domains:
            obs.facts = replace(obs.facts, domain=self.domains[name])
        wanted = lc.notices(obs.facts, self.ctx) if notices else []
        approved, state = self._judge_notices(session, obs, wanted, state)
        view = obs.facts.view
        plan = _Plan(
            gpus=view.gpu_capacity if view is not None else None,
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

    def _apply(self, seen: Seen, plan: _Plan, *, effects: slice, so_far: Applied | None) -> Applied:
        """The step's ``effects`` on the node as last seen (no transaction open), after what
        ``so_far`` did."""
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
            effects=effects,
            so_far=so_far,
        )

    def _rows(self, run: _Run, name: str) -> tuple[Session, Rows]:
        """The open transaction and the node's rows in it (read when this transaction has not)."""
        session = run.wave.txn.session()
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
        moved = applied.error is None and step.to is not None
        if moved:
            # The compare-and-set comes first: a stale one raises before anything of this record
            # is written (the wave's transaction holds other nodes' records: nothing rolls back).
            assert step.to is not None
            repo.move(session, node, step.to, now=self.now, expect=plan.from_state, clear_intent=ours)
        done = applied.done
        if any(isinstance(e, lc.DrainStep) for e in step.effects):
            self.record.drain_progress(session, node, error=applied.error, report=applied.drain)
            done = [d for d in done if d.kind != "drainstep"]  # the drain's row holds the round
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
                moved=moved,
                gpus=plan.gpus,
            )

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
            burst_rule=self.labels.burst_rule(view),
            already_out=step.already_out or obs.node.state in OUT_OF_SERVICE,
            pools=pools,
            domain=f"domain-{d.id}" if (d := obs.facts.domain) and d.ticket != TicketStatus.RESOLVED else "",
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


class _Wave:
    """A pass's open transaction, shared by its nodes' records and plans between two rounds of
    cluster writes, and one :class:`_Run` per node (in the pass's order)."""

    def __init__(self, sessions: sessionmaker[Session], fence: Fence, names: Sequence[str]) -> None:
        self.txn = LazyTransaction(sessions, fence.check_db)
        self.runs = [_Run(self, name) for name in names]

    def prefetch(self, indexes: Sequence[int]) -> None:
        """Read the rows of the runs at ``indexes`` that this transaction has not read, in one SELECT."""
        runs = [self.runs[i] for i in indexes if self.runs[i].rows is None]
        if len(runs) < 2:
            return
        found = repo.nodes_and_open_incidents(self.txn.session(), [run.name for run in runs])
        for run in runs:
            if run.name in found:
                node, incident, ticket = found[run.name]
                status = TicketStatus(ticket) if ticket else None
                run.rows = Rows(node, incident, ticket=status, ticket_read=incident is not None)

    def rollback(self) -> None:
        self.txn.rollback()
        for run in self.runs:
            run.rows, run.attached = None, set()


class _Run:
    """One node's rows in the wave's open transaction, and the incidents whose findings it attached
    there (they count as attached for the pass once committed)."""

    def __init__(self, wave: _Wave, name: str) -> None:
        self.wave = wave
        self.name = name
        self.rows: Rows | None = None
        self.attached: set[int] = set()
