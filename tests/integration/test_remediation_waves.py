"""A burst of nodes in one pass: the nodes move in waves (healer.controller.reconcile).

Over HTTP against the API emulator, on SQLite and PostgreSQL: the nodes firing together are
recorded and planned in one transaction per wave and their cluster writes go out together, so one
slow node holds no other back; a node whose state another writer moved meanwhile is dropped
without undoing the others' records; a leader that loses its Lease while the wave's writes are in
flight records nothing of them. Transition and audit rows are written with their transaction and
read back inside it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.config import KubernetesSettings
from healer.controller.fence import Fence
from healer.errors import NotLeader
from healer.model.states import NodeState
from healer.store import nodes as repo
from healer.store.models import Action, Node, Transition
from healer.store.session import transaction
from healer_dev.k8s_emulator import KubernetesEmulator
from healer_dev.remediation_harness import T0, Harness, fleet_nodes, hot, tick
from tests.k8s_emulator import emulator, k8s_settings
from tests.services import wait_until

__all__ = ["emulator", "k8s_settings"]

BURST = [f"gpu-{i:02d}" for i in range(1, 9)]


@pytest.fixture
def harness(
    emulator: KubernetesEmulator, session_factory: sessionmaker[Session], k8s_settings: KubernetesSettings
) -> Iterator[Harness]:
    """A controller whose budget and breaker let a burst of 8 of 40 nodes out."""
    h = Harness(
        emulator,
        session_factory,
        k8s_settings,
        max_unhealthy=10,
        max_unhealthy_percent=50,
        breaker_nodes=20,
        breaker_percent=50,
    )
    h.emu.load(fleet_nodes(40))
    yield h
    h.api.close()


def _in_background(harness: Harness, names: list[str], **kw: object) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def run() -> None:
        try:
            out.append(harness.remediate(tick(T0 + timedelta(seconds=5), *map(hot, names)), **kw))
        except BaseException as exc:  # handed to the test's thread
            out.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    return worker, out


def test_a_slow_node_holds_back_none_of_the_burst(harness: Harness) -> None:
    """One node's API request takes 4 s (the client's timeout is 5 s): the other seven are
    cordoned meanwhile, and every node of the burst ends the pass with the same recorded path."""
    harness.emu.inject_delay("PATCH", r"/api/v1/nodes/gpu-01$", 4.0)
    worker, out = _in_background(harness, BURST)

    wait_until(lambda: set(harness.cordoned()) >= set(BURST[1:]), timeout=3.5, what="the other 7 cordoned")
    assert worker.is_alive() and "gpu-01" not in harness.cordoned()
    worker.join(timeout=60)

    result = out[0]
    assert not isinstance(result, BaseException), result
    assert harness.cordoned() == BURST
    assert result.states() == dict.fromkeys(BURST, NodeState.DRAINING)  # type: ignore[attr-defined]
    for name in BURST:
        assert harness.path(name) == [
            ("healthy", "suspect"),
            ("suspect", "quarantined"),
            ("quarantined", "draining"),
        ], name
        assert sorted(a.kind for a in harness.actions_of(name) if a.kind in ("cordon", "taint")) == [
            "cordon",
            "taint",
        ]
    with harness.sessions() as s:
        assert s.scalars(select(Node.intent).where(Node.name.in_(BURST))).all() == [None] * len(BURST)


def test_a_node_moved_meanwhile_is_dropped_and_the_burst_recorded(harness: Harness) -> None:
    """Compare-and-set inside a wave: while gpu-10's cordon is in flight an operator releases it.
    Its step is not written over theirs (its cordon is audited all the same); the nodes recorded
    in the same transaction keep their records."""
    burst = ["gpu-09", "gpu-10", "gpu-11"]
    harness.emu.inject_delay("PATCH", r"/api/v1/nodes/gpu-10$", 0.8, after_write=True)
    worker, out = _in_background(harness, burst)
    wait_until(
        lambda: harness.k8s_node("gpu-10")["spec"].get("unschedulable"), timeout=10, what="cordon applied"
    )
    with transaction(harness.sessions) as s:
        node = s.scalars(select(Node).where(Node.name == "gpu-10")).one()
        repo.transition(
            s, node, NodeState.RELEASED, now=T0 + timedelta(seconds=5), actor="sre", reason="by hand"
        )
    worker.join(timeout=30)

    result = out[0]
    assert not isinstance(result, BaseException), result
    assert {o.node: o.refused for o in result.outcomes} == {  # type: ignore[attr-defined]
        "gpu-09": None,
        "gpu-10": "stale",
        "gpu-11": None,
    }
    assert [b for _, b in harness.path("gpu-10")] == ["suspect", "released"]
    assert harness.state("gpu-10") == NodeState.RELEASED
    for name in ("gpu-09", "gpu-11"):
        assert [b for _, b in harness.path(name)] == ["suspect", "quarantined", "draining"], name
    for name in burst:
        kinds = [a.kind for a in harness.actions_of(name) if a.kind in ("cordon", "taint")]
        assert sorted(kinds) == ["cordon", "taint"], name


def test_a_leader_that_loses_its_lease_during_the_writes_records_none_of_them(harness: Harness) -> None:
    """The Lease is lost once the first cordon is on the cluster: the pass ends with ``NotLeader``
    and the wave's records are not written (each node's step stays announced by its intent, which
    was committed before the writes, for the next leader's ownership reconcile)."""
    fence = Fence(holder="healer-0", leading=lambda: not harness.cordoned())
    worker, out = _in_background(harness, BURST, fence=fence)
    worker.join(timeout=60)

    assert isinstance(out[0], NotLeader), out[0]
    assert harness.cordoned(), "some cordon went out before the Lease was lost"
    for name in BURST:
        assert harness.path(name) == [("healthy", "suspect")], name
    assert harness.actions_of(kind="cordon") == []
    with harness.sessions() as s:
        intents = s.scalars(select(Node.intent).where(Node.name.in_(BURST))).all()
    assert [(i or {}).get("to") for i in intents] == ["quarantined"] * len(BURST)


def test_transition_and_audit_rows_are_read_back_in_their_transaction_and_go_with_it(
    session_factory: sessionmaker[Session],
) -> None:
    with transaction(session_factory) as s:
        node = repo.get_or_create_node(s, "gpu-01", now=T0)
        repo.transition(s, node, NodeState.SUSPECT, now=T0, actor="healer", reason="hot")
        repo.insert_actions(
            s,
            [
                repo.record_action(
                    s, add=False, kind="cordon", status="succeeded", actor="healer", now=T0, node=node
                )
            ],
        )
        repo.transition(s, node, NodeState.QUARANTINED, now=T0, actor="healer", reason="hot")
        assert s.scalars(select(Transition.to_state).order_by(Transition.id)).all() == [
            "suspect",
            "quarantined",
        ]
        assert s.scalars(select(Action.kind)).all() == ["cordon"]

    with session_factory() as s:
        s.begin()
        node = repo.get_or_create_node(s, "gpu-01", now=T0)
        repo.transition(s, node, NodeState.RELEASED, now=T0, actor="sre", reason="by hand")
        s.rollback()
    with session_factory() as s:
        assert s.scalars(select(Transition.to_state).order_by(Transition.id)).all() == [
            "suspect",
            "quarantined",
        ]
        assert s.scalars(select(Action.kind)).all() == ["cordon"]


def test_a_step_in_place_keeps_when_the_node_entered_its_state(
    session_factory: sessionmaker[Session],
) -> None:
    """A transition that records something without moving the node (a ladder step while awaiting
    repair, a log capture's answer) keeps ``state_since``: "awaiting repair for 2 h" and the
    dashboard's overdue flag still count from when the node began to wait."""
    waiting, later, returned = T0, T0 + timedelta(hours=2), T0 + timedelta(hours=3)

    def step(to: NodeState, at: datetime, **how: str) -> datetime:
        """One transition of gpu-01 in its own transaction; its ``state_since`` as the session
        holds it after the transition."""
        with transaction(session_factory) as s:
            node = repo.get_or_create_node(s, "gpu-01", now=T0)
            repo.transition(s, node, to, now=at, actor="healer", reason="test", **how)
            return node.state_since

    def stored() -> Node:
        with session_factory() as s:
            return s.scalars(select(Node).where(Node.name == "gpu-01")).one()

    step(NodeState.AWAITING_REPAIR, waiting)
    # the compare-and-set path (the controller's): the row in the session keeps it too
    assert step(NodeState.AWAITING_REPAIR, later, expect="awaiting_repair") == waiting
    step(NodeState.AWAITING_REPAIR, later)  # the plain path (the CLI's)
    assert (stored().state_since, stored().updated_at) == (waiting, later)
    step(NodeState.VALIDATING, returned, expect="awaiting_repair")
    assert stored().state_since == returned
    with session_factory() as s:
        steps = s.scalars(select(Transition.to_state).order_by(Transition.id)).all()
    assert steps == ["awaiting_repair", "awaiting_repair", "awaiting_repair", "validating"]
