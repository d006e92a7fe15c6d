"""The remediation executor end to end: real Kubernetes adapter over HTTP against the API emulator,
real databases (SQLite and PostgreSQL), the ticket outbox. Time is a parameter; nothing sleeps.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session, sessionmaker

from healer import operations
from healer.actions.apiretry import READ_ATTEMPTS
from healer.config import KubernetesSettings
from healer.controller.backoff import Backoff
from healer.model.findings import TickFindings
from healer.model.states import NodeState
from healer.ruleset.capacity import CapacityRule
from healer.store import nodes as repo
from healer.store.models import Incident, Node, Ticket, Transition
from healer.store.session import transaction
from healer_dev.k8s_emulator import KubernetesEmulator, node, pod, pod_disruption_budget
from healer_dev.remediation_harness import (
    HOLD,
    POOL_LABEL,
    T0,
    Harness,
    fleet_nodes,
    hot,
    tick,
)
from tests.k8s_emulator import emulator, k8s_api, k8s_settings

__all__ = ["emulator", "k8s_api", "k8s_settings"]


@pytest.fixture
def harness(
    emulator: KubernetesEmulator, session_factory: sessionmaker[Session], k8s_settings: KubernetesSettings
) -> Iterator[Harness]:
    h = Harness(emulator, session_factory, k8s_settings)
    yield h
    h.api.close()


def workload(name: str) -> list[dict[str, Any]]:
    """A GPU node's pods: DaemonSet and mirror pods (kept), a training Job pod with scratch space and
    an inference replica (evicted)."""
    return [
        pod(f"dcgm-exporter-{name}", node_name=name, namespace="monitoring", owner=("DaemonSet", "dcgm")),
        pod(f"kube-proxy-{name}", node_name=name, namespace="kube-system", owner=None, mirror=True),
        pod(f"train-{name}", node_name=name, namespace="ml", owner=("Job", "train"), empty_dir=True),
        pod(
            f"web-{name}",
            node_name=name,
            namespace="web",
            owner=("ReplicaSet", "web-1"),
            labels={"app": "web"},
        ),
    ]


def test_firing_rule_quarantines_drains_and_requests_a_ticket(harness: Harness) -> None:
    harness.emu.load([*fleet_nodes(20), *workload("gpu-03")])

    result = harness.remediate(tick(T0, hot("gpu-03")))

    assert result.states() == {"gpu-03": NodeState.DRAINING}
    seen = harness.k8s_node("gpu-03")
    assert seen["spec"]["unschedulable"] is True
    assert {"key": "healer.dev/quarantined", "value": "GpuTooHot", "effect": "NoSchedule"} in seen["spec"][
        "taints"
    ]
    condition = next(c for c in seen["status"]["conditions"] if c["type"] == "GpuHealthy")
    assert (condition["status"], condition["reason"]) == ("False", "GpuTooHot")
    annotations = seen["metadata"]["annotations"]
    assert annotations["healer.dev/cordoned-by"] == "healer"
    assert annotations["healer.dev/incident"].isdigit()
    assert "HealerQuarantined" in harness.event_reasons("gpu-03")

    harness.drains(T0 + timedelta(seconds=10))
    harness.drains(T0 + timedelta(seconds=20))

    assert harness.state("gpu-03") == NodeState.AWAITING_REPAIR
    assert sorted(harness.emu.pods_on("gpu-03")) == [
        "kube-system/kube-proxy-gpu-03",
        "monitoring/dcgm-exporter-gpu-03",
    ]
    assert harness.path("gpu-03") == [
        ("healthy", "suspect"),
        ("suspect", "quarantined"),
        ("quarantined", "draining"),
        ("draining", "awaiting_repair"),
    ]
    with harness.sessions() as s:
        incident = s.scalars(select(Incident)).one()
        ticket = s.scalars(select(Ticket)).one()
        assert (ticket.incident_id, ticket.provider) == (incident.id, "acme")
        transitions = s.scalars(select(Transition).order_by(Transition.id)).all()
        assert {t.actor for t in transitions} == {"healer"}
        assert all(t.incident_id == incident.id for t in transitions)
        assert transitions[1].evidence["findings"][0]["rule"] == "GpuTooHot"  # type: ignore[index]
        assert transitions[1].evidence["findings"][0]["value"] == 91.5  # type: ignore[index]
    drain_row = harness.actions_of("gpu-03", kind="drain")
    assert [d.status for d in drain_row] == ["succeeded"]
    assert set(drain_row[0].detail["evicted"]) == {"ml/train-gpu-03", "web/web-gpu-03"}  # type: ignore[index]
    assert {a.kind for a in harness.actions_of("gpu-03")} >= {
        "cordon",
        "taint",
        "condition",
        "event",
        "drain",
        "ticket",
    }


def test_eighty_of_a_hundred_trips_the_breaker_and_nothing_moves_until_reset(harness: Harness) -> None:
    harness.emu.load(fleet_nodes(100))
    bad = [hot(f"gpu-{i:02d}") for i in range(80)]

    result = harness.remediate(tick(T0, *bad))

    assert result.breaker_tripped and result.breaker is not None
    assert result.breaker.reason.startswith("80 node(s) (80% of 100) turned bad within 300 s")
    assert harness.cordoned() == []
    assert len(result.held) == 80
    with harness.sessions() as s:
        breaker = repo.get_switch(s, repo.SWITCH_BREAKER)
    assert breaker["tripped"] is True and len(breaker["held"]) == 80
    refused = harness.actions_of(status="refused")
    assert len(refused) == 80 and {a.error for a in refused} == {"breaker"}
    assert harness.state("gpu-00") == NodeState.BLOCKED

    # Another tick with the same findings: still nothing, and no duplicate refusals.
    harness.remediate(tick(T0 + timedelta(seconds=30), *bad))
    assert harness.cordoned() == []
    assert len(harness.actions_of(status="refused")) == 80

    with transaction(harness.sessions) as s:
        held = operations.reset_breaker(s, actor="cli:alice", now=T0 + timedelta(minutes=1))
    assert len(held) == 80

    # Re-evaluated against fresh data: 10 nodes still firing; the budget lets 2 go out.
    still = [hot(f"gpu-{i:02d}") for i in range(10)]
    result = harness.remediate(tick(T0 + timedelta(minutes=2), *still))
    assert not result.breaker_tripped
    assert harness.cordoned() == ["gpu-00", "gpu-01"]
    assert sum(1 for r in result.refused().values() if r == "budget") == 8
    # Nodes that stopped firing while held are healthy again, untouched.
    assert harness.state("gpu-50") == NodeState.HEALTHY


def test_budget_counts_nodes_already_out_of_service(harness: Harness) -> None:
    harness.emu.load(fleet_nodes(30))
    harness.remediate(tick(T0, hot("gpu-00")))
    harness.remediate(
        tick(T0 + timedelta(minutes=10), hot("gpu-00"), hot("gpu-01", fired_at=T0 + timedelta(minutes=10)))
    )
    assert harness.cordoned() == ["gpu-00", "gpu-01"]
    third = harness.remediate(
        tick(
            T0 + timedelta(minutes=20),
            hot("gpu-00"),
            hot("gpu-01"),
            hot("gpu-02", fired_at=T0 + timedelta(minutes=20)),
        )
    )
    assert third.refused() == {"gpu-02": "budget"}
    assert harness.cordoned() == ["gpu-00", "gpu-01"]
    blocked = harness.path("gpu-02")[-1]
    assert blocked == ("suspect", "blocked")
    with harness.sessions() as s:
        reason = s.scalar(select(Transition.reason).order_by(Transition.id.desc()).limit(1))
    assert (
        reason
        == "budget: pool a100: 2 of 30 node(s) out of service, budget 2 (max_unhealthy 2, 10% of the pool)"
    )


def test_pdb_that_never_allows_eviction_blocks_at_the_deadline(harness: Harness) -> None:
    harness.emu.load(
        [
            *fleet_nodes(20),
            pod(
                "db-0", node_name="gpu-05", namespace="web", owner=("StatefulSet", "db"), labels={"app": "db"}
            ),
            pod_disruption_budget("db", namespace="web", match_labels={"app": "db"}, min_available=1),
        ]
    )
    harness.remediate(tick(T0, hot("gpu-05")))
    assert harness.state("gpu-05") == NodeState.DRAINING

    harness.drains(T0 + timedelta(minutes=1))
    harness.drains(T0 + timedelta(minutes=5))
    assert harness.state("gpu-05") == NodeState.DRAINING
    harness.drains(T0 + timedelta(minutes=11))

    assert harness.state("gpu-05") == NodeState.BLOCKED
    with harness.sessions() as s:
        reason = s.scalar(select(Transition.reason).order_by(Transition.id.desc()).limit(1))
    assert reason is not None and "web/db-0" in reason and "web/db" in reason
    assert "HealerDrainBlocked" in harness.event_reasons("gpu-05")
    assert harness.emu.pods_on("gpu-05") == ["web/db-0"]  # nothing deleted
    assert harness.k8s_node("gpu-05")["spec"]["unschedulable"] is True  # a failed drain never uncordons
    assert [a.status for a in harness.actions_of("gpu-05", kind="drain")] == ["blocked"]

    # Blocked stays blocked: no more drain steps, no re-drain on the next tick.
    harness.drains(T0 + timedelta(minutes=12))
    harness.remediate(tick(T0 + timedelta(minutes=12), hot("gpu-05")))
    assert harness.state("gpu-05") == NodeState.BLOCKED


def test_human_uncordon_mid_drain_stops_and_no_recordon_until_a_new_incident(harness: Harness) -> None:
    harness.emu.load(
        [
            *fleet_nodes(20),
            pod(
                "db-0", node_name="gpu-07", namespace="web", owner=("StatefulSet", "db"), labels={"app": "db"}
            ),
            pod_disruption_budget("db", namespace="web", match_labels={"app": "db"}, min_available=1),
        ]
    )
    harness.remediate(tick(T0, hot("gpu-07")))
    harness.drains(T0 + timedelta(minutes=1))
    assert harness.state("gpu-07") == NodeState.DRAINING

    harness.uncordon_by_hand("gpu-07")
    attempts = len(harness.emu.evictions)
    harness.drains(T0 + timedelta(minutes=2))

    assert harness.state("gpu-07") == NodeState.RELEASED
    assert len(harness.emu.evictions) == attempts  # the drain stopped
    assert "HealerReleased" in harness.event_reasons("gpu-07")
    seen = harness.k8s_node("gpu-07")
    assert not seen["spec"].get("unschedulable")
    assert not any(t["key"] == "healer.dev/quarantined" for t in seen["spec"].get("taints") or [])

    # The condition tells the truth: the fault still fires, and healer is not remediating.
    [condition] = [c for c in seen["status"]["conditions"] if c["type"] == "GpuHealthy"]
    assert condition["status"] == "False", condition
    assert "healer is not remediating it" in condition["message"]
    assert "released by healer" not in condition["message"]

    # Still firing: hands off, tick after tick.
    for minutes in (3, 10, 30):
        harness.remediate(tick(T0 + timedelta(minutes=minutes), hot("gpu-07")))
        harness.drains(T0 + timedelta(minutes=minutes))
    assert harness.cordoned() == []
    assert harness.state("gpu-07") == NodeState.RELEASED

    # The finding clears (incident over), then fires again: a new incident, quarantined again.
    harness.remediate(tick(T0 + timedelta(minutes=40)))
    assert harness.state("gpu-07") == NodeState.HEALTHY
    [condition] = [c for c in harness.k8s_node("gpu-07")["status"]["conditions"] if c["type"] == "GpuHealthy"]
    assert condition["status"] == "True", condition
    harness.remediate(tick(T0 + timedelta(minutes=50), hot("gpu-07", fired_at=T0 + timedelta(minutes=50))))
    assert harness.cordoned() == ["gpu-07"]
    with harness.sessions() as s:
        incidents = s.scalars(select(Incident).order_by(Incident.id)).all()
    assert [i.close_reason for i in incidents] == ["findings cleared after a human took over", None]


def test_restart_mid_drain_finishes_without_duplicate_actions(harness: Harness) -> None:
    harness.emu.load(
        [
            *fleet_nodes(20),
            pod(
                "web-a",
                node_name="gpu-09",
                namespace="web",
                owner=("ReplicaSet", "web-1"),
                labels={"app": "web"},
            ),
            pod(
                "web-b",
                node_name="gpu-09",
                namespace="web",
                owner=("ReplicaSet", "web-1"),
                labels={"app": "web"},
            ),
            pod_disruption_budget("web", namespace="web", match_labels={"app": "web"}, max_unavailable=1),
        ]
    )
    harness.remediate(tick(T0, hot("gpu-09")))
    harness.drains(T0 + timedelta(seconds=10))  # one pod evicted, the other held by the budget
    assert len(harness.emu.pods_on("gpu-09")) == 1
    harness.emu.reschedule_evicted("gpu-01")  # its replacement becomes ready elsewhere

    second = harness.restart()  # a new process: new client, new adapter, same database
    second.remediate(tick(T0 + timedelta(seconds=30), hot("gpu-09")))
    second.drains(T0 + timedelta(seconds=40))
    second.drains(T0 + timedelta(seconds=50))
    second.api.close()

    assert second.state("gpu-09") == NodeState.AWAITING_REPAIR
    assert harness.emu.pods_on("gpu-09") == []
    assert [harness.emu.eviction_count(f"web/web-{x}") for x in "ab"] == [1, 1]
    kinds = [a.kind for a in harness.actions_of("gpu-09")]
    for kind in ("cordon", "taint", "condition", "drain", "ticket"):
        assert kinds.count(kind) == 1, kind
    assert [b for _, b in harness.path("gpu-09")] == ["suspect", "quarantined", "draining", "awaiting_repair"]
    with harness.sessions() as s:
        assert s.scalar(select(func.count()).select_from(Ticket)) == 1


def test_return_to_service_after_release_and_a_clear_recovery_hold(harness: Harness) -> None:
    harness.emu.load([*fleet_nodes(20), *workload("gpu-04")])
    harness.remediate(tick(T0, hot("gpu-04")))
    harness.drains(T0 + timedelta(seconds=10))
    harness.drains(T0 + timedelta(seconds=20))
    assert harness.state("gpu-04") == NodeState.AWAITING_REPAIR

    t1 = T0 + timedelta(hours=2)
    with transaction(harness.sessions) as s:
        operations.release_node(s, node_name="gpu-04", actor="cli:alice", now=t1, reason="GPU replaced")
    # One writer of node state (issue 24): the request waits for the controller's reconcile.
    assert harness.state("gpu-04") == NodeState.AWAITING_REPAIR
    harness.remediate(tick(t1))  # released by the lifecycle's row; clear: the hold starts
    with harness.sessions() as s:
        moved = s.scalars(select(Transition).where(Transition.to_state == "validating")).one()
        assert (moved.from_state, moved.actor) == ("awaiting_repair", "healer")
        assert "released by cli:alice (GPU replaced)" in moved.reason
        assert s.scalars(select(Incident)).one().release_requested is None  # acted on once
    harness.remediate(
        tick(t1 + timedelta(seconds=120), hot("gpu-04", rule="EccNotice"))
    )  # notify-only: not a fault
    harness.remediate(tick(t1 + timedelta(seconds=HOLD - 1)))
    assert harness.state("gpu-04") == NodeState.VALIDATING
    assert harness.cordoned() == ["gpu-04"]

    final = harness.remediate(tick(t1 + timedelta(seconds=HOLD)))

    assert harness.state("gpu-04") == NodeState.HEALTHY, final
    seen = harness.k8s_node("gpu-04")
    assert not seen["spec"].get("unschedulable")
    assert not any(t["key"] == "healer.dev/quarantined" for t in seen["spec"].get("taints") or [])
    assert not any(k.startswith("healer.dev/") for k in seen["metadata"].get("annotations") or {})
    condition = next(c for c in seen["status"]["conditions"] if c["type"] == "GpuHealthy")
    assert condition["status"] == "True"
    assert [b for _, b in harness.path("gpu-04")][-2:] == ["validating", "healthy"]
    with harness.sessions() as s:
        incident = s.scalars(select(Incident)).one()
    assert incident.close_reason == "returned to service"
    assert "HealerNotify" in harness.event_reasons("gpu-04")


def test_validation_interrupted_by_a_pending_finding_restarts_the_hold(harness: Harness) -> None:
    harness.emu.load(fleet_nodes(20))
    harness.remediate(tick(T0, hot("gpu-02")))
    with transaction(harness.sessions) as s:
        row = s.scalars(select(Node).where(Node.name == "gpu-02")).one()
        repo.transition(s, row, NodeState.AWAITING_REPAIR, now=T0, actor="test", reason="drained")
        operations.release_node(s, node_name="gpu-02", actor="cli:bob", now=T0)
    harness.remediate(tick(T0 + timedelta(seconds=10)))
    pending = TickFindings(
        at=T0 + timedelta(seconds=200),
        pending={"gpu-02": [hot("gpu-02")]},
    )
    harness.remediate(pending)
    harness.remediate(tick(T0 + timedelta(seconds=320)))
    assert harness.state("gpu-02") == NodeState.VALIDATING  # the hold restarted at 320 s
    harness.remediate(tick(T0 + timedelta(seconds=320 + HOLD)))
    assert harness.state("gpu-02") == NodeState.HEALTHY


def test_node_deleted_mid_drain_closes_the_incident_and_frees_the_budget(harness: Harness) -> None:
    harness.emu.load(
        [
            *fleet_nodes(20),
            pod(
                "db-0", node_name="gpu-01", namespace="web", owner=("StatefulSet", "db"), labels={"app": "db"}
            ),
            pod_disruption_budget("db", namespace="web", match_labels={"app": "db"}, min_available=1),
        ]
    )
    harness.remediate(tick(T0, hot("gpu-00"), hot("gpu-01")))
    assert harness.cordoned() == ["gpu-00", "gpu-01"]
    harness.emu.delete("Node", "gpu-01")

    harness.drains(T0 + timedelta(seconds=10))

    assert harness.state("gpu-01") == NodeState.UNKNOWN
    with harness.sessions() as s:
        closed = s.scalar(
            select(Incident.close_reason).join(Node, Node.id == Incident.node_id).where(Node.name == "gpu-01")
        )
    assert closed == "node deleted"
    later = T0 + timedelta(minutes=10)
    result = harness.remediate(tick(later, hot("gpu-00"), hot("gpu-02", fired_at=later)))
    assert "gpu-02" in harness.cordoned()
    assert result.refused() == {}


def test_opt_out_label_means_never_touched(harness: Harness) -> None:
    harness.emu.load(
        [*fleet_nodes(10), node("gpu-99", labels={POOL_LABEL: "a100", "healer.dev/opt-out": "true"})]
    )
    for minutes in (0, 1, 2):
        harness.remediate(tick(T0 + timedelta(minutes=minutes), hot("gpu-99")))
    assert harness.cordoned() == []
    assert harness.event_reasons("gpu-99") == []
    assert harness.state("gpu-99") == NodeState.SUSPECT  # the finding is still recorded
    refused = harness.actions_of("gpu-99", status="refused")
    assert [(a.kind, a.error) for a in refused] == [("quarantine", "opt-out")]


def test_a_burst_node_is_never_quarantined_nor_ticketed(harness: Harness) -> None:
    burst = CapacityRule.model_validate({"name": "overflow", "burst_nodes": {"type": "virtual-kubelet"}})
    rules = harness.rules.model_copy(update={"capacity": (burst,)})
    harness.emu.load([*fleet_nodes(10), node("vk-0", labels={POOL_LABEL: "a100", "type": "virtual-kubelet"})])
    for minutes in (0, 1, 2):
        harness.remediate(tick(T0 + timedelta(minutes=minutes), hot("vk-0")), rules=rules)
    assert harness.cordoned() == []
    assert harness.state("vk-0") == NodeState.SUSPECT  # the finding is still recorded
    refused = harness.actions_of("vk-0", status="refused")
    assert [(a.kind, a.error) for a in refused] == [("quarantine", "burst-node")]
    with harness.sessions() as s:
        assert s.scalar(select(func.count()).select_from(Ticket)) == 0


def test_pause_holds_quarantine_and_resume_lets_it_go(harness: Harness) -> None:
    harness.emu.load(fleet_nodes(20))
    with transaction(harness.sessions) as s:
        operations.set_paused(s, paused=True, actor="cli:alice", now=T0, reason="cluster upgrade")
    result = harness.remediate(tick(T0, hot("gpu-00")))
    assert result.paused and result.refused() == {"gpu-00": "paused"}
    assert harness.cordoned() == []
    with transaction(harness.sessions) as s:
        operations.set_paused(s, paused=False, actor="cli:alice", now=T0 + timedelta(minutes=1))
    harness.remediate(tick(T0 + timedelta(minutes=2), hot("gpu-00")))
    assert harness.cordoned() == ["gpu-00"]


def test_dry_run_records_and_changes_nothing(
    emulator: KubernetesEmulator, session_factory: sessionmaker[Session], k8s_settings: KubernetesSettings
) -> None:
    from healer.actions.dryrun import RecordingNodeActions

    h = Harness(emulator, session_factory, k8s_settings, dry_run=True)
    h.actions = RecordingNodeActions(h.actions, session_factory, actor="healer", clock=lambda: T0)  # type: ignore[assignment]
    emulator.load([*fleet_nodes(20), *workload("gpu-03")])
    h.remediate(tick(T0, hot("gpu-03")))
    h.drains(T0 + timedelta(seconds=10))
    h.remediate(tick(T0 + timedelta(seconds=30), hot("gpu-03")))
    h.api.close()

    assert h.cordoned() == []
    assert len(emulator.pods_on("gpu-03")) == 4
    assert h.state("gpu-03") == NodeState.AWAITING_REPAIR  # the story goes on, as it would have
    statuses = {(a.kind, a.status) for a in h.actions_of("gpu-03")}
    assert ("cordon", "dry_run") in statuses and ("drain", "dry_run") in statuses


# --- what each step costs the API server and the database ---------------------------------------


def test_quarantine_to_draining_reads_the_node_once_and_writes_it_in_one_patch(harness: Harness) -> None:
    harness.emu.load(fleet_nodes(20))
    harness.remediate(tick(T0 - timedelta(minutes=1)))
    before = len(harness.emu.requests)
    result = harness.remediate(tick(T0, hot("gpu-00")))
    calls = list(harness.emu.requests)[before:]

    assert result.states() == {"gpu-00": NodeState.DRAINING}
    assert calls == [
        ("GET", "/api/v1/nodes/gpu-00"),
        ("PATCH", "/api/v1/nodes/gpu-00"),  # cordon + taint + ownership annotations
        ("PATCH", "/api/v1/nodes/gpu-00/status"),  # the condition
        ("POST", "/apis/events.k8s.io/v1/namespaces/default/events"),  # HealerQuarantined
        ("POST", "/apis/events.k8s.io/v1/namespaces/default/events"),  # HealerDraining
    ]
    k8s_node = harness.k8s_node("gpu-00")
    assert k8s_node["spec"]["unschedulable"] is True
    assert [t["key"] for t in k8s_node["spec"]["taints"]] == ["healer.dev/quarantined"]
    assert k8s_node["metadata"]["annotations"]["healer.dev/cordoned-by"] == "healer"
    events = [
        e
        for e in harness.emu.list("Event", api_version="events.k8s.io/v1")
        if e["regarding"]["name"] == "gpu-00"
    ]
    assert {e["regarding"]["uid"] for e in events} == {k8s_node["metadata"]["uid"]}
    kinds = [a.kind for a in harness.actions_of("gpu-00")]
    assert kinds.count("cordon") == 1 and kinds.count("taint") == 1 and kinds.count("condition") == 1


def test_a_quiet_tick_costs_the_same_statements_at_any_fleet_size(harness: Harness) -> None:
    engine = harness.sessions.kw["bind"]
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    per_size = {}
    for size in (10, 300):
        fleet = {f"quiet-{i:03d}": "a100" for i in range(size)}
        harness.remediate(tick(T0), fleet=fleet)  # first sight: the rows are created
        statements.clear()
        event.listen(engine, "before_cursor_execute", count)
        try:
            requests = len(harness.emu.requests)
            harness.remediate(tick(T0 + timedelta(minutes=1)), fleet=fleet)
        finally:
            event.remove(engine, "before_cursor_execute", count)
        assert len(harness.emu.requests) == requests
        per_size[size] = len(statements)
    assert per_size[10] == per_size[300]


def test_a_failing_node_is_retried_next_tick_then_backed_off(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    harness.emu.load(fleet_nodes(20))
    backoff = Backoff()
    # The node's read fails, every try of it, in three passes running.
    harness.emu.inject_error("GET", r"/api/v1/nodes/gpu-00$", 503, times=3 * READ_ATTEMPTS)
    with caplog.at_level(logging.WARNING, logger="healer.controller.backoff"):
        first = harness.remediate(tick(T0, hot("gpu-00")), backoff=backoff)
        second = harness.remediate(tick(T0 + timedelta(seconds=5), hot("gpu-00")), backoff=backoff)
        third = harness.remediate(tick(T0 + timedelta(seconds=11), hot("gpu-00")), backoff=backoff)
        fourth = harness.remediate(tick(T0 + timedelta(seconds=16), hot("gpu-00")), backoff=backoff)
        fifth = harness.remediate(tick(T0 + timedelta(seconds=30), hot("gpu-00")), backoff=backoff)
        sixth = harness.remediate(tick(T0 + timedelta(seconds=37), hot("gpu-00")), backoff=backoff)

    assert [o.node for o in first.outcomes if o.error] == ["gpu-00"]
    assert [o.node for o in second.outcomes if o.error] == ["gpu-00"]  # the next pass: no delay
    assert third.outcomes == []  # failed twice running: waiting 10 s, not read, not logged
    assert [o.node for o in fourth.outcomes if o.error] == ["gpu-00"]  # retried once the delay passed
    assert fifth.outcomes == []  # then 20 s
    assert len([r for r in caplog.records if "gpu-00" in r.getMessage()]) == 1  # the same error: said once
    assert sixth.states() == {"gpu-00": NodeState.DRAINING}
