"""`healer run` on the real control plane for issue 12's safety promises that the controller tests
(tests/integration/test_ways_out.py) show with a harness: the breaker's denominator is the GPU
pool, not the cluster; a drain a PodDisruptionBudget blocks files a ticket naming the pod and the
budget. (A quarantine-only node returning to service is tests/e2e/test_run_validation_outage.py;
the fenced leader is tests/e2e/test_run_safety.py.)

Real processes and services: `healer run` as the chart's ServiceAccount, KWOK nodes, a StatefulSet
pod and a PodDisruptionBudget the disruption controller computes, a real Prometheus scraping the
fleet simulator, a webhook receiver on loopback, SQLite.
"""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from healer.store.models import Node, Transition
from healer_dev.provider import Receiver
from tests.e2e.harness import PROVIDER_SECRET, PROVIDER_SECRET_ENV, World, hot_gpu_rules
from tests.services import wait_until

pytestmark = pytest.mark.prometheus


def rules_yaml(actions: str) -> str:
    return hot_gpu_rules(actions)


def hot(*nodes: str) -> str:
    faults = ", ".join(f"{{at: 0s, node: {n}, gpu: 3, fault: hot_gpu, target: 90, ramp: 1s}}" for n in nodes)
    return f"faults: [{faults}]"


def state(sessions: sessionmaker[Session], node: str) -> str | None:
    with sessions() as s:
        return s.scalar(select(Node.state).where(Node.name == node))


def test_fifteen_of_twenty_gpu_nodes_trip_the_pool_breaker_in_a_cluster_of_a_hundred(world: World) -> None:
    """15 of 20 GPU nodes bad among 100 nodes: 15 % of the cluster, 75 % of the GPU pool. A 50 %
    breaker over the pool trips and nothing is cordoned; the dashboard shows the pool's 20."""
    pool = f"h100-{world.prefix}"
    gpu_nodes = world.add_nodes(20, pool=pool)
    world.add_nodes(80, pool="", gpus=0, role="cpu")  # no pool label, no GPU
    bad = gpu_nodes[:15]
    world.rules(rules_yaml("[quarantine]"))
    db = f"sqlite:///{world.tmp_path / 'healer.db'}"
    # All 15 hot in Prometheus before healer starts: its first tick sees them together.
    every_bad = f'count(max by (Hostname) (DCGM_FI_DEV_GPU_TEMP{{Hostname=~"{world.prefix}-.*"}}) > 78) == 15'
    with world.metrics(20, hot(*bad), wait_for=every_bad) as metrics:
        config = world.config(
            db=db,
            prometheus_url=metrics.url,
            safety={
                "breaker_nodes": 50,
                "breaker_percent": 50,
                "max_unhealthy": 20,
                "max_unhealthy_percent": 100,
            },
        )
        healer = world.start(config)
        sessions = world.sessions(db, healer)

        def tripped() -> dict[str, object] | None:
            healer.alive()
            status = httpx.get(f"{healer.url}/api/v1/status", timeout=5).json()
            return status if status["breaker"]["tripped"] else None

        status = wait_until(tripped, timeout=120, what="the pool's breaker trips")
        page = httpx.get(f"{healer.url}/", timeout=5).text
        healer.stop()

    scope = status["breaker_scope"]
    assert (scope["pool"], scope["pool_nodes"], scope["bad_nodes"]) == (pool, 20, 15)
    assert "50% of one pool's nodes" in scope["rule"]
    budgets = {b["pool"]: b for b in status["budgets"]}
    assert budgets[pool]["nodes"] == 20
    assert budgets["no-gpu"]["nodes"] >= 80  # and every other test's nodes: the cluster is larger
    assert sum(b["nodes"] for b in budgets.values()) >= 100  # 15 bad is under 50 % of the cluster
    assert budgets[pool]["breaker_trips_at"] == 11  # more than 50 % of 20
    assert "15 bad of 20 node(s)" in page
    assert [n for n in gpu_nodes if world.node(n)["spec"].get("unschedulable")] == []
    with sessions() as s:
        quarantined = s.scalar(
            select(func.count()).select_from(Transition).where(Transition.to_state == "quarantined")
        )
    assert quarantined == 0


def test_a_drain_a_budget_blocks_files_a_ticket_naming_the_pod_and_the_budget(world: World) -> None:
    bad = world.node_name(1)
    world.add_nodes(3, pool="h100")
    web = world.namespace("web")
    db_pod = world.stateful_set(web, "db", node=bad)
    world.budget(web, "db", app="db", min_available=1)  # one replica: never a disruption
    receiver = Receiver(secret=PROVIDER_SECRET.encode()).start()
    world.rules(rules_yaml("[quarantine, {drain: {timeout: 5s}}, {ticket: {provider: default}}]"))
    db = f"sqlite:///{world.tmp_path / 'healer.db'}"
    try:
        with world.metrics(3, hot(bad), wait_for=f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{bad}"}} > 78') as metrics:
            config = world.config(
                db=db,
                prometheus_url=metrics.url,
                safety={"max_unhealthy": 1, "max_unhealthy_percent": 50, "drain_blocked_alert_seconds": 1},
                tickets={
                    "providers": [{"name": "default", "url": receiver.url, "secret_env": PROVIDER_SECRET_ENV}]
                },
            )
            healer = world.start(config)
            sessions = world.sessions(db, healer)
            wait_until(lambda: state(sessions, bad) == "blocked", timeout=120, what=f"{bad} blocked")
            wait_until(lambda: receiver.requests, timeout=30, what="the ticket delivered")
            exposition = httpx.get(f"{healer.url}/metrics", timeout=5).text

            def flagged() -> dict[str, object] | None:
                items = httpx.get(f"{healer.url}/api/v1/nodes", params={"unhealthy": True}, timeout=5).json()
                found = {n["name"]: n for n in items["items"]}.get(bad)
                return found if found and found["drain_blocked"] else None

            listed = wait_until(flagged, timeout=30, what="the dashboard's blocked-drain flag")
            healer.stop()
    finally:
        receiver.stop()

    [request] = receiver.requests
    ticket = request.json
    assert ticket["node"]["name"] == bad
    assert ticket["drain"] == {"blocked_pods": [db_pod], "budgets": [f"{web}/db"], "refused": {}}
    assert f"drain blocked: pods {db_pod}; PodDisruptionBudgets {web}/db" in ticket["summary"]
    assert "healer_drain_blocked_nodes 1.0" in exposition
    assert f"{web}/db" in str(listed["blocked_reason"])
    assert world.kube.eviction_count(db_pod) == 0, "the budget was honoured"
    assert world.pod(web, "db-0") is not None
    assert world.node(bad)["spec"]["unschedulable"] is True
