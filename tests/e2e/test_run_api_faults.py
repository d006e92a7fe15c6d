"""`healer run` end to end with one Kubernetes API request in five failing (issue 24, item 5).

Measured before: with 20 % of the API requests failing, nodes were still ``suspect`` or
``draining`` after 160 s, one of them cordoned but recorded ``suspect``: one failed request failed
the node's whole step, and the per-node backoff (10 s doubling) followed. healer now retries the
failed request inside the step (healer/actions/apiretry.py) and gives a failed node the next pass
(healer/controller/backoff.py).

Real parts: a ``healer run`` process as the chart's ServiceAccount on the real control plane (KWOK
nodes, StatefulSet pods to evict, a real Lease), a real Prometheus scraping the fleet simulator, a
webhook receiver as the provider, SQLite. healer reaches the API server through the loopback proxy
(``tests/kube_proxy.py``), which fails every request with probability 0.2 in the second phase
(seeded): a 500 or a 429 ``Retry-After: 1`` without reaching the API server, or a connection
dropped before the API server sees the request or after it applied it.

Phase one (no faults) measures, for each of :data:`PER_PHASE` nodes made hot at once, the time from
the fault to ``awaiting_repair`` (quarantined, drained, ticket requested) as the database shows it;
phase two the same for as many other nodes with the faults on. Each phase-two node must get there
without a stall (within twice the slowest phase-one time plus :data:`STALL_SLACK`), with its record
and the cluster agreeing (cordoned, tainted, its pod evicted). The figures are printed and kept in
bench/README.md ("Kubernetes API failures"); most of the difference is the two 1 s
``Retry-After`` waits a 429 asks for (honoured), and a wave's nodes waiting for each other's writes.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.store.models import Finding, Node, Transition
from healer_dev.provider import Receiver
from healer_dev.simulator.scenario import HotGpu
from tests.e2e.harness import PROVIDER_SECRET, PROVIDER_SECRET_ENV, Metrics, World, hot_gpu_rules
from tests.kube_proxy import api_proxy
from tests.services import wait_until

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(600)]

PER_PHASE = 3
FAILURE_RATE = 0.2
#: Seconds past twice the fault-free time that still count as "not stalled" (two honoured 1 s
#: Retry-After waits and a wave of nodes waiting for each other, on a loaded 2-core machine).
STALL_SLACK = 10.0
SEED = 24
#: Every request but the Lease's: the measure is the nodes' steps, not leader election's deadlines.
#: (A Lease PUT applied whose answer is lost, sent again by urllib3 and answered 409, is the
#: replica's own write: tests/integration/test_k8s_actions.py.)
FAILING = r"^(?!/apis/coordination\.k8s\.io/)"
GPU = 3
RULES = hot_gpu_rules("[quarantine, {drain: {timeout: 10m}}, {ticket: {provider: default}}]")
SAFETY = {"max_unhealthy": 10, "max_unhealthy_percent": 100, "breaker_nodes": 10, "breaker_percent": 100}


def _states(sessions: sessionmaker[Session], nodes: list[str]) -> dict[str, str]:
    with sessions() as s:
        rows = s.execute(select(Node.name, Node.state).where(Node.name.in_(nodes)))
        return {name: state for name, state in rows}


def _unix(at: datetime | None) -> float | None:
    return None if at is None else (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def _timeline(sessions: sessionmaker[Session], node: str, fault: float) -> str:
    """Seconds from the fault to the finding's firing and to each recorded transition."""
    with sessions() as s:
        fired = s.scalar(select(Finding.fired_at).where(Finding.node_name == node))
        steps = s.execute(
            select(Transition.to_state, Transition.at)
            .join(Node, Node.id == Transition.node_id)
            .where(Node.name == node)
            .order_by(Transition.id)
        ).all()
    marks = [f"fired {(_unix(fired) or fault) - fault:5.2f}"]
    marks += [f"{to} {(_unix(at) or fault) - fault:5.2f}" for to, at in steps]
    return ", ".join(marks)


def _phase(metrics: Metrics, sessions: sessionmaker[Session], nodes: list[str]) -> dict[str, float]:
    """Make ``nodes`` hot now; seconds from then until each is recorded ``awaiting_repair``."""
    started = time.time()
    for node in nodes:
        metrics.fleet.inject(HotGpu(at=metrics.clock(), node=node, gpu=GPU, fault="hot_gpu", target=90))
    reached: dict[str, float] = {}

    def all_there() -> bool:
        for node, state in _states(sessions, nodes).items():
            if state == "awaiting_repair" and node not in reached:
                reached[node] = time.time() - started
        return len(reached) == len(nodes)

    with contextlib.suppress(TimeoutError):  # the assertions name the nodes not there, and their states
        wait_until(all_there, timeout=150, interval=0.1, what=f"{nodes} awaiting_repair")
    for node in nodes:
        print(f"  {node}: {_timeline(sessions, node, started)}")
    return reached


def test_every_node_reaches_awaiting_repair_within_twice_its_fault_free_time(world: World) -> None:
    world.add_nodes(2 * PER_PHASE + 1, pool="h100")
    calm = [world.node_name(i) for i in range(PER_PHASE)]
    faulty = [world.node_name(i) for i in range(PER_PHASE, 2 * PER_PHASE)]
    jobs = world.namespace("jobs")
    pods = {node: world.stateful_set(jobs, f"job-{i}", node=node) for i, node in enumerate(calm + faulty)}
    world.rules(RULES)
    db = f"sqlite:///{world.tmp_path / 'healer.db'}"
    receiver = Receiver(secret=PROVIDER_SECRET.encode()).start()
    first = world.node_name(0)
    try:
        with (
            api_proxy(world.kube.url, world.kube.ca_file) as proxy,
            world.metrics(
                2 * PER_PHASE + 1, "faults: []", wait_for=f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{first}"}}'
            ) as metrics,
        ):
            config = world.config(
                db=db,
                prometheus_url=metrics.url,
                proxy=proxy,
                safety=SAFETY,
                tickets={
                    "providers": [{"name": "default", "url": receiver.url, "secret_env": PROVIDER_SECRET_ENV}]
                },
            )
            healer = world.start(config)
            sessions = world.sessions(db, healer)
            wait_until(lambda: world.lease_holder() == healer.identity, timeout=60, what="healer leads")

            print("\nfault-free: seconds from the fault (node: fired, transitions)")
            fault_free = _phase(metrics, sessions, calm)
            healer.alive()
            received = proxy.received
            proxy.fail(FAILURE_RATE, seed=SEED, path_regex=FAILING)
            print(f"{FAILURE_RATE:.0%} of API requests failing (seed {SEED}):")
            faulted = _phase(metrics, sessions, faulty)
            proxy.fail(0, seed=SEED)
            sent = proxy.received - received
            injected = dict(proxy.injected)
            healer.alive()
            states = _states(sessions, calm + faulty)
            healer.stop()
    finally:
        receiver.stop()

    rate = sum(injected.values()) / max(1, sent)
    summary = (
        f"fault-free: {', '.join(f'{v:.1f}' for v in fault_free.values())} s "
        f"(median {statistics.median(fault_free.values()):.1f}); "
        f"faulted: {', '.join(f'{v:.1f}' for v in faulted.values())} s; "
        f"{sum(injected.values())} of {sent} requests failed ({rate:.0%}): {injected}"
    )
    print(summary)
    assert set(fault_free) == set(calm), f"fault-free nodes not awaiting_repair: {states}"
    assert set(faulted) == set(faulty), f"nodes not awaiting_repair with faults on: {states}\n{summary}"
    assert rate > 0.1, f"the proxy failed too few requests to show anything: {summary}"
    # No stall: the nodes were stuck for minutes. The 2x figure is a requirement measured
    # and reported (bench/README.md), not timed here: a loaded machine adds seconds to one node.
    bound = 2 * max(fault_free.values()) + STALL_SLACK
    assert all(v <= bound for v in faulted.values()), f"stalled past {bound:.1f} s: {summary}"
    for node in faulty:  # the record and the cluster agree
        view = world.node(node)
        assert view["spec"].get("unschedulable") is True
        assert any(t["key"] == f"{world.domain}/quarantined" for t in view["spec"].get("taints") or [])
        namespace, name = pods[node].split("/")
        assert (
            world.pod(namespace, name) is None or world.pod(namespace, name)["spec"].get("nodeName") != node
        )
