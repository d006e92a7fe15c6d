"""Domain incidents in the controller's passes (healer.controller.domains): the real Kubernetes
adapter over HTTP against the API emulator, real databases (SQLite and PostgreSQL), the ticket
outbox. Time is a parameter; nothing sleeps. (`healer run` on the real control plane:
tests/e2e/test_run_domains.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer import operations
from healer.config import KubernetesSettings
from healer.model.states import NodeState, TicketStatus
from healer.store.models import Action, DomainIncident, Incident, Ticket
from healer.store.session import transaction
from healer_dev.k8s_emulator import KubernetesEmulator
from healer_dev.remediation_harness import T0, Harness, fleet_nodes, hot, tick
from tests.k8s_emulator import emulator, k8s_api, k8s_settings

__all__ = ["emulator", "k8s_api", "k8s_settings"]

#: gpu-00..gpu-09 behind leaf-a, gpu-10..gpu-19 behind leaf-b
TOPOLOGY = {f"gpu-{i:02d}": {"ib_leaf": "leaf-a" if i < 10 else "leaf-b"} for i in range(20)}
STORM = [f"gpu-{i:02d}" for i in range(5)]


@pytest.fixture
def harness(
    emulator: KubernetesEmulator, session_factory: sessionmaker[Session], k8s_settings: KubernetesSettings
) -> Iterator[Harness]:
    h = Harness(emulator, session_factory, k8s_settings, max_unhealthy_percent=100)
    h.emu.load(fleet_nodes(20))
    yield h
    h.api.close()


def domain_tickets(harness: Harness) -> list[Ticket]:
    with harness.sessions() as s:
        return list(s.scalars(select(Ticket).where(Ticket.domain_incident_id.is_not(None))))


def test_paused_a_storm_opens_its_domain_incident_but_takes_and_tickets_nothing_until_resumed(
    harness: Harness,
) -> None:
    with transaction(harness.sessions) as s:
        operations.set_paused(s, paused=True, actor="sre", now=T0)
    harness.remediate(tick(T0, *map(hot, STORM)), topology=TOPOLOGY)
    assert {harness.state(n) for n in STORM} == {NodeState.SUSPECT}
    assert harness.cordoned() == [] and domain_tickets(harness) == []
    with harness.sessions() as s:
        [domain] = s.scalars(select(DomainIncident)).all()
        assert (domain.kind, domain.name, domain.closed_at) == ("ib_leaf", "leaf-a", None)

    with transaction(harness.sessions) as s:
        operations.set_paused(s, paused=False, actor="sre", now=T0)
    harness.remediate(tick(T0 + timedelta(seconds=30), *map(hot, STORM)), topology=TOPOLOGY)
    assert {harness.state(n) for n in STORM} == {NodeState.AWAITING_REPAIR}
    assert harness.cordoned() == []  # tainted only
    [ticket] = domain_tickets(harness)
    assert ticket.provider == "default"
    with harness.sessions() as s:
        node_tickets = s.scalars(select(Ticket).where(Ticket.domain_incident_id.is_(None))).all()
        assert node_tickets == []
        linked = s.scalars(select(Incident.domain_incident_id).where(Incident.closed_at.is_(None))).all()
        assert linked == [domain.id] * len(STORM)


def test_the_domain_returns_through_validation_and_its_incident_closes(harness: Harness) -> None:
    t = T0
    harness.remediate(tick(t, *map(hot, STORM)), topology=TOPOLOGY)
    [ticket] = domain_tickets(harness)
    with transaction(harness.sessions) as s:  # the provider's "resolved" callback, as an input
        s.get(Ticket, ticket.id).status = TicketStatus.RESOLVED  # type: ignore[union-attr]
    for _ in range(3):  # clear ticks: repaired and validating, the hold, returned
        t += timedelta(seconds=300)
        harness.remediate(tick(t), topology=TOPOLOGY)
    assert {harness.state(n) for n in STORM} == {NodeState.HEALTHY}
    assert all(not harness.k8s_node(n)["spec"].get("taints") for n in STORM)
    with harness.sessions() as s:
        [domain] = s.scalars(select(DomainIncident)).all()
        assert domain.close_reason == "repaired: every member back in service"
        audit = s.scalars(select(Action.detail).where(Action.kind == "domain_incident")).all()
        assert [("closed" in (d or {})) for d in audit] == [False, True]
    assert harness.path(STORM[0]) == [
        ("healthy", "suspect"),
        ("suspect", "quarantined"),
        ("quarantined", "awaiting_repair"),
        ("awaiting_repair", "repaired"),
        ("repaired", "validating"),
        ("validating", "healthy"),
    ]
