"""Safety: budget, circuit breaker, pause, maintenance windows, opt-out; time as a parameter."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from healer.engine.lifecycle import StepKind
from healer.engine.safety import (
    PoolUsage,
    Refusal,
    Request,
    SafetyState,
    breaker,
    in_window,
    judge,
)
from healer.model.limits import MaintenanceWindow, SafetyLimits

# A Tuesday.
NOW = datetime(2025, 3, 4, 12, 0, tzinfo=UTC)
LIMITS = SafetyLimits(max_unhealthy=2, max_unhealthy_percent=10, breaker_nodes=5, breaker_percent=20)


def state(**kw: object) -> SafetyState:
    kw.setdefault("pools", {"a100": PoolUsage(size=100, out=0)})
    return SafetyState(settings=kw.pop("settings", LIMITS), now=kw.pop("now", NOW), **kw)  # type: ignore[arg-type]


def req(kind: StepKind = StepKind.QUARANTINE, **kw: object) -> Request:
    return Request(node=str(kw.pop("node", "n1")), kind=kind, pool=str(kw.pop("pool", "a100")), **kw)  # type: ignore[arg-type]


WINDOW = MaintenanceWindow(pool="a100", days=("tue",), start="11:00", end="13:00")

CASES = [
    # (id, request, state, approved, reason, blocks)
    ("quarantine within budget", req(), state(), True, None, False),
    ("budget: absolute cap", req(), state(pools={"a100": PoolUsage(100, 2)}), False, Refusal.BUDGET, True),
    (
        "budget: percent cap is smaller (10% of 15 = 1)",
        req(),
        state(pools={"a100": PoolUsage(15, 1)}),
        False,
        Refusal.BUDGET,
        True,
    ),
    ("budget: 10% of 9 nodes rounds down to 0 (no floor)", req(),
     state(pools={"a100": PoolUsage(9, 0)}, settings=replace(LIMITS, budget_floor_nodes=0)), False,
     Refusal.BUDGET, True),
    ("budget floor: a pool of 9 may always take 1 out", req(), state(pools={"a100": PoolUsage(9, 0)}), True,
     None, False),
    ("budget floor: but never 2", req(), state(pools={"a100": PoolUsage(9, 1)}), False, Refusal.BUDGET, True),
    (
        "budget per pool: another pool's use does not count",
        req(pool="h100"),
        state(pools={"a100": PoolUsage(100, 2), "h100": PoolUsage(100, 0)}),
        True,
        None,
        False,
    ),
    (
        "budget: a node already out takes no new slot",
        req(already_out=True),
        state(pools={"a100": PoolUsage(100, 2)}),
        True,
        None,
        False,
    ),
    ("drain of a held node ignores the budget", req(StepKind.DRAIN), state(pools={"a100": PoolUsage(100, 9)}),
     True, None, False),
    ("breaker tripped holds a new quarantine", req(), state(breaker_tripped=True), False, Refusal.BREAKER,
     True),
    ("breaker lets a drain of a held node go on", req(StepKind.DRAIN), state(breaker_tripped=True), True,
     None, False),
    ("breaker lets return to service go on", req(StepKind.RELEASE), state(breaker_tripped=True), True, None,
     False),
    ("paused: no quarantine", req(), state(paused=True), False, Refusal.PAUSED, False),
    ("paused: no drain", req(StepKind.DRAIN), state(paused=True), False, Refusal.PAUSED, False),
    ("paused: no ticket", req(StepKind.TICKET), state(paused=True), False, Refusal.PAUSED, False),
    ("paused: recording goes on", req(StepKind.RECORD), state(paused=True), True, None, False),
    (
        "maintenance window of the pool: no quarantine",
        req(),
        state(settings=replace(LIMITS, maintenance_windows=(WINDOW,))),
        False,
        Refusal.MAINTENANCE,
        False,
    ),
    (
        "maintenance window of another pool: allowed",
        req(pool="h100"),
        state(settings=replace(LIMITS, maintenance_windows=(WINDOW,)),
              pools={"h100": PoolUsage(100, 0)}),
        True,
        None,
        False,
    ),
    ("opt-out: never touched", req(opted_out=True), state(), False, Refusal.OPT_OUT, False),
    ("opt-out: not even an Event", req(StepKind.NOTIFY, opted_out=True), state(), False, Refusal.OPT_OUT,
     False),
    ("opt-out: findings still recorded", req(StepKind.RECORD, opted_out=True), state(), True, None, False),
    ("burst node: never quarantined", req(burst_rule="overflow"), state(), False, Refusal.BURST_NODE, False),
    ("burst node: never drained", req(StepKind.DRAIN, burst_rule="overflow"), state(), False,
     Refusal.BURST_NODE, False),
    ("burst node: never ticketed", req(StepKind.TICKET, burst_rule="overflow"), state(), False,
     Refusal.BURST_NODE, False),
    ("burst node: findings still recorded", req(StepKind.RECORD, burst_rule="overflow"), state(), True, None,
     False),
    ("opt-out wins over everything", req(opted_out=True), state(paused=True, breaker_tripped=True), False,
     Refusal.OPT_OUT, False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("request_", "state_", "approved", "reason", "blocks"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_safety_table(
    request_: Request, state_: SafetyState, approved: bool, reason: Refusal | None, blocks: bool
) -> None:
    decision, _ = judge(request_, state_)
    assert (decision.approved, decision.reason, decision.blocks) == (approved, reason, blocks)
    assert decision.message


def test_budget_counts_approvals_in_flight() -> None:
    """Approved quarantines count against the pool within the same tick."""
    s = state(pools={"a100": PoolUsage(100, 1)})
    verdicts = []
    for i in range(4):
        decision, s = judge(req(node=f"n{i}"), s)
        verdicts.append(decision.reason)
    assert verdicts == [None, Refusal.BUDGET, Refusal.BUDGET, Refusal.BUDGET]
    assert s.pools["a100"].out == 2


def test_budget_message_names_pool_and_limits() -> None:
    decision, _ = judge(req(), state(pools={"a100": PoolUsage(100, 2)}))
    assert decision.message == (
        "pool a100: 2 of 100 node(s) out of service, budget 2 (max_unhealthy 2, 10% of the pool)"
    )


@pytest.mark.parametrize(
    ("window", "at", "inside"),
    [
        (MaintenanceWindow(start="11:00", end="13:00"), NOW, True),
        (MaintenanceWindow(start="11:00", end="12:00"), NOW, False),  # end is exclusive
        (MaintenanceWindow(start="12:00", end="13:00"), NOW, True),
        (MaintenanceWindow(days=("mon",), start="11:00", end="13:00"), NOW, False),
        # Overnight: Monday 22:00 → Tuesday 02:00 belongs to Monday.
        (MaintenanceWindow(days=("mon",), start="22:00", end="02:00"), NOW.replace(hour=1), True),
        (MaintenanceWindow(days=("mon",), start="22:00", end="02:00"), NOW.replace(hour=2), False),
        (MaintenanceWindow(days=("tue",), start="22:00", end="02:00"), NOW.replace(hour=1), False),
        (MaintenanceWindow(days=("tue",), start="22:00", end="02:00"), NOW.replace(hour=23), True),
        (
            MaintenanceWindow(days=("tue",), start="22:00", end="02:00"),
            NOW.replace(hour=21, minute=59),
            False,
        ),
        # Sunday night into Monday morning wraps the week.
        (
            MaintenanceWindow(days=("sun",), start="23:00", end="01:00"),
            datetime(2025, 3, 3, 0, 30, tzinfo=UTC),
            True,
        ),
        (MaintenanceWindow(start="06:00", end="06:00"), NOW, True),  # 24 hours from 06:00
    ],
)
def test_maintenance_windows(window: MaintenanceWindow, at: datetime, inside: bool) -> None:
    assert in_window(window, at) is inside


BREAKER_CASES = [
    # (id, nodes turned bad (minutes ago), fleet size, reset minutes ago, trips)
    ("5 nodes is not more than 5", [1, 1, 1, 1, 1], 1000, None, False),
    ("6 nodes within 5 minutes trips", [1, 1, 1, 2, 3, 4], 1000, None, True),
    ("6 nodes but one outside the window", [1, 1, 1, 2, 3, 6], 1000, None, False),
    ("more than 20% of a small fleet trips", [1, 1, 1], 10, None, True),
    ("20% exactly does not trip", [1, 1], 10, None, False),
    ("80 of 100 at once trips", [0] * 80, 100, None, True),
    ("nodes bad before a reset do not trip it again", [3] * 80, 100, 2, False),
    ("new ones after a reset do", [3] * 80 + [1] * 6, 100, 2, True),
]


@pytest.mark.parametrize(
    ("ago", "fleet", "reset", "trips"), [c[1:] for c in BREAKER_CASES], ids=[c[0] for c in BREAKER_CASES]
)
def test_breaker_table(ago: list[int], fleet: int, reset: int | None, trips: bool) -> None:
    bad = {f"n{i}": NOW - timedelta(minutes=m) for i, m in enumerate(ago)}
    verdict = breaker(
        turned_bad=bad,
        fleet_size=fleet,
        settings=LIMITS,
        now=NOW,
        reset_at=NOW - timedelta(minutes=reset) if reset is not None else None,
    )
    assert verdict.trip is trips
    if trips:
        assert "turned bad within 300 s" in verdict.reason


def test_breaker_reports_the_nodes() -> None:
    bad = {f"n{i}": NOW for i in range(7)}
    verdict = breaker(turned_bad=bad, fleet_size=100, settings=LIMITS, now=NOW)
    assert verdict.count == 7 and verdict.nodes == tuple(sorted(bad))
    assert verdict.reason == "7 node(s) (7% of 100) turned bad within 300 s; limit 5 node(s) or 20%"
