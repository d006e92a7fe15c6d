"""`healer run` end to end for issue 31: each rule's precision from its incidents' outcomes, a
shadow rule recording what it would have done (and how that turned out) while changing nothing,
and a ticket past its provider's target escalated once.

Real processes and services: `healer run` as the chart's ServiceAccount on the real control plane
(KWOK nodes), a real Prometheus scraping the fleet simulator, the stand-in provider on loopback
(signed webhooks and status callbacks), SQLite.

Five hot nodes: n1 and n2 under GpuTooHot (quarantine and ticket; the provider answers "replaced"
for n1, "no fault found" for n2), n3 and n4 under GpuTooHotQ (quarantine only; n3 recovers with no
repair, n4 heats again while validating: a failed validation), n1 and n5 under the shadow rule.
"""

from __future__ import annotations

import math
import time
from datetime import datetime

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.store.models import Action, Finding, Incident, Node, ShadowDecision, Ticket, Transition
from healer_dev.provider import Receiver
from healer_dev.simulator.scenario import parse_scenario
from tests.e2e.harness import PROVIDER_SECRET, PROVIDER_SECRET_ENV, World
from tests.services import wait_until

pytestmark = pytest.mark.prometheus

HOLD = 6  # recovery hold, seconds: n4 heats again inside it
OUT = ("quarantined", "draining", "awaiting_repair", "repaired", "validating")


def rules(n1: str, n2: str, n3: str, n4: str, n5: str) -> str:
    def rule(name: str, nodes: str, actions: str, mode: str = "acting") -> str:
        return f"""
      - name: {name}
        expr: max by (Hostname, gpu, UUID) (DCGM_FI_DEV_GPU_TEMP{{Hostname=~"{nodes}"}}) > 78
        for: 1s
        mode: {mode}
        actions: {actions}"""

    ticket = "[quarantine, {ticket: {provider: default}}]"
    return f"""
groups:
  - name: thermal
    interval: 1s
    rules:{rule("GpuTooHot", f"{n1}|{n2}", ticket)}{rule("GpuTooHotQ", f"{n3}|{n4}", "[quarantine]")}{
        rule("GpuTooHotShadow", f"{n1}|{n5}", ticket, mode="shadow")
    }
"""


def hot(node: str, at: int = 0) -> str:
    return f"{{at: {at}s, node: {node}, gpu: 3, fault: hot_gpu, target: 90, ramp: 1s}}"


def states(sessions: sessionmaker[Session]) -> dict[str, str]:
    with sessions() as s:
        return dict(s.execute(select(Node.name, Node.state)).all())


def test_outcomes_set_each_rules_precision_and_a_shadow_rule_changes_nothing(world: World) -> None:
    n1, n2, n3, n4, n5 = (world.node_name(i) for i in range(5))
    world.add_nodes(5, pool="h100")
    world.rules(rules(n1, n2, n3, n4, n5))
    receiver = Receiver(secret=PROVIDER_SECRET.encode(), callback_secret=PROVIDER_SECRET.encode()).start()
    db = f"sqlite:///{world.tmp_path / 'healer.db'}"
    scenario = f"faults: [{', '.join(hot(n) for n in (n1, n2, n3, n4, n5))}]"
    every_hot = f'count(max by (Hostname) (DCGM_FI_DEV_GPU_TEMP{{Hostname=~"{world.prefix}-.*"}}) > 78) == 5'
    try:
        with world.metrics(5, scenario, wait_for=every_hot) as metrics:
            config = world.config(
                db=db,
                prometheus_url=metrics.url,
                safety={
                    "max_unhealthy": 5,
                    "max_unhealthy_percent": 100,
                    "breaker_nodes": 10,
                    "breaker_percent": 100,
                    "recovery_hold_seconds": HOLD,
                },
                tickets={
                    "callback_secret_env": PROVIDER_SECRET_ENV,
                    "providers": [
                        {
                            "name": "default",
                            "url": receiver.url,
                            "secret_env": PROVIDER_SECRET_ENV,
                            "ack_within_seconds": 2,
                        }
                    ],
                },
            )
            healer = world.start(config)
            receiver.callback_url = healer.url
            sessions = world.sessions(db, healer)

            def out() -> bool:
                healer.alive()
                now = states(sessions)
                return all(now.get(n) == "awaiting_repair" for n in (n1, n2, n3, n4))

            wait_until(out, timeout=120, what="four nodes out of service")

            # Nobody acknowledges: each ticket misses its 2 s target and is escalated, once.
            def escalations() -> list[str]:
                return [
                    r.idempotency_key or ""
                    for r in receiver.requests
                    if (r.idempotency_key or "").endswith("-overdue-ack")
                ]

            wait_until(lambda: len(escalations()) == 2, timeout=60, what="both tickets escalated")
            trust = httpx.get(f"{healer.url}/api/v1/trust", timeout=5).json()
            page = httpx.get(f"{healer.url}/trust", timeout=5).text
            exposition = httpx.get(f"{healer.url}/metrics", timeout=5).text
            listed = httpx.get(f"{healer.url}/api/v1/tickets", timeout=5).json()["items"]
            tickets_page = httpx.get(f"{healer.url}/tickets", timeout=5).text
            time.sleep(3)  # three more outbox rounds
            assert len(escalations()) == 2, escalations()
            assert {t["node"] for t in trust["overdue_tickets"]} == {n1, n2}
            assert all(t["overdue"] == ["ack"] for t in trust["overdue_tickets"])
            assert (
                "2 tickets past the provider&#39;s target" in page
                or "2 tickets past the provider's target" in page
            )
            assert 'healer_tickets_overdue{provider="default",target="ack"} 2.0' in exposition
            assert sorted((t["node"], t["overdue"]) for t in listed) == [(n1, ["ack"]), (n2, ["ack"])]
            assert tickets_page.count('data-testid="overdue"') >= 2

            # The provider answers; the GPUs cool (n4 heats again once validating).
            with sessions() as s:
                ticket_of = dict(
                    s.execute(select(Node.name, Ticket.id).join(Ticket, Ticket.node_id == Node.id)).all()
                )
            for node in (n1, n2, n3, n4, n5):
                metrics.cool(node)

            def cooled() -> bool:  # the repair is done once the GPUs read cool (else validation fails)
                with sessions() as s:
                    left = s.scalar(
                        select(Finding.id).where(Finding.node_name.in_([n1, n2]), Finding.state != "resolved")
                    )
                return left is None

            wait_until(cooled, timeout=60, what="n1 and n2 cool")
            for node, resolution in ((n1, "replaced"), (n2, "no_fault_found")):
                answer = receiver.send_callback(str(ticket_of[node]), "resolved", resolution=resolution)
                assert answer.http_status == 200, answer.answer
            wait_until(lambda: states(sessions).get(n4) == "validating", timeout=60, what=f"{n4} validating")
            metrics.fleet.inject(parse_scenario(f"faults: [{hot(n4, math.ceil(metrics.clock()))}]").faults[0])

            def settled() -> bool:
                healer.alive()
                now = states(sessions)
                with sessions() as s:
                    shadow_open = s.scalar(
                        select(ShadowDecision.id).where(ShadowDecision.closed_at.is_(None))
                    )
                return (
                    all(now.get(n) == "healthy" for n in (n1, n2, n3))
                    and now.get(n4) == "awaiting_repair"
                    and shadow_open is None
                )

            wait_until(settled, timeout=120, what="n1-n3 back, n4 out again, the shadow decisions closed")
            trust = httpx.get(f"{healer.url}/api/v1/trust", timeout=5).json()
            page = httpx.get(f"{healer.url}/trust", timeout=5).text
            exposition = httpx.get(f"{healer.url}/metrics", timeout=5).text
            healer.stop()
    finally:
        receiver.stop()

    rules_seen = {r["rule"]: r for r in trust["rules"]}
    hot_rule, q_rule = rules_seen["GpuTooHot"], rules_seen["GpuTooHotQ"]
    # A replaced part raises precision, "no fault found" lowers it; a failed validation raises
    # it, a node recovering with no repair lowers it.
    assert hot_rule["bases"] == {"part_replaced": 1, "no_fault_found": 1}
    assert q_rule["bases"] == {"validation_failed": 1, "recovered": 1}
    for r in (hot_rule, q_rule):
        assert (r["decided"], r["confirmed"], r["false_quarantines"], r["precision"]) == (2, 1, 1, 0.5)
    assert "GpuTooHotShadow" not in rules_seen
    assert 'healer_rule_precision{rule="GpuTooHot"} 0.5' in exposition
    assert 'healer_rule_decisions{outcome="not_confirmed",pool="h100",rule="GpuTooHotQ"} 1.0' in exposition

    # The numbers match a hand count over the record: GPU-hours out of service and time to repair.
    with sessions() as s:
        closed = list(s.scalars(select(Incident).where(Incident.closed_at.is_not(None))))
        steps = {
            i.id: list(
                s.execute(
                    select(Transition.at, Transition.to_state)
                    .where(Transition.incident_id == i.id)
                    .order_by(Transition.at, Transition.id)
                )
            )
            for i in closed
        }
        names = dict(s.execute(select(Node.id, Node.name)).all())
        shadow_rows = list(s.scalars(select(ShadowDecision)))
        dry = list(s.scalars(select(Action).where(Action.status == "dry_run")))
        touched = {names[n] for n in s.scalars(select(Transition.node_id))}
        tickets_for = {names[n] for n in s.scalars(select(Ticket.node_id))}
        shadow_evidence = list(
            s.scalars(select(Finding.incident_id).where(Finding.rule == "GpuTooHotShadow"))
        )

    def hours_out(incident: Incident) -> float:
        first: datetime = next(at for at, to in steps[incident.id] if to in OUT)
        assert incident.closed_at is not None
        return (incident.closed_at - first).total_seconds() / 3600  # out from then to the close

    for rule, record in (("GpuTooHot", hot_rule), ("GpuTooHotQ", q_rule)):
        mine = [i for i in closed if i.rule == rule and any(to in OUT for _, to in steps[i.id])]
        assert len(mine) == 2
        assert all(i.gpus == 8 for i in mine)  # the KWOK nodes' nvidia.com/gpu capacity
        assert record["gpu_hours"] == pytest.approx(sum(8 * hours_out(i) for i in mine), abs=1e-3)
    returned = [i for i in closed if i.rule == "GpuTooHot"]
    ttr = sorted(hours_out(i) * 3600 for i in returned)
    assert hot_rule["median_time_to_repair_seconds"] == pytest.approx(sum(ttr) / 2, abs=1e-3)

    # The shadow rule: its would-be decisions with outcomes from what happened to the nodes, and
    # nothing done: n5 was never touched, never ticketed; n1 moved for GpuTooHot only.
    (shadow,) = trust["shadow"]
    assert (shadow["rule"], shadow["nodes"], shadow["tickets"]) == ("GpuTooHotShadow", sorted([n1, n5]), 2)
    assert (shadow["confirmed"], shadow["not_confirmed"], shadow["precision"]) == (1, 1, 0.5)
    by_node = {d["node"]: d for d in trust["shadow_decisions"]}
    assert by_node[n1]["outcome"] == "confirmed" and by_node[n1]["basis"].endswith("part_replaced")
    assert (by_node[n5]["outcome"], by_node[n5]["basis"]) == ("not_confirmed", "recovered")
    assert by_node[n5]["would"] == ["cordon", "ticket"]
    assert {r.node_name for r in shadow_rows} == {n1, n5}
    assert {r.gpus for r in shadow_rows} == {8}  # the nodes' nvidia.com/gpu capacity
    fired = sum((r.closed_at - r.opened_at).total_seconds() for r in shadow_rows if r.closed_at)
    assert shadow["gpu_hours"] == pytest.approx(8 * fired / 3600, abs=1e-3)
    assert n5 not in touched and n5 not in tickets_for
    assert not world.node(n5)["spec"].get("unschedulable")
    assert {(a.target, a.kind) for a in dry} == {
        (n1, "cordon"),
        (n1, "ticket"),
        (n5, "cordon"),
        (n5, "ticket"),
    }
    assert all(i.rule != "GpuTooHotShadow" for i in closed)
    assert shadow_evidence and set(shadow_evidence) == {None}, "a shadow finding is no incident's evidence"
    assert 'data-rule="GpuTooHotShadow"' in page and "50%" in page
