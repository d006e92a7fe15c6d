"""The Kueue quota sync job: nodes and database in, ClusterQueue quotas out (``kueue.enabled``).

Every ``kueue.interval_seconds`` the leader lists the nodes (one call), reads the node states it
recorded (one query), computes each flavor's healthy capacity and, per managed ClusterQueue, what
:func:`healer.engine.quota.decide` wants; the changes of one ClusterQueue go in one server-side
apply (:mod:`healer.actions.kueue`). Each change is an ``actions`` row (kind ``kueue_quota``,
target ``clusterqueue/<name>``, detail: flavor, resource, from, to, capacity, reason), with status
``succeeded``, ``failed`` or, in dry-run, ``dry_run``: the quota healer would set.

The hysteresis clock (when a shortfall was first seen) lives in this object: a restarted controller
starts it again, which only delays a lowering, never hurries one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.actions.gpu_isolation import IsolationPort
from healer.actions.kueue import QuotaPort
from healer.config import KueueSettings
from healer.controller.fence import Fence
from healer.engine.quota import decide, healthy_capacity
from healer.errors import KubernetesError
from healer.metrics import HealerMetrics
from healer.model.node import NodeView
from healer.model.quota import QuotaDecision
from healer.model.states import ActionStatus
from healer.store import nodes as repo
from healer.store.models import Node
from healer.store.session import transaction

log = logging.getLogger(__name__)

#: The ``actions.kind`` of a quota change.
ACTION_KIND = "kueue_quota"


def count_out(isolation: IsolationPort) -> Callable[[], dict[str, int]]:
    """node → how many GPUs ``isolation`` has out now (one read per call: DeviceTaintRules or the
    nodes' ``gpus-out`` annotation, or in dry-run what healer would have out)."""

    def count() -> dict[str, int]:
        return {node: len(gpus) for node, gpus in isolation.current().items() if gpus}

    return count


@dataclass
class QuotaSync:
    """One process's quota sync. Build it in :mod:`healer.wiring`; the controller calls :meth:`run`.

    ``nodes`` lists every node (``KubernetesNodeActions.list_nodes``); ``gpus_out`` gives node →
    GPUs healer took out one by one (subtracted from capacity; none by default; the composition
    root passes :func:`count_out` of the GPU isolation adapter). A failure of either ends the round.
    """

    settings: KueueSettings
    quotas: QuotaPort
    nodes: Callable[[], list[NodeView]]
    sessions: sessionmaker[Session]
    domain: str
    actor: str = "healer"
    gpus_out: Callable[[], dict[str, int]] = dict
    metrics: HealerMetrics | None = None
    below_since: dict[tuple[str, str], datetime] = field(default_factory=dict)

    def run(self, now: datetime, *, fence: Fence | None = None) -> list[QuotaDecision]:
        """One sync at ``now``: the decisions taken (applied, or recorded in dry-run).

        A ClusterQueue that cannot be read or applied is logged and recorded (``failed``) and
        the others go on; listing the nodes failing ends the round (no capacity, no decision).
        """
        fence = fence or Fence()
        try:
            views = self.nodes()
            out = self.gpus_out()
        except KubernetesError as exc:
            log.warning("kueue quota sync: cannot list nodes or GPUs out, nothing decided: %s", exc)
            return []
        with self.sessions() as session:
            states = {name: str(state) for name, state in session.execute(select(Node.name, Node.state))}
        flavors = self.settings.flavor_models()
        capacity = {
            f.name: healthy_capacity(views, f, domain=self.domain, states=states, gpus_out=out)
            for f in flavors
        }
        decisions: list[QuotaDecision] = []
        for name in self.settings.cluster_queues:
            decisions += self._sync_queue(name, capacity, now, fence)
        return decisions

    def _sync_queue(
        self, name: str, capacity: dict[str, int], now: datetime, fence: Fence
    ) -> list[QuotaDecision]:
        try:
            queue = self.quotas.read(name)
        except KubernetesError as exc:
            log.warning("kueue quota sync: ClusterQueue %s: %s", name, exc)
            return []
        policy = self.settings.policy()
        decisions = []
        for flavor, cap in capacity.items():
            if flavor not in queue.quotas:
                continue  # this ClusterQueue does not use the flavor
            key = (name, flavor)
            decision = decide(
                cluster_queue=name,
                flavor=flavor,
                current=queue.quotas[flavor],
                capacity=cap,
                policy=policy,
                below_since=self.below_since.get(key),
                now=now,
            )
            if decision.below_since is None or decision.set_to is not None:
                self.below_since.pop(key, None)
            else:
                self.below_since[key] = decision.below_since
            decisions.append(decision)
        changes = {d.flavor: d.set_to for d in decisions if d.set_to is not None}
        if not changes:
            self._observe(decisions, applied=False)
            return decisions
        fence.check()
        status, error = self.quotas.status, None
        try:
            self.quotas.apply(queue, changes)
        except KubernetesError as exc:
            status, error = ActionStatus.FAILED, str(exc)
            log.warning("kueue quota sync: ClusterQueue %s: %s", name, exc)
            for d in decisions:  # not lowered after all: the shortfall's clock keeps running
                if d.set_to is not None and d.below_since is not None:
                    self.below_since[(name, d.flavor)] = d.below_since
        for d in decisions:
            if d.set_to is not None:
                log.info("ClusterQueue %s flavor %s: %s", name, d.flavor, d.reason)
        self._observe(decisions, applied=error is None)
        with transaction(self.sessions) as session:
            fence.check_db(session)
            for d in decisions:
                if d.set_to is None:
                    continue
                repo.record_action(
                    session,
                    kind=ACTION_KIND,
                    status=status,
                    actor=self.actor,
                    now=now,
                    target=f"clusterqueue/{name}",
                    error=error,
                    detail={
                        "cluster_queue": name,
                        "flavor": d.flavor,
                        "resource": self.settings.resource,
                        "from": d.current,
                        "to": d.set_to,
                        "capacity": d.capacity,
                        "reason": d.reason,
                    },
                )
        return decisions

    def _observe(self, decisions: list[QuotaDecision], *, applied: bool) -> None:
        """The quota each decision leaves (set if ``applied``, else as read) and its capacity, on
        ``/metrics``."""
        if self.metrics is None:
            return
        for d in decisions:
            quota = d.set_to if applied and d.set_to is not None else d.current
            self.metrics.set_quota(d.cluster_queue, d.flavor, quota=quota, capacity=d.capacity)
