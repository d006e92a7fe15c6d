"""`healer run` end to end: SIGTERM in the middle of a drain, then a restart that finishes it.

Real processes and services: `healer run` as a subprocess (its own scheduler, Lease, dashboard) as
the chart's ServiceAccount, a real Prometheus scraping the fleet simulator, the real control plane
(KWOK nodes, StatefulSet and DaemonSet pods, a PodDisruptionBudget computed by the disruption
controller), a webhook receiver on loopback, and SQLite. The budget holds the drain open until the
first controller has been stopped; the second one must finish it without repeating what was done.
Evictions are counted from the API server's audit log.
"""

from __future__ import annotations

import signal

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from healer.store.models import Action, Node, Ticket, Transition
from healer_dev.provider import Receiver
from tests.e2e.harness import PROVIDER_SECRET, PROVIDER_SECRET_ENV, World
from tests.services import wait_until

pytestmark = pytest.mark.prometheus

RULES = """
groups:
  - name: thermal
    interval: 1s
    rules:
      - name: GpuTooHot
        expr: max by (Hostname, gpu, UUID) (DCGM_FI_DEV_GPU_TEMP) > 78
        for: 2s
        keep_firing_for: 30s
        unit: degrees C
        annotations: {summary: "GPU {{ $labels.gpu }} at {{ $value }} C"}
        actions:
          - quarantine
          - drain: {timeout: 10m, delete_emptydir_data: true}
          - ticket: {provider: default}
"""


def _state(sessions: sessionmaker[Session], node: str) -> str | None:
    with sessions() as s:
        return s.scalar(select(Node.state).where(Node.name == node))


def test_sigterm_mid_drain_then_restart_finishes_without_duplicates(world: World) -> None:
    bad = world.node_name(1)
    world.add_nodes(3, pool="h100")
    ml = world.namespace("ml")
    world.daemon_set(ml, "dcgm")
    dcgm = world.daemon_pod(ml, "dcgm", bad)
    trainer = world.stateful_set(ml, "trainer", node=bad, empty_dir=True)
    serve = world.stateful_set(ml, "serve", node=bad)
    # Only one replica and minAvailable 1: the budget allows no disruption of serve-0 for now.
    world.budget(ml, "serve", app="serve", min_available=1)
    receiver = Receiver(secret=PROVIDER_SECRET.encode()).start()
    world.rules(RULES)
    db = f"sqlite:///{world.tmp_path / 'healer.db'}"
    scenario = f"faults: [{{at: 0s, node: {bad}, gpu: 3, fault: hot_gpu, target: 90, ramp: 1s}}]"
    with world.metrics(3, scenario, wait_for=f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{bad}"}} > 78') as metrics:
        config = world.config(
            db=db,
            prometheus_url=metrics.url,
            safety={
                "max_unhealthy": 1,
                "max_unhealthy_percent": 50,
                "breaker_nodes": 2,
                "breaker_percent": 100,
            },
            tickets={
                "providers": [{"name": "default", "url": receiver.url, "secret_env": PROVIDER_SECRET_ENV}]
            },
        )
        first = world.start(config)
        sessions = world.sessions(db, first)
        wait_until(lambda: _state(sessions, bad) == "draining", timeout=90, what=f"{bad} draining")
        wait_until(lambda: world.kube.eviction_count(trainer) == 1, timeout=30, what="trainer evicted")
        # serve-0 is held by its PodDisruptionBudget while we stop the controller: the step that
        # evicted trainer-0 read the budget (0 disruptions allowed) and sent no eviction for it to
        # refuse (issue 19; before, each step's POST answered 429).
        assert [e.code for e in world.kube.evictions() if e.pod == serve] == []
        first.process.send_signal(signal.SIGTERM)
        assert first.process.wait(timeout=60) == 0, first.tail()
        lease = world.lease_object()
        assert lease is not None and not lease.spec.holder_identity, "the Lease was handed back"
        assert _state(sessions, bad) == "draining"
        assert world.pod(ml, "serve-0") is not None

        # The budget now allows one disruption; a fresh controller resumes the drain.
        world.budget(ml, "serve", app="serve", max_unavailable=1)
        second = world.start(config)
        port = second.port
        wait_until(lambda: _state(sessions, bad) == "awaiting_repair", timeout=90, what="drain finished")
        wait_until(lambda: len(receiver.requests) >= 1, timeout=30, what="ticket delivered")
        answer = httpx.get(f"http://127.0.0.1:{port}/api/v1/nodes/{bad}", timeout=5).json()
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        # A broken rule file and SIGHUP: rejected and shown, the old rules keep running.
        world.rules(RULES.replace("for: 2s", "for: soon"))
        second.process.send_signal(signal.SIGHUP)
        shown = wait_until(
            lambda: httpx.get(f"http://127.0.0.1:{port}/api/v1/rules", timeout=5).json()["rejected"],
            timeout=30,
            what="the rejected reload on the dashboard",
        )
        rules_now = httpx.get(f"http://127.0.0.1:{port}/api/v1/rules", timeout=5).json()
        second.stop()
    receiver.stop()

    view = world.node(bad)
    assert view["spec"]["unschedulable"] is True
    assert world.kube.eviction_count(trainer) == 1
    assert world.kube.eviction_count(serve) == 1
    assert world.pod(ml, dcgm) is not None, "DaemonSet pods stay"
    assert "thermal.yaml:" in shown[0]["error"] and "for" in shown[0]["error"]
    assert [r["name"] for r in rules_now["rules"]] == ["GpuTooHot"]
    assert answer["node"]["state"] == "awaiting_repair"
    assert 'healer_actions_total{kind="drained",result="succeeded"} 1.0' in metrics
    assert answer["node"]["ticket"] is not None
    assert len(receiver.requests) == 1
    with sessions() as s:
        cordons = s.scalar(select(func.count()).select_from(Action).where(Action.kind == "cordon"))
        tickets = s.scalar(select(func.count()).select_from(Ticket))
        drains = s.scalar(
            select(func.count()).select_from(Transition).where(Transition.to_state == "draining")
        )
    assert (cordons, tickets, drains) == (1, 1, 1)
