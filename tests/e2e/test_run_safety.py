"""`healer run` under faults an SRE would inject: a kill -9 between the cordon and its record, and a
leader frozen (SIGSTOP) for longer than its Lease.

Real processes and services: `healer run` subprocesses as the chart's ServiceAccount on the real
control plane (KWOK nodes, a real Lease), a real Prometheus scraping the fleet simulator, SQLite or
a real PostgreSQL. healer reaches the API server through a loopback proxy (``tests/kube_proxy.py``)
that holds the answer of a chosen request after the API server applied it: the write is in the
cluster while healer still waits, the moment to kill or freeze it.
"""

from __future__ import annotations

import signal
import time

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.store import migrate
from healer.store.models import Action, Node, Transition
from tests.e2e.harness import World, condition, hot_gpu_rules
from tests.kube_proxy import api_proxy
from tests.services import wait_until

pytestmark = pytest.mark.prometheus

SAFETY = {"max_unhealthy": 1, "max_unhealthy_percent": 50, "breaker_nodes": 2, "breaker_percent": 100}


def rules_yaml(actions: str) -> str:
    return hot_gpu_rules(actions, summary="GPU {{ $labels.gpu }} at {{ $value }} C")


def state(sessions: sessionmaker[Session], node: str) -> str | None:
    with sessions() as s:
        return s.scalar(select(Node.state).where(Node.name == node))


def hot(node: str) -> str:
    return f"faults: [{{at: 0s, node: {node}, gpu: 3, fault: hot_gpu, target: 90, ramp: 1s}}]"


def test_kill_9_between_cordon_and_record_then_restart_releases_the_node(world: World) -> None:
    bad = world.node_name(1)
    world.add_nodes(3, pool="h100")
    world.rules(rules_yaml("[quarantine]"))
    db = f"sqlite:///{world.tmp_path / 'healer.db'}"
    migrate.upgrade(db)
    sessions = world.sessions(db)
    with (
        api_proxy(world.kube.url, world.kube.ca_file) as proxy,
        world.metrics(3, hot(bad), wait_for=f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{bad}"}} > 78') as metrics,
    ):
        # The cordon patch is applied by the API server, but its answer is held for a minute: healer
        # has cordoned and not yet recorded it when it is killed.
        proxy.hold("PATCH", rf"/api/v1/nodes/{bad}$", 60)
        config = world.config(
            db=db,
            prometheus_url=metrics.url,
            proxy=proxy,
            kubernetes={"request_timeout_seconds": 60},
            safety=SAFETY,
        )
        first = world.start(config, identity="healer-a")

        def cordoned() -> bool:
            first.alive()
            return bool(world.node(bad)["spec"].get("unschedulable"))

        wait_until(cordoned, timeout=60, what=f"{bad} cordoned")
        first.process.kill()  # SIGKILL: no shutdown, no Lease release
        first.process.wait(timeout=30)
        view = world.node(bad)
        assert view["metadata"]["annotations"][f"{world.domain}/cordoned-by"] == "healer"
        assert state(sessions, bad) in ("healthy", "suspect"), "the cordon was never recorded"
        with sessions() as s:
            intent = s.scalar(select(Node.intent).where(Node.name == bad))
        assert intent is not None and intent["to"] == "quarantined", "the intent was recorded first"

        # The finding goes away while healer is down.
        metrics.cool(bad)
        metrics.prometheus.wait_for_samples(f'max(DCGM_FI_DEV_GPU_TEMP{{Hostname="{bad}"}}) < 78', timeout=90)
        second = world.start(config, identity="healer-a")

        def released() -> bool:
            second.alive()
            return not world.node(bad)["spec"].get("unschedulable")

        wait_until(released, timeout=60, what=f"{bad} released by the restarted healer")
        second.stop()

    view = world.node(bad)
    assert not view["spec"].get("unschedulable")
    assert all(t["key"] != f"{world.domain}/quarantined" for t in view["spec"].get("taints") or [])
    assert not any(k.startswith(f"{world.domain}/") for k in view["metadata"].get("annotations") or {})
    assert condition(view) in (None, "True")
    assert state(sessions, bad) == "healthy"
    with sessions() as s:
        releases = s.scalars(select(Action).where(Action.kind == "release")).all()
        left = s.scalar(select(Node.intent).where(Node.name == bad))
    assert len(releases) == 1 and releases[0].detail is not None
    assert releases[0].detail["interrupted"]["to"] == "quarantined"
    assert left is None


@pytest.mark.postgres
def test_a_frozen_leader_resumed_after_a_takeover_writes_nothing(world: World, pg_url: str) -> None:
    """The leader is frozen (SIGSTOP) in the middle of a step: its cordon patch is applied and its
    answer is on the way. The standby takes over the real Lease and carries the node on; resumed
    (SIGCONT), the old leader gets its answer and must not go on with the step (condition, Event,
    record)."""
    bad = world.node_name(1)
    world.add_nodes(3, pool="h100")
    ml = world.namespace("ml")
    world.stateful_set(ml, "serve", node=bad)
    world.rules(rules_yaml("[quarantine, {drain: {timeout: 10m}}]"))
    sessions = world.sessions(pg_url)
    with (
        api_proxy(world.kube.url, world.kube.ca_file) as proxy,
        world.metrics(3, hot(bad), wait_for=f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{bad}"}} > 78') as metrics,
    ):
        # The first cordon patch is applied at once; its answer is held 15 s.
        proxy.hold("PATCH", rf"/api/v1/nodes/{bad}$", 15)
        config = world.config(
            db=pg_url,
            prometheus_url=metrics.url,
            proxy=proxy,
            kubernetes={"lease_duration_seconds": 5, "request_timeout_seconds": 60},
            safety=SAFETY,
        )
        procs = {
            name: world.start(config, identity=name, log=f"{name}.log") for name in ("healer-a", "healer-b")
        }

        def cordoned() -> bool:
            for p in procs.values():
                p.alive()
            return bool(world.node(bad)["spec"].get("unschedulable"))

        wait_until(cordoned, timeout=90, what=f"{bad} cordoned")
        leader = world.lease_holder()
        assert leader in procs
        procs[leader].process.send_signal(signal.SIGSTOP)  # frozen waiting for its patch's answer
        standby = next(n for n in procs if n != leader)
        wait_until(lambda: world.lease_holder() == standby, timeout=60, what="the standby takes over")
        wait_until(lambda: state(sessions, bad) == "awaiting_repair", timeout=90, what="the standby drains")
        with sessions() as s:
            before = [
                (t.id, t.to_state, t.holder) for t in s.scalars(select(Transition).order_by(Transition.id))
            ]
        events_before = world.events_by(leader, bad)
        procs[leader].process.send_signal(signal.SIGCONT)
        wait_until(
            lambda: (
                "lost leadership" in procs[leader].tail(100_000)
                or "nothing more written" in procs[leader].tail(100_000)
            ),
            timeout=30,
            what="the old leader notices",
        )
        time.sleep(12)  # its patch's answer arrives; its scheduler runs what it missed
        for p in procs.values():
            p.alive()
        with sessions() as s:
            after = list(s.scalars(select(Transition).order_by(Transition.id)))
            node_state = s.scalar(select(Node.state).where(Node.name == bad))
        events_after = world.events_by(leader, bad)
        view = world.node(bad)
        for p in procs.values():
            p.stop()

    assert [(t.id, t.to_state, t.holder) for t in after] == before, "the old leader recorded nothing"
    assert node_state == "awaiting_repair", "the record did not go backwards"
    assert events_after == events_before, "no Events from the old leader after the takeover"
    assert view["spec"].get("unschedulable") is True
    assert condition(view) == "False"
    assert [t.to_state for t in after if t.holder == standby][-1] == "awaiting_repair"
    assert all(t.holder in (leader, standby) for t in after)
    tokens = {t.holder: t.fencing_token for t in after}
    assert tokens[standby] is not None
    assert tokens.get(leader) is None or int(tokens[standby]) > int(tokens[leader] or 0)
