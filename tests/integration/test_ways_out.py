"""Safety that does not strand nodes, through the controller (real Kubernetes adapter over HTTP to
the API emulator, SQLite and PostgreSQL): the breaker's denominator is the rule's pool, every
quarantine has a way out, validation counts only observed clear time, and a sticky gauge's old
value does not re-open a repaired node."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from healer.config import Settings
from healer.controller import RemediationResult
from healer.metrics import HealerMetrics
from healer.model.findings import Finding, TickFindings
from healer.model.states import FindingState, NodeState, TicketStatus
from healer.ruleset.schema import Rule, RuleGroup, RuleSet
from healer.store.models import Incident, Ticket
from healer.store.session import transaction
from healer.tickets import service as tickets_service
from healer.tickets.payloads import build_context
from healer_dev.k8s_emulator import node, pod, pod_disruption_budget
from healer_dev.remediation_harness import HOLD, POOL_LABEL, T0, Harness, fleet_nodes, hot, tick
from tests.integration.test_api_support import build_app, http_client
from tests.integration.test_remediation import harness
from tests.k8s_emulator import emulator, k8s_api, k8s_settings

__all__ = ["emulator", "harness", "k8s_api", "k8s_settings"]

RULES = RuleSet(
    groups=(
        RuleGroup(
            name="gpu",
            rules=[
                Rule(
                    name="GpuTooHot",
                    expr="max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP) > 78",
                    actions=[
                        "quarantine",
                        {"drain": {"timeout": "10m", "delete_emptydir_data": True}},
                        {"ticket": {"provider": "acme"}},
                    ],
                ),
                Rule(name="GpuSlow", expr="x > 0", actions=["quarantine"]),  # quarantine only
                Rule(
                    name="GpuFatalXid",
                    expr="DCGM_FI_DEV_XID_ERRORS == 79 or DCGM_FI_DEV_XID_ERRORS == 48",
                    sticky=True,
                    actions=["quarantine", {"ticket": {"provider": "acme"}}],
                ),
            ],
        ),
    )
)


def run(h: Harness, findings: TickFindings, *, fleet: dict[str, str] | None = None) -> RemediationResult:
    return h.remediate(findings, rules=RULES, fleet=fleet if fleet is not None else h.actions.node_pools())


def drains(h: Harness, now: datetime) -> RemediationResult:
    return h.drains(now, rules=RULES)


def with_safety(h: Harness, **safety: Any) -> Harness:
    h.settings = Settings(
        kubernetes=h.settings.kubernetes, safety=h.settings.safety.model_copy(update=safety)
    )
    return h


def xid(name: str, value: float, *, at: datetime = T0) -> Finding:
    return Finding(
        rule="GpuFatalXid",
        series_key=f'GpuFatalXid{{Hostname="{name}",gpu="1"}}',
        node=name,
        gpu="1",
        state=FindingState.FIRING,
        severity="critical",
        value=value,
        unit="Xid code",
        labels={"Hostname": name, "gpu": "1"},
        active_since=at,
        fired_at=at,
    )


def tickets(h: Harness) -> list[Ticket]:
    with h.sessions() as s:
        return list(s.scalars(select(Ticket).order_by(Ticket.id)))


def resolve(h: Harness, ticket_id: int, at: datetime) -> None:
    with transaction(h.sessions) as s:
        tickets_service.apply_provider_status(s, ticket_id=ticket_id, status=TicketStatus.RESOLVED, now=at)


# --- 1. the breaker's and the budget's denominator --------------------------------------------------


def test_cpu_nodes_do_not_dilute_the_gpu_pool_breaker(harness: Harness) -> None:
    """15 of 20 GPU nodes bad in a 100-node cluster trips a 50 % breaker; API and page show 20."""
    harness.emu.load(
        [
            *fleet_nodes(20, pool="h100"),
            *(node(f"cpu-{i:02d}", gpus=0) for i in range(80)),  # no pool label, no GPU
        ]
    )
    with_safety(harness, breaker_nodes=50, breaker_percent=50, max_unhealthy=20, max_unhealthy_percent=100)
    fleet = harness.actions.node_pools()
    assert sum(1 for p in fleet.values() if p == "h100") == 20
    assert sum(1 for p in fleet.values() if p == "no-gpu") == 80

    result = run(harness, tick(T0, *(hot(f"gpu-{i:02d}") for i in range(15))), fleet=fleet)

    assert result.breaker_tripped and result.breaker is not None
    assert (result.breaker.pool, result.breaker.count, result.breaker.fleet_size) == ("h100", 15, 20)
    assert harness.cordoned() == []

    with http_client(build_app(harness.sessions, settings=harness.settings)) as client:
        status = client.get("/api/v1/status").json()
        page = client.get("/").text
    assert status["breaker"]["tripped"] is True
    scope = status["breaker_scope"]
    assert (scope["pool"], scope["pool_nodes"], scope["bad_nodes"]) == ("h100", 20, 15)
    assert "50% of one pool's nodes" in scope["rule"]
    budgets = {b["pool"]: b for b in status["budgets"]}
    assert (budgets["h100"]["nodes"], budgets["no-gpu"]["nodes"]) == (20, 80)
    assert budgets["h100"]["breaker_trips_at"] == 11  # more than 50 % of 20
    assert "15 bad of 20 node(s)" in page


def test_one_bad_node_of_four_never_trips_the_breaker(harness: Harness) -> None:
    """The floor: on a 4-node cluster one (or two) bad nodes are remediated, not a breaker trip."""
    harness.emu.load(fleet_nodes(4))
    with_safety(harness, max_unhealthy_percent=50)  # the budget: 2 of 4 at once

    first = run(harness, tick(T0, hot("gpu-00")))
    assert not first.breaker_tripped
    assert harness.cordoned() == ["gpu-00"]
    second = run(harness, tick(T0 + timedelta(seconds=30), hot("gpu-00"), hot("gpu-01")))
    assert not second.breaker_tripped
    assert harness.cordoned() == ["gpu-00", "gpu-01"]


# --- 2. every quarantine has a way out ----------------------------------------------------------------


def slow(name: str, at: datetime = T0) -> Finding:
    return Finding(
        rule="GpuSlow",
        series_key=f'GpuSlow{{Hostname="{name}"}}',
        node=name,
        gpu=None,
        state=FindingState.FIRING,
        severity="critical",
        value=1.0,
        unit=None,
        labels={"Hostname": name},
        active_since=at,
        fired_at=at,
    )


def test_quarantine_only_node_returns_after_the_recovery_hold(harness: Harness) -> None:
    harness.emu.load(fleet_nodes(20))
    run(harness, tick(T0, slow("gpu-03")))
    assert harness.state("gpu-03") == NodeState.AWAITING_REPAIR
    assert harness.cordoned() == ["gpu-03"]
    assert tickets(harness) == []

    run(harness, tick(T0 + timedelta(seconds=30), slow("gpu-03")))  # still firing: stays out
    assert harness.state("gpu-03") == NodeState.AWAITING_REPAIR

    t1 = T0 + timedelta(minutes=5)
    run(harness, tick(t1))  # clear: validating, the hold starts
    assert harness.state("gpu-03") == NodeState.VALIDATING
    run(harness, tick(t1 + timedelta(seconds=HOLD - 1)))
    assert harness.cordoned() == ["gpu-03"]
    run(harness, tick(t1 + timedelta(seconds=HOLD)))

    assert harness.state("gpu-03") == NodeState.HEALTHY
    assert harness.cordoned() == []
    assert [b for _, b in harness.path("gpu-03")][-3:] == ["awaiting_repair", "validating", "healthy"]


def blocked_by_pdb(h: Harness) -> None:
    h.emu.load(
        [
            *fleet_nodes(20),
            pod(
                "db-0", node_name="gpu-05", namespace="web", owner=("StatefulSet", "db"), labels={"app": "db"}
            ),
            pod_disruption_budget("db", namespace="web", match_labels={"app": "db"}, min_available=1),
        ]
    )


def test_blocked_drain_escalates_ticket_metric_and_dashboard_flag(harness: Harness) -> None:
    blocked_by_pdb(harness)
    run(harness, tick(T0, hot("gpu-05")))
    drains(harness, T0 + timedelta(minutes=1))
    assert harness.state("gpu-05") == NodeState.DRAINING
    assert tickets(harness) == []
    drains(harness, T0 + timedelta(minutes=11))
    assert harness.state("gpu-05") == NodeState.BLOCKED

    # The ticket goes out now, naming the pods and the budgets.
    [ticket] = tickets(harness)
    with harness.sessions() as s:
        row = s.get(Ticket, ticket.id)
        assert row is not None
        context = build_context(
            s, ticket=row, cluster="c", dashboard_url="http://h", idempotency_key="k", escalation={}
        )
    assert context["drain"] == {"blocked_pods": ["web/db-0"], "budgets": ["web/db"], "refused": {}}
    assert "drain blocked: pods web/db-0; PodDisruptionBudgets web/db" in context["summary"]

    metrics = HealerMetrics()
    metrics.register_database(harness.sessions)
    text = metrics.exposition().decode()
    assert "healer_drain_blocked_nodes 1.0" in text

    late = (
        T0
        + timedelta(minutes=11)
        + timedelta(seconds=harness.settings.safety.drain_blocked_alert_seconds + 1)
    )
    with http_client(build_app(harness.sessions, settings=harness.settings, clock=lambda: late)) as client:
        assert 'data-testid="drain-blocked-flag"' in client.get("/").text
        listed = {
            n["name"]: n for n in client.get("/api/v1/nodes", params={"unhealthy": True}).json()["items"]
        }
    assert listed["gpu-05"]["drain_blocked"] is True
    assert "web/db" in (listed["gpu-05"]["blocked_reason"] or "")
    with http_client(build_app(harness.sessions, settings=harness.settings, clock=lambda: T0)) as client:
        assert 'data-testid="drain-blocked-flag"' not in client.get("/").text  # not blocked long yet

    # The provider repairs it: validation, then back to service.
    resolve(harness, ticket.id, T0 + timedelta(hours=3))
    assert harness.state("gpu-05") == NodeState.BLOCKED  # the callback moves no node: one writer
    t2 = T0 + timedelta(hours=3, seconds=10)
    run(harness, tick(t2))
    assert harness.state("gpu-05") == NodeState.VALIDATING
    run(harness, tick(t2 + timedelta(seconds=HOLD)))
    assert harness.state("gpu-05") == NodeState.HEALTHY
    assert "healer_drain_blocked_nodes 0.0" in metrics.exposition().decode()


def test_two_pdbs_on_one_pod_block_at_once(harness: Harness) -> None:
    harness.emu.load(
        [
            *fleet_nodes(20),
            pod(
                "db-0", node_name="gpu-05", namespace="web", owner=("StatefulSet", "db"), labels={"app": "db"}
            ),
            pod_disruption_budget("db-a", namespace="web", match_labels={"app": "db"}, min_available=0),
            pod_disruption_budget("db-b", namespace="web", match_labels={"app": "db"}, min_available=0),
        ]
    )
    run(harness, tick(T0, hot("gpu-05")))
    drains(harness, T0 + timedelta(seconds=10))  # well before the 10 min deadline

    assert harness.state("gpu-05") == NodeState.BLOCKED
    drain_row = harness.actions_of("gpu-05", kind="drain")[-1]
    assert drain_row.status == "blocked"
    assert drain_row.detail["budgets"] == ["web/db-a", "web/db-b"]  # type: ignore[index]
    assert drain_row.detail["blocked_pods"] == ["web/db-0"]  # type: ignore[index]
    assert len(tickets(harness)) == 1


def test_429_without_a_budget_cause_is_rate_limiting_retried(harness: Harness) -> None:
    harness.emu.load(
        [*fleet_nodes(20), pod("web-0", node_name="gpu-05", namespace="web", owner=("ReplicaSet", "web-1"))]
    )
    run(harness, tick(T0, hot("gpu-05")))
    # Twice: the step retries a rate-limited eviction once after Retry-After, then leaves it.
    harness.emu.inject_error("POST", r"/pods/web-0/eviction$", 429, times=2)
    drains(harness, T0 + timedelta(seconds=10))
    assert harness.state("gpu-05") == NodeState.DRAINING
    row = harness.actions_of("gpu-05", kind="drain")[-1]
    assert not row.detail.get("budgets")  # type: ignore[union-attr]
    assert row.status != "blocked" and not row.detail.get("blocked_pods")  # type: ignore[union-attr]
    assert ("POST", "/api/v1/namespaces/web/pods/web-0/eviction") in harness.emu.requests

    drains(harness, T0 + timedelta(seconds=20))  # the next round goes through
    assert harness.state("gpu-05") == NodeState.AWAITING_REPAIR
    assert harness.emu.pods_on("gpu-05") == []


def test_notready_node_with_pods_terminating_forever_proceeds_to_the_ticket(harness: Harness) -> None:
    dead = node("gpu-05", labels={POOL_LABEL: "a100"})
    dead["status"]["conditions"][0].update(status="Unknown", reason="NodeStatusUnknown")
    stuck = pod("train-0", node_name="gpu-05", namespace="ml", owner=("Job", "train"))
    stuck["metadata"]["deletionTimestamp"] = (T0 - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    stuck["metadata"]["deletionGracePeriodSeconds"] = 30
    harness.emu.load([*fleet_nodes(20)[:5], *fleet_nodes(20)[6:], dead, stuck])

    run(harness, tick(T0, hot("gpu-05")))
    drains(harness, T0 + timedelta(minutes=1))
    assert harness.state("gpu-05") == NodeState.DRAINING  # terminating 2 min: still waited for

    drains(harness, T0 + timedelta(minutes=5))  # terminating past the 300 s grace limit: gone
    assert harness.state("gpu-05") == NodeState.AWAITING_REPAIR
    assert len(tickets(harness)) == 1
    assert harness.emu.pods_on("gpu-05") == ["ml/train-0"]  # never force-deleted


# --- 3. validation counts only observed clear time ----------------------------------------------------


def test_frozen_rules_during_validation_restart_the_hold(harness: Harness) -> None:
    harness.emu.load(fleet_nodes(20))
    run(harness, tick(T0, slow("gpu-02")))
    t1 = T0 + timedelta(minutes=5)
    run(harness, tick(t1))
    assert harness.state("gpu-02") == NodeState.VALIDATING

    # Prometheus down for 40 s: every rule frozen.
    outage = TickFindings(at=t1 + timedelta(seconds=100), frozen_rules=frozenset(r.name for r in RULES.rules))
    run(harness, outage)
    run(harness, tick(t1 + timedelta(seconds=140)))  # data back: the hold starts again here
    run(harness, tick(t1 + timedelta(seconds=HOLD)))
    assert harness.state("gpu-02") == NodeState.VALIDATING  # only 160 s observed since the outage
    assert harness.cordoned() == ["gpu-02"]
    run(harness, tick(t1 + timedelta(seconds=140 + HOLD)))
    assert harness.state("gpu-02") == NodeState.HEALTHY


# --- 4. sticky gauges ---------------------------------------------------------------------------------


def test_repaired_node_with_the_same_old_xid_stays_healthy_a_new_xid_reopens(harness: Harness) -> None:
    harness.emu.load(fleet_nodes(20))
    run(harness, tick(T0, xid("gpu-07", 79)))
    assert harness.state("gpu-07") == NodeState.AWAITING_REPAIR
    [ticket] = tickets(harness)

    t1 = T0 + timedelta(hours=1)
    resolve(harness, ticket.id, t1)
    assert harness.state("gpu-07") == NodeState.AWAITING_REPAIR  # the next reconcile moves it
    # The exporter still shows 79 (sticky gauge): old evidence, validation goes on.
    run(harness, tick(t1 + timedelta(seconds=10), xid("gpu-07", 79)))
    assert harness.state("gpu-07") == NodeState.VALIDATING
    run(harness, tick(t1 + timedelta(seconds=10 + HOLD), xid("gpu-07", 79)))
    assert harness.state("gpu-07") == NodeState.HEALTHY
    assert harness.cordoned() == []
    for minutes in (10, 20, 30):
        run(harness, tick(t1 + timedelta(minutes=minutes), xid("gpu-07", 79)))
    assert harness.state("gpu-07") == NodeState.HEALTHY
    assert len(tickets(harness)) == 1  # no second, escalated ticket

    # A new Xid (another value) re-opens the node.
    t2 = t1 + timedelta(minutes=40)
    run(harness, tick(t2, xid("gpu-07", 48, at=t2)))
    assert harness.state("gpu-07") == NodeState.AWAITING_REPAIR
    assert harness.cordoned() == ["gpu-07"]
    assert len(tickets(harness)) == 2
    with harness.sessions() as s:
        assert s.scalar(select(func.count()).select_from(Incident)) == 2


def test_sticky_value_forgotten_once_the_exporter_resets(harness: Harness) -> None:
    """After the exporter restarts (the series goes away), the same Xid code again is a new fault."""
    harness.emu.load(fleet_nodes(20))
    run(harness, tick(T0, xid("gpu-07", 79)))
    [ticket] = tickets(harness)
    t1 = T0 + timedelta(hours=1)
    resolve(harness, ticket.id, t1)
    run(harness, tick(t1 + timedelta(seconds=10), xid("gpu-07", 79)))
    run(harness, tick(t1 + timedelta(seconds=10 + HOLD), xid("gpu-07", 79)))
    assert harness.state("gpu-07") == NodeState.HEALTHY

    run(harness, tick(t1 + timedelta(minutes=30)))  # exporter restarted: no series
    t2 = t1 + timedelta(minutes=40)
    run(harness, tick(t2, xid("gpu-07", 79, at=t2)))
    assert harness.state("gpu-07") == NodeState.AWAITING_REPAIR
