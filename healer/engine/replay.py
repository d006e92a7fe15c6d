"""Replay: history (query results tick by tick) through evaluation, lifecycle and safety, in memory.

Pure: no I/O, no clock, no database. The caller feeds one tick at a time (:meth:`Replay.tick`:
the tick's time and each rule's instant-query result at that time, e.g. sliced from range queries
by ``healer.sources.prometheus_range``); the replay advances exactly the code the controller runs
(:func:`healer.engine.evaluation.evaluate`, :func:`healer.engine.lifecycle.decide`,
:func:`healer.engine.safety.judge` and :func:`~healer.engine.safety.breaker`) and records what
healer would have done as :class:`ReplayEvent` values. Nothing touches a cluster or a provider.

What the replay has to assume, because history does not say it:

- the node as healer would have left it: schedulable until healer cordons it, no human takes over,
  no node opts out; every node in one pool (``default``) whose size is the fleet seen so far (or
  :attr:`ReplaySettings.fleet_size`);
- a drain finishes at the first drain round after it starts (the next tick): pods and
  PodDisruptionBudgets are not in Prometheus;
- a ticket is resolved :attr:`ReplaySettings.repair_after_seconds` after it was requested (None:
  never within the window, the node stays out until the end);
- a tripped circuit breaker stays tripped: nobody presses reset during a backtest;
- with a topology (:attr:`ReplaySettings.topology`, the thresholds of ``topology`` in the
  settings), findings on k of n nodes of one domain become one domain incident
  (:mod:`healer.engine.correlation`) whose one ticket is requested when it opens and resolved
  :attr:`ReplaySettings.repair_after_seconds` later, as the controller does;
- a rule is evaluated at a tick when the caller gives its result (one missing is frozen for the
  tick): ``healer.backtesting`` evaluates each rule group at its own interval by default, every
  rule at every tick with an explicit step.

Memory: the alert state of active series, one small record per node that ever had a finding, and
the events (a handful per incident); independent of the window's length otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum

from healer.engine import correlation, safety
from healer.engine import lifecycle as lc
from healer.engine.evaluation import ChangeKind, EvaluationState, QueryResult, evaluate, node_of
from healer.engine.fleet import order, turned_bad
from healer.errors import SourceError
from healer.model.addresses import AddressBook
from healer.model.drain import DrainReport
from healer.model.findings import TickFindings, UnresolvedSeries
from healer.model.limits import SafetyLimits
from healer.model.node import NodeView
from healer.model.states import OUT_OF_SERVICE, NodeState, TicketStatus
from healer.ruleset.schema import RuleSet

#: The only pool a replay knows (node pools are Kubernetes labels, not in Prometheus).
POOL = "default"
#: Steps one node may take in one tick, as in the controller (``MAX_STEPS_PER_TICK``).
MAX_STEPS = 4


class EventKind(StrEnum):
    """What a :class:`ReplayEvent` records."""

    FIRED = "fired"  # a finding held for its rule's `for`
    RESOLVED = "resolved"  # a firing finding cleared for its `keep_firing_for`
    QUARANTINE = "quarantine"  # cordon/taint approved
    DRAIN = "drain"  # drain started
    TICKET = "ticket"  # replacement ticket requested
    HELD_BUDGET = "held_budget"  # a new quarantine refused: the pool's budget was used up
    HELD_BREAKER = "held_breaker"  # a new quarantine refused: the circuit breaker was tripped
    BREAKER_TRIP = "breaker_trip"
    RETURNED = "returned"  # handed back to service after validation
    CLEARED = "cleared"  # findings cleared before any action (or while blocked)
    DOMAIN_INCIDENT = "domain_incident"  # k of n nodes of one domain: one incident, one ticket


#: Event kinds that are healer's steps on a node (what ``exp_steps`` and reports count).
STEP_KINDS = frozenset({EventKind.QUARANTINE, EventKind.DRAIN, EventKind.TICKET})


@dataclass(frozen=True)
class ReplayEvent:
    """One thing healer would have done or seen: ``at`` (aware UTC), the node ("" for fleet-wide
    events), the rule responsible (None when no rule is), and a human ``detail``."""

    at: datetime
    node: str
    kind: EventKind
    rule: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class ReplaySettings:
    """The assumptions of a replay (see the module docstring).

    ``limits``: budget, breaker and windows; ``recovery_hold_seconds``: validation hold, seconds;
    ``fleet_size``: nodes in the fleet (None: the nodes seen in the data so far);
    ``repair_after_seconds``: a ticket's time to repair, seconds (None: not within the window).
    """

    limits: SafetyLimits = field(default_factory=SafetyLimits)
    recovery_hold_seconds: float = lc.DEFAULT_RECOVERY_HOLD_SECONDS
    fleet_size: int | None = None
    repair_after_seconds: float | None = None
    #: node → {kind: domain} and kind → threshold (:mod:`healer.engine.correlation`); empty: no
    #: correlation. ``kind_order``: the kinds, most specific first.
    topology: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    thresholds: Mapping[str, correlation.Threshold] = field(default_factory=dict)
    kind_order: tuple[str, ...] = ()


@dataclass
class _Node:
    """One node as the replay tracks it (what the database and the API server would hold)."""

    state: NodeState = NodeState.HEALTHY
    incident: lc.IncidentFacts | None = None
    unschedulable: bool = False
    owned: bool = False
    notified: set[str] = field(default_factory=set)
    ticket_at: datetime | None = None
    out_since: datetime | None = None
    out_rule: str | None = None


@dataclass
class _Domain:
    """A domain incident as the replay tracks it: its id, members, first bad node seen, and its
    one ticket's status and request time."""

    id: int
    members: set[str]
    first_seen: datetime
    ticket: TicketStatus = TicketStatus.SENT
    ticket_at: datetime | None = None


@dataclass(frozen=True)
class OutPeriod:
    """A node out of service (quarantined through validating) from ``start`` to ``end`` (None: still
    out when the window ended) because of ``rule``."""

    node: str
    rule: str | None
    start: datetime
    end: datetime | None


@dataclass(frozen=True)
class UnresolvedTally:
    """A rule's series that named no node over a replay: ``ticks`` that had any, ``series`` the
    most in one tick, and ``first``, the first such tick's report as ``healer evaluate`` gives it
    (its example, and why its address named no node). Such series act on nothing, so the replay
    undercounts the rule."""

    first: UnresolvedSeries
    ticks: int = 1
    series: int = 0

    @property
    def rule(self) -> str:
        return self.first.rule

    def counted(self, seen: UnresolvedSeries) -> UnresolvedTally:
        """This tally with one more tick's ``seen`` series."""
        return replace(self, ticks=self.ticks + 1, series=max(self.series, seen.count))


@dataclass(frozen=True)
class ReplayResult:
    """Everything a replay produced: events in time order, out-of-service periods, the window."""

    start: datetime | None
    end: datetime | None
    ticks: int
    events: list[ReplayEvent]
    out_periods: list[OutPeriod]
    nodes_seen: int
    #: Rules whose series named no node at some tick (by rule name, in rule order).
    unresolved: list[UnresolvedTally] = field(default_factory=list)


class Replay:
    """Feed ticks in time order with :meth:`tick`; read the outcome with :meth:`result`."""

    def __init__(self, ruleset: RuleSet, settings: ReplaySettings | None = None) -> None:
        self.ruleset = ruleset
        self.settings = settings or ReplaySettings()
        self._state = EvaluationState()
        self._nodes: dict[str, _Node] = {}
        self._seen: set[str] = set()
        self._events: list[ReplayEvent] = []
        self._periods: list[OutPeriod] = []
        self._tripped = False
        self._next_incident = 1
        self._start: datetime | None = None
        self._end: datetime | None = None
        self._ticks = 0
        self._unresolved: dict[str, UnresolvedTally] = {}
        self._domains: dict[correlation.DomainKey, _Domain] = {}
        self._next_domain = 1

    # -- public --

    def tick(
        self,
        at: datetime,
        results: Mapping[str, QueryResult | SourceError],
        *,
        fleet: Iterable[str] = (),
        addresses: AddressBook | None = None,
    ) -> TickFindings:
        """Advance one tick at ``at`` with every rule's result at that time; returns the findings.

        A rule missing from ``results`` is frozen for the tick (as a query the deadline cut off).
        ``fleet`` names nodes known to exist at ``at`` (they size the budget and the breaker).
        ``addresses`` checks each series' node label and names the node of one without by its
        ``instance``, as in :func:`~healer.engine.evaluation.evaluate`; series that still name no
        node are tallied (:attr:`ReplayResult.unresolved`).
        """
        self._start = self._start or at
        self._end = at
        self._ticks += 1
        ev = evaluate(
            ruleset=self.ruleset, results=results, previous=self._state, now=at, addresses=addresses
        )
        self._state = ev.state
        for rule, seen in ev.findings.unresolved.items():
            known = self._unresolved.get(rule)
            self._unresolved[rule] = (
                known.counted(seen) if known else UnresolvedTally(seen, series=seen.count)
            )
        for change in ev.changes:
            if change.kind in (ChangeKind.FIRED, ChangeKind.RESOLVED):
                kind = EventKind.FIRED if change.kind == ChangeKind.FIRED else EventKind.RESOLVED
                f = change.finding
                self._emit(at, f.node, kind, f.rule, f.summary or f.series_key)
        findings = ev.findings
        self._seen.update(findings.firing, findings.pending, findings.unknown)
        self._seen.update(fleet)
        for samples in results.values():
            if isinstance(samples, QueryResult):
                self._seen.update(
                    n for n in (_node_label(s.labels, self.ruleset) for s in samples.samples) if n
                )
        self._drain_pass(at)
        self._repairs(at)
        self._remediate(at, findings)
        return findings

    def result(self) -> ReplayResult:
        """The events and out-of-service periods so far (periods still open end None)."""
        periods = list(self._periods)
        for name, node in sorted(self._nodes.items()):
            if node.out_since is not None:
                periods.append(OutPeriod(name, node.out_rule, node.out_since, None))
        return ReplayResult(
            start=self._start,
            end=self._end,
            ticks=self._ticks,
            events=list(self._events),
            out_periods=periods,
            nodes_seen=len(self._seen),
            unresolved=[self._unresolved[r.name] for r in self.ruleset.rules if r.name in self._unresolved],
        )

    def state_of(self, node: str) -> NodeState:
        """The node's lifecycle state now (healthy when never seen)."""
        return self._nodes[node].state if node in self._nodes else NodeState.HEALTHY

    # -- the passes --

    def _drain_pass(self, at: datetime) -> None:
        """Draining nodes finish their drain (one round) and move on, as ``advance_drains`` does."""
        ctx = self._ctx(at)
        state = safety.SafetyState(settings=self.settings.limits, now=at)
        for name in sorted(n for n, node in self._nodes.items() if node.state == NodeState.DRAINING):
            node = self._nodes[name]
            facts = self._facts(name, node, None, drain=DrainReport(done=True), domains=self._linked())
            step = lc.decide(facts, ctx)
            if step is not None:
                self._take(at, name, node, step, state, facts)

    def _repairs(self, at: datetime) -> None:
        after = self.settings.repair_after_seconds
        if after is None:
            return
        for domain in self._domains.values():
            if domain.ticket_at is not None and at - domain.ticket_at >= timedelta(seconds=after):
                domain.ticket = TicketStatus.RESOLVED
        for node in self._nodes.values():
            inc = node.incident
            if (
                node.state == NodeState.AWAITING_REPAIR
                and inc is not None
                and node.ticket_at is not None
                and at - node.ticket_at >= timedelta(seconds=after)
            ):
                node.incident = replace(inc, ticket=TicketStatus.RESOLVED)

    def _remediate(self, at: datetime, findings: TickFindings) -> None:
        """The remediation pass: breaker once, then every candidate node in the controller's order."""
        names = set(findings.firing) | set(findings.pending) | set(findings.unknown)
        names |= {n for n, node in self._nodes.items() if node.state != NodeState.HEALTHY}
        fleet = self.settings.fleet_size or len(self._seen)
        domains = self._correlate(at, findings)
        names |= set(domains)
        keys = {n: f"domain-{d.id}" for n, d in domains.items() if d.ticket != TicketStatus.RESOLVED}
        verdict = safety.breaker(
            turned_bad=correlation.collapse(turned_bad(findings, self.ruleset), keys),
            fleet_size=fleet,
            settings=self.settings.limits,
            now=at,
        )
        if verdict.trip and not self._tripped:
            self._tripped = True
            self._emit(at, "", EventKind.BREAKER_TRIP, None, verdict.reason)
        out_nodes = frozenset(
            name
            for name, n in self._nodes.items()
            if n.state in OUT_OF_SERVICE
            or (
                n.state == NodeState.BLOCKED and n.incident is not None and n.incident.blocked_step == "drain"
            )
        )
        out = len({keys.get(n, n) for n in out_nodes})  # a domain's nodes count once
        state = safety.SafetyState(
            settings=self.settings.limits,
            now=at,
            breaker_tripped=self._tripped,
            pools={POOL: safety.PoolUsage(size=max(fleet, 1), out=out)},
            out_nodes=out_nodes,
            domains=keys,
        )
        states = {n: str(self._nodes[n].state) for n in names if n in self._nodes}
        ctx = self._ctx(at)
        for name in order(names, findings, states):
            node = self._nodes.setdefault(name, _Node())
            for i in range(MAX_STEPS):
                facts = self._facts(name, node, findings, domains=domains)
                if i == 0:
                    for notice in lc.notices(facts, ctx):
                        node.notified.update(
                            e.key for e in notice.effects if isinstance(e, lc.Event) and e.key
                        )
                step = lc.decide(facts, ctx)
                if step is None:
                    break
                moved, state = self._take(at, name, node, step, state, facts)
                if (
                    not moved
                    or step.to is None
                    or step.to
                    in (
                        NodeState.HEALTHY,
                        NodeState.RELEASED,
                        NodeState.BLOCKED,
                        NodeState.DRAINING,
                    )
                ):
                    break
        self._close_domains()

    def _correlate(self, at: datetime, findings: TickFindings) -> dict[str, lc.DomainFacts]:
        """Open the new domain incidents (one ticket each, at once) and add the nodes that joined
        open ones; returns node → its domain's facts."""
        if not self.settings.topology and not self._domains:
            return {}
        result = correlation.correlate(
            findings=correlation.bad_findings(findings, self.ruleset),
            topology=self.settings.topology,
            thresholds=self.settings.thresholds,
            now=at,
            already_open=[
                correlation.OpenDomain(k, frozenset(d.members), d.first_seen)
                for k, d in self._domains.items()
            ],
            kind_order=self.settings.kind_order,
        )
        out: dict[str, lc.DomainFacts] = {}
        for fault in result.faults:
            domain = self._domains.get(fault.key)
            if domain is None:
                domain = self._domains[fault.key] = _Domain(
                    self._next_domain, set(fault.nodes), fault.first_seen, ticket_at=at
                )
                self._next_domain += 1
                self._emit(
                    at,
                    "",
                    EventKind.DOMAIN_INCIDENT,
                    None,
                    f"{fault.key.kind} {fault.key.name}: {len(fault.nodes)} of {fault.size} node(s) "
                    f"({', '.join(fault.nodes)}): one domain incident, one ticket",
                )
            domain.members |= set(fault.nodes)
            facts = lc.DomainFacts(domain.id, fault.key.kind, fault.key.name, ticket=domain.ticket)
            for name in fault.nodes:
                out[name] = facts
                node = self._nodes.setdefault(name, _Node())
                inc = node.incident
                if inc is not None and inc.domain_id is None and domain.ticket != TicketStatus.RESOLVED:
                    node.incident = replace(inc, domain_id=domain.id)
        return out

    def _linked(self) -> dict[str, lc.DomainFacts]:
        """node → the open domain incident its incident is linked to (the drain pass's facts)."""
        by_id = {d.id: (k, d) for k, d in self._domains.items()}
        out: dict[str, lc.DomainFacts] = {}
        for name, node in self._nodes.items():
            inc = node.incident
            if inc is not None and inc.domain_id in by_id:
                key, d = by_id[inc.domain_id]
                out[name] = lc.DomainFacts(d.id, key.kind, key.name, ticket=d.ticket)
        return out

    def _close_domains(self) -> None:
        """A domain incident with no member incident linked to it any more is over."""
        linked = {n.incident.domain_id for n in self._nodes.values() if n.incident is not None}
        for key in [k for k, d in self._domains.items() if d.id not in linked]:
            del self._domains[key]

    # -- one step --

    def _take(
        self,
        at: datetime,
        name: str,
        node: _Node,
        step: lc.Step,
        state: safety.SafetyState,
        facts: lc.NodeFacts,
    ) -> tuple[bool, safety.SafetyState]:
        """Judge ``step`` and apply it to the in-memory node; returns (applied, safety state)."""
        domain = facts.domain
        request = safety.Request(
            node=name,
            kind=step.kind,
            pool=POOL,
            already_out=step.already_out or node.state in OUT_OF_SERVICE,
            domain=f"domain-{domain.id}" if domain and domain.ticket != TicketStatus.RESOLVED else "",
        )
        decision, state = safety.judge(request, state)
        rule = _step_rule(step, facts, node)
        if not decision.approved:
            if decision.blocks:
                kind = (
                    EventKind.HELD_BREAKER
                    if decision.reason == safety.Refusal.BREAKER
                    else EventKind.HELD_BUDGET
                )
                if node.state != NodeState.BLOCKED:
                    self._emit(at, name, kind, rule, decision.message)
                    inc = node.incident
                    if inc is not None and inc.blocked_step is None:
                        node.incident = replace(inc, blocked_step="quarantine")
                    node.state = NodeState.BLOCKED
            return False, state
        if step.new_incident or (step.open_incident and node.incident is None):
            new_id = self._next_incident
            self._next_incident += 1
        else:
            new_id = None
        node.incident = lc.apply_memory(node.incident, step, new_id=new_id)
        for effect in step.effects:
            if isinstance(effect, lc.Cordon):
                node.unschedulable, node.owned = True, True
            elif isinstance(effect, lc.Release):
                if node.owned:
                    node.unschedulable = False
                node.owned = False
            elif isinstance(effect, lc.StartDrain):
                self._emit(at, name, EventKind.DRAIN, effect.rule, "drain started")
            elif isinstance(effect, lc.RequestTicket):
                node.ticket_at = at
                if node.incident is not None:
                    node.incident = replace(node.incident, ticket=TicketStatus.SENT)
                self._emit(at, name, EventKind.TICKET, rule, f"ticket to provider {effect.provider}")
        if step.kind == lc.StepKind.QUARANTINE and step.to == NodeState.QUARANTINED:
            self._emit(at, name, EventKind.QUARANTINE, rule, step.reason)
        if step.row == "return to service":
            self._emit(at, name, EventKind.RETURNED, rule, step.reason)
        if step.row in ("cleared before action", "cleared while blocked"):
            self._emit(at, name, EventKind.CLEARED, rule, step.reason)
        if step.to is not None:
            self._move(at, name, node, step.to, rule)
        return True, state

    def _move(self, at: datetime, name: str, node: _Node, to: NodeState, rule: str | None) -> None:
        was_out = node.state in OUT_OF_SERVICE
        now_out = to in OUT_OF_SERVICE
        if now_out and not was_out:
            node.out_since, node.out_rule = at, rule
        elif was_out and not now_out and node.out_since is not None:
            self._periods.append(OutPeriod(name, node.out_rule, node.out_since, at))
            node.out_since, node.out_rule = None, None
        if to == NodeState.HEALTHY:
            node.ticket_at = None
        node.state = to

    # -- helpers --

    def _ctx(self, at: datetime) -> lc.Context:
        return lc.Context(
            rules=self.ruleset, now=at, recovery_hold_seconds=self.settings.recovery_hold_seconds
        )

    def _facts(
        self,
        name: str,
        node: _Node,
        findings: TickFindings | None,
        *,
        drain: DrainReport | None = None,
        domains: Mapping[str, lc.DomainFacts] | None = None,
    ) -> lc.NodeFacts:
        f = findings
        domain = (domains or {}).get(name)
        inc = node.incident
        if domain and inc is not None and inc.domain_id is None and domain.ticket != TicketStatus.RESOLVED:
            node.incident = replace(inc, domain_id=domain.id)
        return lc.NodeFacts(
            name=name,
            state=node.state,
            incident=node.incident,
            firing=tuple(f.firing.get(name, ())) if f else (),
            pending=tuple(f.pending.get(name, ())) if f else (),
            unknown=name in f.unknown if f else False,
            frozen_rules=f.frozen_rules if f else frozenset(),
            view=NodeView(name=name, unschedulable=node.unschedulable),
            drain_due=drain is not None,
            drain=drain,
            notified=frozenset(node.notified),
            owned=node.owned,
            domain=domain,
        )

    def _emit(self, at: datetime, node: str, kind: EventKind, rule: str | None, detail: str) -> None:
        self._events.append(ReplayEvent(at=at, node=node, kind=kind, rule=rule, detail=detail))


def _step_rule(step: lc.Step, facts: lc.NodeFacts, node: _Node) -> str | None:
    """The rule a step acts for: the memory's rule, the incident's, or the strongest firing one."""
    if step.memory.rule is not None:
        return step.memory.rule
    if node.incident is not None and node.incident.rule is not None:
        return node.incident.rule
    for effect in step.effects:
        if isinstance(effect, lc.StartDrain):
            return effect.rule
    if facts.firing:
        return facts.firing[0].rule
    return facts.pending[0].rule if facts.pending else None


def _node_label(labels: Mapping[str, str], ruleset: RuleSet) -> str | None:
    """The node a sample names under the first rule's node label chain (fleet size counting)."""
    return node_of(labels, ruleset.rules[0].node_labels) if ruleset.rules else None
