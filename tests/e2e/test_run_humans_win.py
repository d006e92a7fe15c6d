"""`healer run` on the real control plane: a human's change in the middle of a drain wins at once
(issue 24). The drain re-reads the node before each round of evictions, so an uncordon while it
waits for a PodDisruptionBudget stops it before the next eviction: the node is recorded
``released``, no ticket goes to the provider and the drain's audit row ends ``cancelled``.

The replicas are pinned to the node, so after the first eviction the budget allows nothing more
and the step waits on it; right after the uncordon the budget is loosened, so the step's budget
watch wakes while it runs: a drain that read the node only when its step started evicts the rest.

Real processes and services: `healer run` as the chart's ServiceAccount, KWOK nodes, a Deployment
under a ``maxUnavailable: 1`` budget the disruption controller computes, a real Prometheus
scraping the fleet simulator, a webhook receiver on loopback, SQLite. Evictions and their times
come from the API server's audit log.
"""

from __future__ import annotations

import random
import time

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.store.models import Action, Node
from healer_dev.provider import Receiver
from tests.e2e.harness import PROVIDER_SECRET, PROVIDER_SECRET_ENV, World, hot_gpu_rules
from tests.services import wait_until

pytestmark = pytest.mark.prometheus

RULES = hot_gpu_rules("[quarantine, {drain: {timeout: 10m}}, {ticket: {provider: default}}]")


def state(sessions: sessionmaker[Session], node: str) -> str | None:
    with sessions() as s:
        return s.scalar(select(Node.state).where(Node.name == node))


@pytest.mark.parametrize("seed", [24])
def test_an_uncordon_while_the_drain_waits_for_a_budget_stops_it_before_the_next_eviction(
    world: World, seed: int
) -> None:
    world.add_nodes(3, pool="h100")
    bad = world.node_name(0)
    web = world.namespace("web")
    pods = world.deployment(web, "web", replicas=6, node=bad)
    world.budget(web, "web", app="web", max_unavailable=1)
    receiver = Receiver(secret=PROVIDER_SECRET.encode()).start()
    world.rules(RULES)
    db = f"sqlite:///{world.tmp_path / 'healer.db'}"
    hot = f"faults: [{{at: 0s, node: {bad}, gpu: 3, fault: hot_gpu, target: 90, ramp: 1s}}]"
    try:
        with world.metrics(3, hot, wait_for=f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{bad}"}} > 78') as metrics:
            config = world.config(
                db=db,
                prometheus_url=metrics.url,
                safety={"max_unhealthy": 1, "max_unhealthy_percent": 50},
                tickets={
                    "providers": [{"name": "default", "url": receiver.url, "secret_env": PROVIDER_SECRET_ENV}]
                },
            )
            healer = world.start(config)
            sessions = world.sessions(db, healer)

            def evicted_by_healer() -> list[str]:
                healer.alive()
                return [e.pod for e in world.kube.evictions() if e.pod in pods and e.code == 201]

            wait_until(evicted_by_healer, timeout=120, what="healer's first eviction")
            # A random moment early in the drain step's wait for the budget (it waits up to 5 s, and
            # the replacement takes seconds to start once the node is schedulable).
            time.sleep(random.Random(seed).uniform(0.0, 0.5))
            world.core.patch_node(bad, {"spec": {"unschedulable": None}})
            uncordoned_at = time.time()  # the API server has applied it: every later eviction is late
            # The budget frees at once (its owner loosens it): the drain's budget watch wakes now,
            # while the step is still running, not seconds later when a replacement is Ready.
            world.budget(web, "web", app="web", max_unavailable=len(pods))
            wait_until(lambda: state(sessions, bad) == "released", timeout=60, what=f"{bad} released")
            time.sleep(3)  # a drain job or tick that would still evict or ticket has run by now
            with sessions() as s:
                drains = s.scalars(
                    select(Action)
                    .join(Node, Node.id == Action.node_id)
                    .where(Node.name == bad, Action.kind == "drain")
                ).all()
                final = s.scalar(select(Node.state).where(Node.name == bad))
            healer.stop()
    finally:
        receiver.stop()

    evictions = [e for e in world.kube.evictions() if e.pod in pods and e.code == 201]
    late = [e for e in evictions if e.received > uncordoned_at]
    assert evictions and len(evictions) < len(pods), evictions
    assert late == [], f"evicted after the uncordon: {late}"
    assert receiver.requests == []  # no replacement ticket for a node a human took back
    assert final == "released"
    assert [d.status for d in drains] == ["cancelled"]
    node = world.node(bad)
    assert not node["spec"].get("unschedulable")  # healer did not cordon it again
    assert not any(t["key"] == f"{world.domain}/quarantined" for t in node["spec"].get("taints") or [])
