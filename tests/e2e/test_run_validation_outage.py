"""`healer run` end to end: a quarantine-only node returns to service, and a 20 s Prometheus outage
during its validation does not count as clear time.

Real processes: `healer run` (scheduler, Lease, dashboard) as the chart's ServiceAccount on the real
control plane (KWOK nodes), a real Prometheus scraping the fleet simulator, SQLite. The outage is
the Prometheus process stopped (SIGSTOP) for 20 s: every query times out, every rule is frozen.
"""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from healer.store.models import Node, Ticket, Transition
from tests.e2e.harness import World
from tests.services import wait_until

pytestmark = pytest.mark.prometheus

HOLD = 15
OUTAGE = 20
RULES = """
groups:
  - name: thermal
    interval: 1s
    rules:
      - name: GpuTooHot
        expr: max by (Hostname, gpu, UUID) (DCGM_FI_DEV_GPU_TEMP) > 78
        for: 2s
        keep_firing_for: 2s
        unit: degrees C
        actions: [quarantine]      # no drain, no ticket: the node's only way out is staying clear
"""


def _state(sessions: sessionmaker[Session], node: str) -> str | None:
    with sessions() as s:
        return s.scalar(select(Node.state).where(Node.name == node))


def _entered(sessions: sessionmaker[Session], node: str, state: str) -> datetime | None:
    with sessions() as s:
        return s.scalar(
            select(Transition.at)
            .join(Node, Node.id == Transition.node_id)
            .where(Node.name == node, Transition.to_state == state)
            .order_by(Transition.id.desc())
            .limit(1)
        )


def test_prometheus_outage_during_validation_restarts_the_hold(world: World) -> None:
    bad = world.node_name(1)
    world.add_nodes(3, pool="h100")
    world.rules(RULES)
    db = f"sqlite:///{world.tmp_path / 'healer.db'}"
    scenario = f"faults: [{{at: 0s, node: {bad}, gpu: 3, fault: hot_gpu, target: 90, ramp: 1s}}]"
    with world.metrics(3, scenario, wait_for=f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{bad}"}} > 78') as metrics:
        config = world.config(
            db=db,
            prometheus_url=metrics.url,
            prometheus={"tick_deadline_seconds": 3, "timeout_seconds": 2},
            safety={"max_unhealthy": 1, "max_unhealthy_percent": 50, "recovery_hold_seconds": HOLD},
        )
        healer = world.start(config)
        sessions = world.sessions(db, healer)
        wait_until(lambda: _state(sessions, bad) == "awaiting_repair", timeout=90, what="quarantined")
        assert world.node(bad)["spec"]["unschedulable"] is True
        # The GPU cools: the quarantine-only node goes to validation.
        metrics.cool(bad)
        wait_until(lambda: _state(sessions, bad) == "validating", timeout=90, what="validating")
        time.sleep(3)

        metrics.prometheus.process.send_signal(signal.SIGSTOP)
        try:
            time.sleep(OUTAGE)
        finally:
            metrics.prometheus.process.send_signal(signal.SIGCONT)
        back = datetime.now(UTC)

        time.sleep(5)
        assert _state(sessions, bad) == "validating", "returned to service on time not observed"
        wait_until(lambda: _state(sessions, bad) == "healthy", timeout=120, what="returned to service")
        healer.stop()

    healthy_at = _entered(sessions, bad, "healthy")
    assert healthy_at is not None
    # A whole recovery hold of observed data after the outage (a tick of slack either side).
    assert (healthy_at - back).total_seconds() >= HOLD - 2, healer.tail()
    view = world.node(bad)
    assert not view["spec"].get("unschedulable")
    assert not any(t["key"].startswith(f"{world.domain}/") for t in view["spec"].get("taints") or [])
    # A quarantine-only rule: no ticket; the node's way out was its finding staying clear.
    with sessions() as s:
        path = list(
            s.scalars(
                select(Transition.to_state)
                .join(Node, Node.id == Transition.node_id)
                .where(Node.name == bad)
                .order_by(Transition.id)
            )
        )
        tickets = s.scalar(select(func.count()).select_from(Ticket))
    assert tickets == 0
    assert path[-1] == "healthy"
    assert path.index("awaiting_repair") < path.index("validating")
