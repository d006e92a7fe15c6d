"""The verdict (``api.verdict``): what fired, what healer did, what it waits for, what a person
should do, for every lifecycle state, from the lifecycle's own records."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from api.verdict import (
    NOTHING,
    Done,
    Evidence,
    Fleet,
    IncidentMemory,
    LadderFacts,
    Policy,
    Terms,
    TicketFacts,
    VerdictFacts,
    verdict,
)
from healer.model.states import NodeState

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
HOT = Evidence(
    rule="GpuTooHot",
    gpu="3",
    state="firing",
    value=85.5,
    unit="degrees C",
    active_since=NOW - timedelta(minutes=12),
    fired_at=NOW - timedelta(minutes=7),
)
TERMS = Terms(op=">", threshold=78.0, for_seconds=300.0, drains=True, tickets=("default",))
INCIDENT = IncidentMemory(
    id=7, opened_at=NOW - timedelta(minutes=12), rule="GpuTooHot", cordoned_by_healer=True
)
HELD = (Done("cordon", "succeeded"), Done("taint", "succeeded"))
TICKET = TicketFacts(
    id=3,
    provider="default",
    status="acknowledged",
    created_at=NOW - timedelta(hours=2),
    external_id="RMA-42",
    acknowledged_at=NOW - timedelta(hours=1),
)


def facts(state: NodeState, **kw: object) -> VerdictFacts:
    base: dict[str, object] = {
        "node": "gpu-node-07",
        "state": str(state),
        "state_since": NOW - timedelta(minutes=5),
        "incident": INCIDENT,
        "evidence": HOT,
        "terms": TERMS,
        "actions": HELD,
    }
    return VerdictFacts(**{**base, **kw})  # type: ignore[arg-type]


def test_every_state_has_a_verdict() -> None:
    for state in NodeState:
        v = verdict(facts(state), now=NOW)
        assert v.fired and v.did and v.waiting_for and v.human, state
        assert v.line.startswith("Fired: ") and "You: " in v.line


def test_healthy_node_nothing_to_do() -> None:
    v = verdict(facts(NodeState.HEALTHY, incident=None, evidence=None, actions=()), now=NOW)
    assert (v.fired, v.did, v.waiting_for, v.human, v.needs_human) == (
        "nothing",
        "nothing yet",
        "nothing",
        "nothing",
        False,
    )


def test_suspect_names_the_value_the_threshold_and_when_it_acts() -> None:
    pending = replace(HOT, state="pending", value=79.0, active_since=NOW - timedelta(seconds=20))
    fresh = replace(INCIDENT, cordoned_by_healer=False)
    v = verdict(facts(NodeState.SUSPECT, incident=fresh, evidence=pending, actions=()), now=NOW)
    assert (
        v.fired == "GpuTooHot on GPU 3: 79 degrees C (threshold > 78), pending for 20s of the 5m it must hold"
    )
    assert v.did == "nothing yet"
    assert v.waiting_for == "the finding to hold until 2026-03-01 12:04:40Z (acts then) or to clear"
    assert v.human == NOTHING and not v.needs_human
    assert (v.rule, v.gpu, v.value, v.unit, v.threshold, v.held_seconds) == (
        "GpuTooHot",
        "3",
        79.0,
        "degrees C",
        "> 78",
        20.0,
    )


def test_quarantined_waits_for_the_drain() -> None:
    v = verdict(facts(NodeState.QUARANTINED), now=NOW)
    assert v.fired == "GpuTooHot on GPU 3: 85.5 degrees C (threshold > 78), firing for 12m 0s"
    assert v.did == "cordoned, tainted"
    assert v.waiting_for == "the drain to start at the next tick"
    assert v.human == NOTHING


def test_tainted_only_is_named_so() -> None:
    inc = replace(INCIDENT, cordoned_by_healer=False)
    v = verdict(
        facts(
            NodeState.QUARANTINED, incident=inc, shown_state="tainted", actions=(Done("taint", "succeeded"),)
        ),
        now=NOW,
    )
    assert v.did == "tainted"


def test_draining_waits_for_the_drain_under_its_budgets_with_its_deadline() -> None:
    inc = replace(INCIDENT, drain_started_at=NOW - timedelta(minutes=4), drain_timeout_seconds=3600.0)
    running = Done("drain", "running", {"remaining": ["web/db-0", "web/db-1"]})
    v = verdict(facts(NodeState.DRAINING, incident=inc, actions=(*HELD, running)), now=NOW)
    assert v.did == "cordoned, tainted, draining, 2 pod(s) left"
    assert v.waiting_for == (
        "the drain to finish (PodDisruptionBudgets allowing); blocked if pods remain at 2026-03-01 12:56:00Z"
    )
    assert v.human == NOTHING


def test_awaiting_repair_waits_for_the_providers_ticket() -> None:
    drained = (*HELD, Done("drain", "succeeded"))
    v = verdict(facts(NodeState.AWAITING_REPAIR, actions=drained, ticket=TICKET), now=NOW)
    assert v.did == "cordoned, tainted, drained, asked default for a repair (ticket RMA-42, acknowledged)"
    assert v.waiting_for == "the repair on default's ticket RMA-42 (acknowledged 1h 0m ago)"
    assert v.human == NOTHING and not v.needs_human


def test_awaiting_repair_too_long_says_chase_the_ticket() -> None:
    old = facts(NodeState.AWAITING_REPAIR, ticket=TICKET, state_since=NOW - timedelta(hours=30))
    v = verdict(old, now=NOW, policy=Policy(awaiting_repair_attention_seconds=24 * 3600))
    assert v.needs_human and v.human == "chase the ticket: awaiting repair over 1d 0h"


@pytest.mark.parametrize("status", ["rejected", "failed", "needs_info"])
def test_a_ticket_that_came_back_needs_a_person(status: str) -> None:
    v = verdict(facts(NodeState.AWAITING_REPAIR, ticket=replace(TICKET, status=status)), now=NOW)
    assert v.needs_human


def test_awaiting_the_node_agents_reset_names_the_escalation_time() -> None:
    ladder = LadderFacts(
        kinds=("reset-gpu", "ticket"),
        timeouts=(600.0, 86400.0),
        index=0,
        started_at=NOW - timedelta(minutes=1),
    )
    inc = replace(INCIDENT, ladder=ladder)
    v = verdict(facts(NodeState.AWAITING_REPAIR, incident=inc), now=NOW)
    assert v.waiting_for == (
        "the node agent's reset-gpu (step 1/2), escalating at 2026-03-01 12:09:00Z if it does not help"
    )
    assert v.human == NOTHING


def test_an_exhausted_ladder_needs_a_person() -> None:
    inc = replace(INCIDENT, ladder=LadderFacts(kinds=("reset-gpu",), timeouts=(600.0,), index=1))
    v = verdict(facts(NodeState.AWAITING_REPAIR, incident=inc), now=NOW)
    assert v.needs_human and "exhausted" in v.waiting_for


def test_awaiting_repair_without_a_ticket_waits_for_the_findings_to_clear() -> None:
    v = verdict(facts(NodeState.AWAITING_REPAIR), now=NOW)
    assert v.waiting_for == "its findings to clear (no repair was asked for), then the recovery hold"


def test_repaired_goes_on_to_validation() -> None:
    resolved = replace(TICKET, status="resolved")
    v = verdict(facts(NodeState.REPAIRED, ticket=resolved), now=NOW)
    assert v.waiting_for == "the next tick: validation starts"


def test_validating_keeps_the_rule_and_says_when_the_node_is_back() -> None:
    cleared = replace(HOT, state="resolved", resolved_at=NOW - timedelta(minutes=3))
    inc = replace(INCIDENT, clear_since=NOW - timedelta(minutes=2))
    v = verdict(facts(NodeState.VALIDATING, evidence=cleared, incident=inc), now=NOW, policy=Policy(300.0))
    assert v.rule == "GpuTooHot"
    assert v.fired == "GpuTooHot on GPU 3: 85.5 degrees C (threshold > 78), cleared 3m 0s ago after 9m 0s"
    assert v.waiting_for == "the recovery hold (5m, clear since 2026-03-01 11:58:00Z)"
    assert v.expected_back == NOW + timedelta(minutes=3)
    assert "back by 2026-03-01 12:03:00Z" in v.line
    assert v.human == NOTHING


def test_validating_before_the_hold_starts_and_with_a_job() -> None:
    v = verdict(facts(NodeState.VALIDATING), now=NOW)
    assert v.waiting_for.startswith("its rules to stay clear for the recovery hold")
    assert v.expected_back is None
    job = replace(INCIDENT, validation={"job": "healer-validate-7-1", "status": "running"})
    v = verdict(facts(NodeState.VALIDATING, incident=job), now=NOW, policy=Policy(validation_job=True))
    assert v.waiting_for.startswith("validation Job healer-validate-7-1 to pass")


def test_blocked_by_the_budget_waits_for_room() -> None:
    v = verdict(
        facts(
            NodeState.BLOCKED,
            incident=None,
            actions=(),
            blocked_reason="budget: 2 of 2 nodes of pool a100 out",
        ),
        now=NOW,
    )
    assert v.waiting_for == "room in its pool's budget (budget: 2 of 2 nodes of pool a100 out)"
    assert not v.needs_human


def test_a_breaker_trip_needs_a_person() -> None:
    fleet = Fleet(
        breaker_tripped=True,
        breaker_reason="6 nodes went bad in 300s",
        breaker_held=frozenset({"gpu-node-07"}),
    )
    v = verdict(facts(NodeState.BLOCKED, fleet=fleet, blocked_reason="breaker: tripped"), now=NOW)
    assert v.waiting_for == "a person to reset the circuit breaker"
    assert v.needs_human and "6 nodes went bad in 300s" in v.human


def test_a_blocked_drain_names_the_pods() -> None:
    reason = "drain blocked past its deadline: pods web/db-0; PodDisruptionBudgets web/db"
    inc = replace(INCIDENT, blocked_step="drain", blocked_reason=reason)
    blocked = Done("drain", "blocked")
    v = verdict(facts(NodeState.BLOCKED, incident=inc, actions=(*HELD, blocked), ticket=TICKET), now=NOW)
    assert "drain blocked" in v.did
    assert v.waiting_for == f"its pods to leave and the provider's ticket: {reason}"
    assert v.needs_human


def test_a_node_a_human_holds() -> None:
    v = verdict(facts(NodeState.RELEASED, actions=(*HELD, Done("release", "succeeded"))), now=NOW)
    assert v.human == "a person holds this node: healer changes nothing on it"
    assert v.needs_human
    assert "let go of the node" in v.did


def test_unknown_node_asks_to_look_at_the_exporters() -> None:
    v = verdict(facts(NodeState.UNKNOWN, incident=None, evidence=None, actions=()), now=NOW)
    assert v.fired == "no data: its exporters are down or stale"
    assert v.waiting_for == "data to come back"
    assert v.needs_human


def test_paused_healer_says_resume() -> None:
    v = verdict(facts(NodeState.SUSPECT, fleet=Fleet(paused=True, pause_reason="upgrade")), now=NOW)
    assert v.waiting_for == "healer to be resumed: it is paused (upgrade)"
    assert v.needs_human


def test_an_operators_release_waits_for_the_next_tick() -> None:
    inc = replace(INCIDENT, release_requested={"actor": "alice", "reason": "reseated"})
    v = verdict(facts(NodeState.QUARANTINED, incident=inc), now=NOW)
    assert v.waiting_for == "the next tick to act on alice's release (then validation)"


def test_dry_run_says_what_it_would_have_done() -> None:
    v = verdict(
        facts(
            NodeState.QUARANTINED,
            incident=replace(INCIDENT, cordoned_by_healer=False),
            actions=(Done("cordon", "dry_run"),),
        ),
        now=NOW,
    )
    assert v.did == "would have cordoned (dry-run)"


def test_without_the_rule_no_threshold_is_made_up() -> None:
    v = verdict(facts(NodeState.QUARANTINED, terms=None), now=NOW)
    assert v.threshold is None
    assert v.fired == "GpuTooHot on GPU 3: 85.5 degrees C, firing for 12m 0s"
