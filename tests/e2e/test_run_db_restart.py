"""`healer run` on the real control plane while its PostgreSQL crashes twice in the middle of a
20-node burst (issue 24): every cordon, taint and condition has exactly one audit row.

A crash between a node's cluster writes and their record loses the record (its transaction);
healer's next pass finds the writes already done on the node. Before, such a step recorded no row
at all (1-6 of 8 nodes per run), and a retry whose reason text had changed recorded a second
"cordon succeeded". Now each effect is recorded once per incident, "applied" or "found applied
after restart".

Real processes and services: `healer run` as the chart's ServiceAccount, 20 KWOK nodes, a real
Prometheus scraping the fleet simulator, PostgreSQL crashed with ``pg_ctl stop -m immediate``.
"""

from __future__ import annotations

from collections import Counter

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.store.models import Action, Node
from tests.e2e.harness import World, hot_gpu_rules
from tests.services import PostgresServer, wait_until

pytestmark = [pytest.mark.prometheus, pytest.mark.postgres]

NODES = 20

RULES = hot_gpu_rules("[quarantine]", summary="GPU {{ $labels.gpu }} at {{ $value }} C")


def states(sessions: sessionmaker[Session]) -> Counter[str]:
    try:
        with sessions() as s:
            return Counter(s.scalars(select(Node.state)).all())
    except Exception:  # the database is restarting: nothing to read this time
        return Counter()


def test_postgres_crashing_twice_mid_burst_leaves_one_audit_row_per_effect(
    world: World, postgres: PostgresServer, pg_url: str
) -> None:
    names = world.add_nodes(NODES, pool="h100")
    world.rules(RULES)
    sessions = world.sessions(pg_url)
    faults = ", ".join(f"{{at: 0s, node: {n}, gpu: 3, fault: hot_gpu, target: 90, ramp: 1s}}" for n in names)
    every_hot = f'count(DCGM_FI_DEV_GPU_TEMP{{Hostname=~"{world.prefix}-.*"}} > 78) >= {NODES}'
    with world.metrics(NODES, f"faults: [{faults}]", wait_for=every_hot) as metrics:
        config = world.config(
            db=pg_url,
            prometheus_url=metrics.url,
            safety={
                "max_unhealthy": NODES,
                "max_unhealthy_percent": 100,
                "breaker_nodes": NODES + 1,
                "breaker_percent": 100,
            },
        )
        healer = world.start(config)

        def cordoned() -> int:
            healer.alive()
            return sum(1 for n in names if n in world.kube.cordons())

        # The first crash as the first cordons land, the second in the middle of the burst.
        wait_until(lambda: cordoned() >= 1, timeout=120, interval=0.05, what="the first cordon")
        postgres.restart()
        wait_until(lambda: cordoned() >= NODES // 2, timeout=120, interval=0.05, what="half cordoned")
        postgres.restart()
        wait_until(
            lambda: states(sessions)["awaiting_repair"] == NODES,
            timeout=180,
            what=f"all {NODES} quarantined and recorded",
        )
        healer.alive()
        with sessions() as s:
            rows = s.execute(
                select(Node.name, Action.kind, Action.detail)
                .join(Node, Node.id == Action.node_id)
                .where(Action.kind.in_(["cordon", "taint", "condition"]), Action.status == "succeeded")
            ).all()
        healer.stop()

    per_node = Counter((name, kind) for name, kind, _ in rows)
    for node in names:
        for kind in ("cordon", "taint", "condition"):
            assert per_node[(node, kind)] == 1, (node, kind, per_node[(node, kind)])
        assert world.node(node)["spec"].get("unschedulable") is True
    how = Counter((detail or {}).get("how") for _, _, detail in rows)
    assert set(how) <= {"applied", "found applied after restart"}, how
    print(f"audit rows: {dict(how)}")  # how many effects a crash left unrecorded, this run
