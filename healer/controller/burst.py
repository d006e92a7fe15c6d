"""The burst job: capacity rules open and close burst nodes, and pods come back at a pace.

Every ``scheduler.burst_interval_seconds`` the leader, for each enabled capacity rule
(:mod:`healer.ruleset.capacity`): lists the nodes (the watched store) and the pods requesting GPUs
(:meth:`healer.actions.burst.KubernetesBurst.gpu_pods`), computes the cluster's free GPUs
(:func:`healer.engine.capacity.capacity`: quarantined and burst nodes excluded), and runs the burst
state machine (:func:`healer.engine.burst.step`) for each burst node. A toggle puts healer's burst
taint on (closed) or takes it off (open) and is recorded in ``burst_transitions`` with the capacity
numbers as evidence: ``succeeded``, ``failed``, ``dry_run`` (the port changed nothing), or
``recorded`` (nothing to change: a human's change to the taint, or healer taking the node back).

On a closed burst node the pods that may come back (:func:`healer.engine.capacity.plan_returns`)
are evicted one at a time, at most one a run and one every ``60 / return.pods_per_minute`` seconds
per rule (the pace is strict: no minute sees more; it counts from when the API server answered the
previous eviction, on this process's monotonic clock, so a run slower to reach its eviction than
the one before cannot bring two closer together; after a restart or a takeover, whose recorded
return was timed by another clock, from the first run that sees it), each an ``actions`` row of kind
``burst_return``; none while a pod requesting GPUs is pending (the last one sent back is not placed
yet, so the free GPUs it counted on are not known to be there). A pod that cannot come back stays,
is listed on the dashboard with why, and is logged once.

The last observation (capacity, per node its state and the pods out) is the ``burst`` switch, which
the dashboard and ``/metrics`` read. The timers of the state machine live in this object: a restart
starts them over (a toggle is delayed, never hurried); the state and ``by_hand`` come back from
the latest recorded transition.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.actions.burst import EFFECT, BurstPort
from healer.controller.fence import Fence
from healer.engine.burst import short, step
from healer.engine.capacity import ReturnPlan, capacity, plan_returns
from healer.errors import KubernetesError
from healer.model.burst import BurstDecision, BurstMemory, BurstState, Capacity, Claim, PodFacts
from healer.model.node import NodeView
from healer.model.states import ActionStatus
from healer.ruleset.capacity import CapacityRule
from healer.store import burst as store
from healer.store import nodes as repo
from healer.store.models import BurstTransition, Node
from healer.store.session import transaction

log = logging.getLogger(__name__)

#: ``burst_transitions.status`` of a move that changed nothing on the node.
RECORDED = "recorded"
#: Seconds a pod sent back holds its GPUs in the plan at most, when no replacement shows up (its
#: controller scaled down, or the pod list lags).
CLAIM_SECONDS = 60.0


def burst_selector(rules: Sequence[CapacityRule]) -> Callable[[dict[str, str]], str | None]:
    """node labels → the name of the capacity rule whose burst node it is (None: not a burst node).
    Every rule counts, enabled or not: a burst node is never in-cluster capacity, and never a
    health rule's to quarantine (:mod:`healer.engine.safety`)."""

    def which(labels: dict[str, str]) -> str | None:
        return next((r.name for r in rules if r.selects(labels)), None)

    return which


@dataclass
class BurstSync:
    """One process's burst job. Build it in :mod:`healer.wiring`; the controller calls :meth:`run`.

    ``nodes`` lists every node (``KubernetesNodeActions.list_nodes``); ``kueue_pending`` counts
    Kueue's pending workloads (None: not read, a rule asking for it sees 0).
    """

    port: BurstPort
    nodes: Callable[[], list[NodeView]]
    sessions: sessionmaker[Session]
    domain: str
    actor: str = "healer"
    kueue_pending: Callable[[], int] | None = None
    memory: dict[tuple[str, str], BurstMemory] = field(default_factory=dict)
    #: Per rule, when the API server answered the last eviction sent back, in ``clock`` seconds.
    answered: dict[str, float] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    #: Pods sent back, by uid: never sent twice, and their GPUs spoken for until their replacement
    #: shows up (:class:`~healer.model.burst.Claim`, at most :data:`CLAIM_SECONDS`).
    sent: dict[str, Claim] = field(default_factory=dict)
    _stuck_logged: set[str] = field(default_factory=set)
    _kueue_error: str = ""

    def run(self, rules: Sequence[CapacityRule], now: datetime, *, fence: Fence | None = None) -> None:
        """One run at ``now`` over the capacity ``rules`` (disabled ones are only burst nodes).

        Listing the nodes or pods failing ends the run (logged): nothing is decided without them.
        """
        fence = fence or Fence()
        active = [r for r in rules if r.enabled]
        if not active:
            return
        try:
            views = self.nodes()
            pods = self.port.gpu_pods()
        except KubernetesError as exc:
            log.warning("burst: cannot list nodes or pods, nothing decided: %s", exc)
            return
        kueue = self._kueue(active)
        which = burst_selector(rules)
        with self.sessions() as session:
            states = {name: str(state) for name, state in session.execute(select(Node.name, Node.state))}
            last = store.last_transitions(session)
            last_return = store.last_return_at(session)
        self.sent = {uid: c for uid, c in self.sent.items() if (now - c.at).total_seconds() < 3600}
        claims = [
            c.gpus
            for c in self.sent.values()
            if (now - c.at).total_seconds() < CLAIM_SECONDS and not c.replaced(pods)
        ]
        report: list[dict[str, Any]] = []
        for rule in active:
            cap = capacity(
                views,
                pods,
                is_burst=lambda v: which(v.labels) is not None,
                domain=self.domain,
                in_cluster=lambda v, r=rule: r.in_cluster(v.labels),  # type: ignore[misc]
                counts_pending=lambda p, r=rule: r.counts_pending(p.namespace),  # type: ignore[misc]
                states=states,
                kueue_pending=kueue,
            )
            nodes: list[dict[str, Any]] = []
            for view in (v for v in views if rule.selects(v.labels)):
                nodes.append(
                    self._node(
                        rule,
                        view,
                        cap,
                        (last.get((rule.name, view.name)), last_return),
                        (pods, claims),
                        now,
                        fence,
                    )
                )
            report.append(
                {"rule": rule.name, "short": short(cap, rule), "capacity": cap.evidence(), "nodes": nodes}
            )
        with transaction(self.sessions) as session:
            fence.check_db(session)
            repo.set_switch(
                session, store.SWITCH_BURST, {"at": now.isoformat(), "rules": report}, now=now, by=self.actor
            )

    def _kueue(self, rules: Sequence[CapacityRule]) -> int | None:
        if self.kueue_pending is None or not any(r.open.kueue_pending_workloads for r in rules):
            return None
        try:
            pending = self.kueue_pending()
        except KubernetesError as exc:
            if str(exc) != self._kueue_error:  # said once, not every run
                log.warning("burst: Kueue workloads not read (that signal counts 0): %s", exc)
            self._kueue_error = str(exc)
            return None
        self._kueue_error = ""
        return pending

    def _node(
        self,
        rule: CapacityRule,
        view: NodeView,
        cap: Capacity,
        recorded: tuple[BurstTransition | None, datetime | None],
        cluster: tuple[list[PodFacts], list[int]],
        now: datetime,
        fence: Fence,
    ) -> dict[str, Any]:
        """One burst node: decide and toggle, then send one pod back if it is closed; its report.
        ``recorded``: its latest transition and the latest return; ``cluster``: the GPU pods and
        the GPUs of the pods sent back whose replacement is not seen yet."""
        row, last_return = recorded
        pods, claims = cluster
        key = (rule.name, view.name)
        tainted = any(t[0] == self.port.taint_key for t in view.taints)
        seen = BurstState.CLOSED if tainted else BurstState.OPEN
        memory = self.memory.get(key) or (
            BurstMemory(BurstState(row.to_state), by_hand=row.by_hand)
            if row is not None
            else BurstMemory(seen)
        )
        acting = self.port.status is ActionStatus.SUCCEEDED
        trusted = acting and row is not None and row.status in (ActionStatus.SUCCEEDED, RECORDED)
        if trusted and seen is not memory.state:
            # The watched store may lag healer's own last write: a human's change is confirmed by
            # a read of the node now.
            try:
                tainted = any(t[0] == self.port.taint_key for t in self.port.read_node(view.name).taints)
            except KubernetesError as exc:
                log.warning("burst: node %s not read: %s", view.name, exc)
                return {"node": view.name, "state": str(memory.state), "by_hand": memory.by_hand, "out": []}
            seen = BurstState.CLOSED if tainted else BurstState.OPEN
        observed = seen if trusted else None
        decision = step(memory, cap, rule, now, observed=observed)
        kept = decision.memory
        if decision.toggle is not None:
            if not self._toggle(rule, view, memory, decision, cap, now, fence):
                kept = BurstMemory(memory.state, memory.by_hand, kept.short_since, kept.free_since)
            elif decision.act and acting:
                tainted = decision.toggle is BurstState.CLOSED
        self.memory[key] = kept
        try:
            on_node = self.port.pods_on(view.name)
        except KubernetesError as exc:
            log.warning("burst: pods on %s not listed: %s", view.name, exc)
            on_node = []
        on_node = [p for p in on_node if p.uid not in self.sent]
        plan = plan_returns(
            on_node, cap.free_by_node, taint=(self.port.taint_key, rule.name, EFFECT), claims=claims
        )
        waiting = ""
        closed = kept.state is BurstState.CLOSED and (tainted or not acting)
        if closed:
            waiting = self._return(rule, view.name, plan, cap, (last_return, pods), now, fence)
            self._log_stuck(rule, view.name, plan)
        return {
            "node": view.name,
            "state": str(kept.state),
            "by_hand": kept.by_hand,
            "out": [
                {"pod": p.key, "gpus": p.gpus, "phase": p.phase} for p in plan.out if p.uid not in self.sent
            ],
            "stay": plan.stay if closed else {},
            "waiting": waiting,
        }

    def _toggle(
        self,
        rule: CapacityRule,
        view: NodeView,
        before: BurstMemory,
        decision: BurstDecision,
        cap: Capacity,
        now: datetime,
        fence: Fence,
    ) -> bool:
        """Make and record one toggle; False when the taint could not be changed (retried next run)."""
        assert decision.toggle is not None
        status: str = RECORDED
        error = None
        if decision.act:
            fence.check()
            status = str(self.port.status)
            try:
                value = rule.name if decision.toggle is BurstState.CLOSED else None
                self.port.set_taint(view.name, value=value)
            except KubernetesError as exc:
                status, error = ActionStatus.FAILED, str(exc)[:500]
        with transaction(self.sessions) as session:
            fence.check_db(session)
            store.record_transition(
                session,
                rule=rule.name,
                node=view.name,
                from_state=str(before.state),
                to_state=str(decision.toggle),
                by_hand=decision.memory.by_hand,
                status=str(status),
                actor=self.actor,
                reason=decision.reason,
                error=error,
                evidence=cap.evidence(),
                at=now,
                holder=fence.holder,
                fencing_token=fence.token,
            )
        level = logging.WARNING if error else logging.INFO
        log.log(
            level,
            "burst %s node %s: %s (%s)%s",
            rule.name,
            view.name,
            decision.reason,
            status,
            f": {error}" if error else "",
        )
        return error is None

    def _return(
        self,
        rule: CapacityRule,
        node: str,
        plan: ReturnPlan,
        cap: Capacity,
        seen: tuple[datetime | None, list[PodFacts]],
        now: datetime,
        fence: Fence,
    ) -> str:
        """Send back at most one pod of ``plan`` if the pace allows; returns what the returns wait
        for ("": nothing). ``seen``: the latest recorded return, and the GPU pods now."""
        last_return, pods = seen
        if not plan.back:
            return ""
        if cap.pending_gpu_pods:
            pending = cap.pending_gpu_pods
            return f"{pending} pod(s) requesting GPUs pending: the next returns once they are placed"
        spacing = 60.0 / rule.return_.pods_per_minute
        answered = self.answered.get(rule.name)
        if answered is None and last_return is not None:
            # A return recorded before this process sent one (a restart, another replica): its time
            # is another clock's, so the pace counts from now, as if it had just been answered.
            answered = self.answered[rule.name] = self.clock()
        wait = spacing - (self.clock() - answered) if answered is not None else 0.0
        if wait > 0:
            return f"the pace: next return at {(now + timedelta(seconds=wait)).isoformat()}"
        pod = plan.back[0]
        fence.check()
        outcome, message = self.port.return_pod(pod)
        if outcome in ("budget", "rate_limited"):
            return f"{pod.key}: {message}"
        self.answered[rule.name] = self.clock()
        status = {
            "evicted": ActionStatus.SUCCEEDED,
            "gone": ActionStatus.SUCCEEDED,
            "dry_run": ActionStatus.DRY_RUN,
        }
        siblings = frozenset(p.uid for p in pods if pod.owner_uid and p.owner_uid == pod.owner_uid)
        self.sent[pod.uid] = Claim(pod.uid, pod.gpus, now, pod.owner_uid, siblings)
        with transaction(self.sessions) as session:
            fence.check_db(session)
            repo.record_action(
                session,
                kind=store.RETURN_KIND,
                status=status.get(outcome, ActionStatus.FAILED),
                actor=self.actor,
                now=now,
                target=f"pod/{pod.key}",
                error=message or None,
                detail={
                    "rule": rule.name,
                    "node": node,
                    "pod": pod.key,
                    "gpus": pod.gpus,
                    "outcome": outcome,
                    "pods_per_minute": rule.return_.pods_per_minute,
                    "free_gpus": cap.free_gpus,
                },
            )
        log.info("burst %s: pod %s back from %s (%s)", rule.name, pod.key, node, outcome)
        return ""

    def _log_stuck(self, rule: CapacityRule, node: str, plan: ReturnPlan) -> None:
        """Log once each pod that cannot come back for want of capacity (it stays on the burst node)."""
        for key, why in plan.stay.items():
            if why.startswith("no capacity") and key not in self._stuck_logged:
                self._stuck_logged.add(key)
                log.warning("burst %s: pod %s stays on %s: %s", rule.name, key, node, why)
