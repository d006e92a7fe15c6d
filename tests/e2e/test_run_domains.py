"""`healer run` on the real control plane for issue 30: 16 of 64 nodes behind one InfiniBand leaf
switch failing together are one domain incident with one ticket to the switch queue, no
replacement ticket, and all 16 come back once that ticket is resolved; a node already draining
when the storm hits joins it without a ticket of its own; two unrelated nodes failing at the same
time in two other domains stay two node incidents (docs/topology.md).

Real processes and services: `healer run` as the chart's ServiceAccount, 66 KWOK nodes labelled
with their leaf switch, a StatefulSet pod and a PodDisruptionBudget (the drain that stays
running), a real Prometheus scraping the fleet simulator, a webhook receiver on loopback that
also sends the signed "resolved" callback, SQLite.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.store.models import DomainIncident, Incident, Node, Ticket
from healer_dev.provider import Receiver
from healer_dev.simulator.scenario import HotGpu
from tests.e2e.harness import PROVIDER_SECRET, PROVIDER_SECRET_ENV, World, hot_gpu_rules
from tests.services import wait_until

pytestmark = pytest.mark.prometheus

LEAF = "topology.healer.dev/ib-leaf"


def states(sessions: sessionmaker[Session], nodes: list[str]) -> dict[str, str]:
    with sessions() as s:
        return dict(s.execute(select(Node.name, Node.state).where(Node.name.in_(nodes))).all())


def taint_values(world: World, node: str) -> list[str]:
    taints = world.node(node)["spec"].get("taints") or []
    return [t.get("value", "") for t in taints if t["key"] == f"{world.domain}/quarantined"]


def test_a_leaf_switch_storm_is_one_domain_incident_one_switch_ticket_and_its_nodes_return(
    world: World,
) -> None:
    pool = f"h100-{world.prefix}"
    leaf = world.add_nodes(64, pool=pool, labels={LEAF: "leaf-a"})
    [other_b] = world.add_nodes(1, pool=pool, start=64, labels={LEAF: "leaf-b"})
    [other_c] = world.add_nodes(1, pool=pool, start=65, labels={LEAF: "leaf-c"})
    early, storm = leaf[0], leaf[1:16]
    web = world.namespace("web")
    world.stateful_set(web, "db", node=early)
    world.budget(web, "db", app="db", min_available=1)  # the drain of `early` stays running
    receiver = Receiver(secret=PROVIDER_SECRET.encode(), callback_secret=PROVIDER_SECRET.encode()).start()
    world.rules(hot_gpu_rules("[quarantine, {drain: {timeout: 10m}}, {ticket: {provider: default}}]"))
    db = f"sqlite:///{world.tmp_path / 'healer.db'}"

    def provider(name: str) -> dict[str, Any]:
        return {
            "name": name,
            "url": f"{receiver.url}/{name}",
            "secret_env": PROVIDER_SECRET_ENV,
            "callback_secret_env": PROVIDER_SECRET_ENV,
        }

    try:
        scenario = f"faults: [{{at: 0s, node: {early}, gpu: 3, fault: hot_gpu, target: 90}}]"
        hot = f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{early}"}} > 78'
        with world.metrics(66, scenario, wait_for=hot) as metrics:
            config = world.config(
                db=db,
                prometheus_url=metrics.url,
                # The breaker (5 nodes) and a budget of 4 would hold 18 nodes: the domain counts once.
                safety={"max_unhealthy": 4, "max_unhealthy_percent": 100, "recovery_hold_seconds": 2},
                tickets={"providers": [provider("default"), provider("network")]},
                topology={"ib_leaf": {"provider": "network"}},
            )
            healer = world.start(config)
            receiver.callback_url = healer.url
            sessions = world.sessions(db, healer)
            wait_until(
                lambda: states(sessions, [early]).get(early) == "draining",
                timeout=120,
                what=f"{early} draining on its own",
            )

            for node in [*storm, other_b, other_c]:  # one storm, and two unrelated nodes at once
                metrics.fleet.inject(HotGpu(at=metrics.clock(), node=node, gpu=3, fault="hot_gpu", target=90))

            def held() -> dict[str, str] | None:
                healer.alive()
                now = states(sessions, [*leaf[:16], other_b, other_c])
                leaf_waiting = all(now.get(n) == "awaiting_repair" for n in storm)
                others_ticketed = all(now.get(n) == "awaiting_repair" for n in (other_b, other_c))
                return now if leaf_waiting and others_ticketed else None

            wait_until(held, timeout=120, what="the storm waiting for the switch, the others ticketed")
            wait_until(lambda: len(receiver.requests) >= 3, timeout=30, what="three tickets delivered")
            status = httpx.get(f"{healer.url}/api/v1/status", timeout=5).json()
            assert status["breaker"]["tripped"] is False
            exposition = httpx.get(f"{healer.url}/metrics", timeout=5).text
            assert 'healer_domain_incidents_open{kind="ib_leaf"} 1.0' in exposition
            assert 'healer_domain_incident_nodes{kind="ib_leaf"} 16.0' in exposition
            # tainted, not cordoned; `early` keeps its own cordon and drain
            for node in storm:
                assert not world.node(node)["spec"].get("unschedulable"), node
                assert taint_values(world, node) == ["domain-ib_leaf"], node
            assert states(sessions, [early])[early] == "draining"
            assert world.node(other_b)["spec"]["unschedulable"] is True

            by_path = {}
            for request in receiver.requests:
                by_path.setdefault(request.path.strip("/"), []).append(request.json)
            [switch] = by_path["network"]
            node_tickets = by_path["default"]
            assert sorted(t["node"]["name"] for t in node_tickets) == sorted([other_b, other_c])
            assert switch["domain"]["kind"] == "ib_leaf" and switch["domain"]["name"] == "leaf-a"
            assert switch["domain"]["nodes"] == sorted(leaf[:16])
            assert switch["domain"]["size"] == 64
            assert "16 of 64 node(s) failing together" in switch["title"]

            # the dashboard: the leaf red on the topology grid, the incident page lists its 16 nodes
            topology = httpx.get(f"{healer.url}/api/v1/topology", timeout=5).json()
            leaves = {c["name"]: c for c in topology["kinds"]["ib_leaf"]}
            # leaf-a has a domain incident; leaf-b one node out on its own (amber, its node red)
            assert (leaves["leaf-a"]["health"], leaves["leaf-b"]["health"]) == ("bad", "warn")
            assert [n["health"] for n in leaves["leaf-b"]["nodes"]] == ["bad"]
            assert (
                leaves["leaf-a"]["incident"] == switch["domain"]["id"]
                and leaves["leaf-b"]["incident"] is None
            )
            page = httpx.get(f"{healer.url}/topology", timeout=5).text
            assert f'href="/domains/{switch["domain"]["id"]}"' in page
            detail = httpx.get(f"{healer.url}/api/v1/domains/{switch['domain']['id']}", timeout=5).json()
            assert sorted(mb["node"] for mb in detail["members"]) == sorted(leaf[:16])
            assert {mb["state"] for mb in detail["members"] if mb["node"] != early} == {"awaiting_repair"}
            assert [t["provider"] for t in detail["tickets"]] == ["network"]
            domain_page = httpx.get(f"{healer.url}/domains/{switch['domain']['id']}", timeout=5).text
            assert "16 of 64 node(s) of ib_leaf leaf-a turned bad" in domain_page

            # the switch is fixed: the provider resolves its ticket, the GPUs cool
            for node in leaf[:16]:
                metrics.cool(node)
            callback = receiver.send_callback(str(switch["ticket_id"]), "resolved")
            assert callback.http_status == 200, callback

            def back() -> dict[str, str] | None:
                healer.alive()
                now = states(sessions, leaf[:16])
                return now if set(now.values()) == {"healthy"} else None

            wait_until(back, timeout=120, what="the 16 nodes back in service")
            with sessions() as s:
                domain = s.scalars(select(DomainIncident)).all()
                tickets = s.execute(
                    select(Node.name, Ticket.provider, Ticket.domain_incident_id).join(
                        Node, Node.id == Ticket.node_id
                    )
                ).all()
                linked = s.scalars(
                    select(Node.name)
                    .join(Incident, Incident.node_id == Node.id)
                    .where(Incident.domain_incident_id.is_not(None))
                ).all()

            def closed() -> bool:
                with sessions() as s:
                    return s.scalar(select(DomainIncident.closed_at)) is not None

            wait_until(closed, timeout=30, what="the domain incident closed")
            healer.stop()
    finally:
        receiver.stop()

    [incident] = domain
    assert (incident.kind, incident.name, incident.size) == ("ib_leaf", "leaf-a", 64)
    assert sorted(m["node"] for m in incident.members) == sorted(leaf[:16])
    assert sorted(set(linked)) == sorted(leaf[:16])
    # one switch ticket, no replacement ticket for any of its nodes, one each for the unrelated two
    node_tickets_in_db = sorted((n, p) for n, p, d in tickets if d is None)
    assert node_tickets_in_db == sorted([(other_b, "default"), (other_c, "default")])
    assert [p for _, p, d in tickets if d is not None] == ["network"]
    for node in leaf[:16]:
        assert taint_values(world, node) == [], node
        assert not world.node(node)["spec"].get("unschedulable"), node
    assert world.node(other_c)["spec"]["unschedulable"] is True  # its own repair is still awaited
