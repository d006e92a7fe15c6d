"""The two passes the scheduler runs (only the leader, each with ``now``), both through
:meth:`~healer.controller.reconcile.Reconciler.reconcile_all`:

* :func:`remediate` (every tick, after evaluation): sync the fleet, judge the circuit breaker once,
  then reconcile every node with findings or not healthy;
* :func:`advance_drains` (every ``scheduler.drain_interval_seconds``): reconcile every ``draining``
  node with a drain round due: one ``kubectl drain`` step, then the step its report calls for
  (done → ``awaiting_repair`` + ticket; past the deadline → ``blocked`` with the pods and
  PodDisruptionBudgets named and a ``HealerDrainBlocked`` Event).

Everything needed to resume lives in the database (state, incident, drain start and options,
ownership, recovery clock) and on the node (ownership annotations), so a new process picks up a
drain where the old one left it (Cluster API MachineHealthCheck measures from persisted times for
the same reason). A node whose reconcile failed is backed off (:mod:`healer.controller.backoff`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.actions.base import NodeActions
from healer.actions.validation import Validator
from healer.config import Settings
from healer.controller import domains as domain_facts
from healer.controller import fleet as fleet_facts
from healer.controller import repair, sticky_values
from healer.controller.backoff import Backoff
from healer.controller.fence import Fence
from healer.controller.observe import Labels, Seen, read_all
from healer.controller.reconcile import NodeOutcome, Reconciler
from healer.engine import correlation as engine_correlation
from healer.engine import pools as engine_pools
from healer.engine import safety
from healer.engine import sticky as engine_sticky
from healer.model.findings import TickFindings
from healer.model.states import ActionStatus, NodeState
from healer.ruleset.schema import RuleSet
from healer.store import nodes as repo
from healer.store.models import Node
from healer.store.session import transaction

log = logging.getLogger(__name__)


@dataclass
class RemediationResult:
    """One pass: per-node outcomes and the switches."""

    at: datetime
    outcomes: list[NodeOutcome] = field(default_factory=list)
    paused: bool = False
    breaker_tripped: bool = False
    breaker: safety.BreakerVerdict | None = None
    held: list[str] = field(default_factory=list)  # nodes the breaker held back (all so far)
    domains: domain_facts.Domains = field(default_factory=domain_facts.Domains)

    def states(self) -> dict[str, str]:
        """node → the state it ended in (nodes that moved)."""
        return {o.node: o.to_state for o in self.outcomes if o.to_state is not None}

    def refused(self) -> dict[str, str]:
        """node → the last refusal reason (``budget``, ``breaker``, ``paused`` ...)."""
        return {o.node: o.refused for o in self.outcomes if o.refused}


def _reconciler(
    settings: Settings,
    pass_inputs: tuple[RuleSet, NodeActions, sessionmaker[Session], datetime, str],
    *,
    findings: TickFindings | None = None,
    recovery_hold_seconds: float | None = None,
    fence: Fence | None = None,
    validator: Validator | None = None,
) -> Reconciler:
    """The pass's reconciler from (rules, actions, sessions, now, actor) and the settings."""
    rules, actions, sessions, now, actor = pass_inputs
    k = settings.kubernetes
    hold = settings.safety.recovery_hold_seconds if recovery_hold_seconds is None else recovery_hold_seconds
    return Reconciler(
        rules=rules,
        actions=actions,
        sessions=sessions,
        labels=Labels(
            domain=k.domain,
            opt_out_label=k.opt_out_label,
            pool_label=k.pool_label,
            pool_fallback_labels=tuple(k.pool_fallback_labels),
            burst_nodes=tuple((c.name, tuple(sorted(c.burst_nodes.items()))) for c in rules.capacity),
        ),
        now=now,
        actor=actor,
        recovery_hold_seconds=hold,
        findings=findings,
        fence=fence or Fence(),
        repair=repair.publisher(settings),
        xid_catalog=repair.xid_catalog(settings),
        validator=validator,
    )


def _reconcile_all(
    rec: Reconciler,
    names: list[str],
    seen: Mapping[str, Seen],
    state: safety.SafetyState,
    result: RemediationResult,
    backoff: Backoff,
    states: Mapping[str, str],
    **kw: object,
) -> None:
    """Reconcile the nodes read (in ``names``' order; those backing off were not read), and keep
    each node's outcome and backoff."""
    readable = [(name, seen[name]) for name in names if name in seen and seen[name].error is None]
    _, outcomes = rec.reconcile_all(readable, state, **kw)  # type: ignore[arg-type]
    reconciled = {o.node: o for o in outcomes}
    for name in names:
        if name not in seen:
            continue  # backing off
        error = seen[name].error
        outcome = reconciled.get(name) or NodeOutcome(
            name, states.get(name, NodeState.HEALTHY), None, error=error
        )
        result.outcomes.append(outcome)
        if outcome.error:
            backoff.failed(name, outcome.error, rec.now)
        else:
            backoff.succeeded(name)


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
    backoff: Backoff | None = None,
    fence: Fence | None = None,
    coverage: Mapping[str, frozenset[str]] | None = None,
    node_labels: Mapping[str, Mapping[str, str]] | None = None,
    validator: Validator | None = None,
    topology: engine_correlation.Topology | None = None,
) -> RemediationResult:
    """Advance every node with findings or not healthy by up to ``MAX_STEPS_PER_TICK`` steps.

    Args:
        findings: this tick's findings (``healer.engine.evaluation``).
        rules: the rule set the findings came from (actions, drain options, recovery hold).
        actions: the Kubernetes adapter (or the dry-run recorder); every call is idempotent.
        session_factory: short transactions, committed before every wave of cluster writes (see
            :meth:`Reconciler.reconcile_all`).
        settings: ``safety`` (budget, breaker, windows) and ``kubernetes`` (opt-out and pool
            labels, annotation domain).
        now: the tick's time (aware UTC).
        actor: who the transitions and actions are recorded as.
        fleet: node → pool of every node in the cluster, when known (sizes the budget's % and the
            breaker's %, both per pool); otherwise the nodes healer has recorded.
        recovery_hold_seconds: how long a validating node must stay clear before it is handed
            back, counted from when its last finding resolved (after the rule's ``keep_firing_for``);
            default ``settings.safety.recovery_hold_seconds``.
        backoff: the controller's per-node backoff (nodes failing recently are skipped).
        fence: the leader's fence (``healer.controller.fence``); raises ``NotLeader`` from the
            first write or record after this replica stopped leading. None: unfenced (CLI, tests).
        coverage: rule → the nodes exporting its input metrics (:mod:`healer.coverage`);
            the budget and the breaker count over each rule's pool (:mod:`healer.engine.pools`).
            None, or a rule missing: the labelled pools.
        node_labels: node → its Kubernetes labels, for rules naming their pool by
            ``pool.node_selector``; None: such rules count over the labelled pools.
        validator: validation Jobs (``healer.actions.validation``): every return to service waits
            for one to pass. None: the recovery hold alone decides.
        topology: node → {kind: domain} (:mod:`healer.topology`): k of n nodes of one domain bad
            together are one domain incident (:mod:`healer.controller.domains`), counted once by
            the budget and the breaker. None: no correlation.

    Returns:
        The per-node outcomes, pause and breaker status, and the nodes the breaker holds.

    The circuit breaker is judged once per tick, before any node moves; when it trips, no node
    is quarantined that tick or after until ``healer breaker reset``. A quiet tick (no candidates)
    costs a constant number of SQL statements whatever the fleet's size.
    """
    backoff = backoff or Backoff()
    limits = settings.safety.limits()
    inputs = (rules, actions, session_factory, now, actor)
    rec = _reconciler(
        settings,
        inputs,
        findings=findings,
        recovery_hold_seconds=recovery_hold_seconds,
        fence=fence,
        validator=validator,
    )
    result = RemediationResult(at=now)
    synced: dict[str, str] | None = None  # node → pool of every row, once the fleet is synced
    with transaction(session_factory) as session:
        if fleet:
            synced = repo.sync_nodes(session, fleet, now=now, fleet_wide=True)
        names = fleet_facts.candidates(session, findings)
    seen = read_all(actions, [name for name in names if not backoff.waiting(name, now)])
    with transaction(session_factory) as session:
        pools = {name: rec.labels.pool(s.view) for name, s in seen.items() if s.view is not None}
        pools = {name: pool for name, pool in pools.items() if not fleet or fleet.get(name) != pool}
        if pools:
            repo.sync_nodes(session, pools, now=now, fleet_wide=False)
        rows = session.execute(select(Node.name, Node.state).where(Node.name.in_(names)))
        states: dict[str, str] = {name: st for name, st in rows}
        paused = bool(repo.get_switch(session, repo.SWITCH_PAUSED).get("paused", False))
        breaker_row = repo.get_switch(session, repo.SWITCH_BREAKER)
        # The budget counts over the nodes healer has recorded (as the dashboard shows them); the
        # breaker's percentage over the cluster's nodes now, when listed. After a fleet-wide sync
        # its answer is every row already, read a few milliseconds ago: no second SELECT of all
        # of them (a row the CLI adds in between counts from the next tick).
        recorded: dict[str, str] = (
            {**synced, **pools}
            if synced is not None
            else {name: pool for name, pool in session.execute(select(Node.name, Node.pool))}
        )
        node_pools = dict(fleet) if fleet else recorded
        fleet_size = len(node_pools)
        sticky_rules = sticky_values.sticky_rule_names(rules)
        baselines = sticky_values.baselines(session, findings)
        current = engine_sticky.discount_tick(findings, baselines, sticky_rules)
        firing: dict[str, set[str]] = {}
        for node, found in findings.firing.items():
            for f in found:
                firing.setdefault(f.rule, set()).add(node)

        def pools_over(labelled: Mapping[str, str]) -> engine_pools.Pools:
            return engine_pools.build(
                rules=rules, labelled=labelled, coverage=coverage, node_labels=node_labels, firing=firing
            )

        rec.pools = pools_over(recorded)
        by_fleet = pools_over(node_pools) if node_pools != recorded else rec.pools
        _remember_pools(session, rec.pools, now=now, actor=actor, fence=rec.fence)
        domains = domain_facts.correlate(
            session,
            findings=current,
            rules=rules,
            topology=topology or {},
            settings=settings.topology,
            now=now,
            actor=actor,
            fence=rec.fence,
        )
        rec.domains = domains.facts
        keys = domains.keys()
        bad_on = fleet_facts.turned_bad_on(current, rules)
        bad_in = {n: by_fleet.pools_of(n, per_rule) for n, per_rule in bad_on.items()}
        for node in sorted(bad_on, reverse=True):  # a domain counts in its first node's pools
            if node in keys:
                bad_in[keys[node]] = bad_in[node]
        verdict = safety.breaker(
            turned_bad=engine_correlation.collapse(
                {n: min(per_rule.values()) for n, per_rule in bad_on.items()}, keys
            ),
            fleet_size=fleet_size,
            settings=limits,
            now=now,
            reset_at=fleet_facts.parse_time(breaker_row.get("reset_at")),
            members=by_fleet.members,
            bad_in=bad_in,
        )
        tripped = bool(breaker_row.get("tripped"))
        if not tripped and verdict.trip:
            rec.fence.check_db(session)
            tripped = True
            breaker_row = {
                "tripped": True,
                "reason": verdict.reason,
                "tripped_at": now.isoformat(),
                "held": [],
                "nodes": list(verdict.nodes),
                "pool": verdict.pool,
                "pool_nodes": verdict.fleet_size,  # the denominator of the percentage
                "bad_nodes": verdict.count,
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
        rec.held = list(breaker_row.get("held", [])) if tripped else []
        out_nodes = fleet_facts.out_of_service(session) if names else frozenset()
    state = safety.SafetyState(
        settings=limits,
        now=now,
        paused=paused,
        breaker_tripped=tripped,
        members=rec.pools.members,
        out_nodes=out_nodes,
        domains=keys,
    )
    result.paused, result.breaker_tripped, result.breaker = paused, tripped, verdict
    held_before = list(rec.held)
    _reconcile_all(rec, fleet_facts.order(names, findings, states), seen, state, result, backoff, states)
    if domains.facts:
        with transaction(session_factory) as session:
            domain_facts.settle(
                session,
                domains=domains,
                findings=current,
                settings=settings.topology,
                now=now,
                actor=actor,
                paused=paused,
                fence=rec.fence,
            )
    result.domains = domains
    if tripped and rec.held != held_before:
        with transaction(session_factory) as session:
            rec.fence.check_db(session)
            row = repo.get_switch(session, repo.SWITCH_BREAKER)
            row["held"] = sorted(set(row.get("held", [])) | set(rec.held))
            repo.set_switch(session, repo.SWITCH_BREAKER, row, now=now, by=actor)
    result.held = sorted(rec.held)
    return result


def _remember_pools(
    session: Session, pools: engine_pools.Pools, *, now: datetime, actor: str, fence: Fence
) -> None:
    """Keep the tick's rule pools in the ``pools`` switch for the dashboard (written on a change)."""
    value = {
        "pools": [
            {
                "name": name,
                "kind": kind,
                "rules": list(pools.rules.get(name, ())),
                "nodes": sorted(pools.members[name]),
            }
            for name, kind in sorted(pools.kinds.items())
            if kind != engine_pools.LABELS
        ]
    }
    if repo.get_switch(session, repo.SWITCH_POOLS) != value:
        fence.check_db(session)
        repo.set_switch(session, repo.SWITCH_POOLS, value, now=now, by=actor)


def advance_drains(
    *,
    rules: RuleSet,
    actions: NodeActions,
    session_factory: sessionmaker[Session],
    settings: Settings,
    now: datetime,
    actor: str = "healer",
    backoff: Backoff | None = None,
    fence: Fence | None = None,
) -> RemediationResult:
    """One drain round for every ``draining`` node, resumed from the database.

    The drain's start (its deadline runs from there), its options (the rule's at start) and the
    incident are read from the ``incidents`` row, so a restarted controller goes on where the last
    one stopped, without repeating what was done. A node a human uncordoned is not drained: it
    becomes ``released``. A paused controller or a maintenance window skips the round (refusal
    recorded once); the deadline keeps running.
    """
    backoff = backoff or Backoff()
    rec = _reconciler(settings, (rules, actions, session_factory, now, actor), fence=fence)
    result = RemediationResult(at=now)
    with transaction(session_factory) as session:
        names = [n.name for n in repo.nodes_in_states(session, [NodeState.DRAINING])]
        paused = bool(repo.get_switch(session, repo.SWITCH_PAUSED).get("paused", False))
        result.breaker_tripped = bool(repo.get_switch(session, repo.SWITCH_BREAKER).get("tripped"))
        rec.domains = domain_facts.linked_facts(session, names, settings.topology)
    result.paused = paused
    state = safety.SafetyState(settings=settings.safety.limits(), now=now, paused=paused)
    seen = read_all(actions, [name for name in names if not backoff.waiting(name, now)])
    states = dict.fromkeys(names, NodeState.DRAINING.value)
    _reconcile_all(rec, names, seen, state, result, backoff, states, max_steps=2, drain_due=True)
    return result
