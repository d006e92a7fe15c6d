"""Outcomes (healer.engine.outcomes): each closed incident judged from what happened, and the
rule's record (precision, false quarantines, GPU-hours, time to repair) counted by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from healer.engine import outcomes as oc
from healer.engine.outcomes import Outcome

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def h(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def story(
    *states: tuple[float, str],
    close: float = 10,
    reason: str | None = oc.RETURNED,
    rule: str = "GpuHot",
    pool: str = "h100",
    gpus: int = 8,
    **kw: object,
) -> oc.IncidentStory:
    return oc.IncidentStory(
        rule=rule,
        pool=pool,
        opened_at=T0,
        closed_at=h(close),
        close_reason=reason,
        steps=tuple(oc.Step(h(at), to) for at, to in states),
        gpus=gpus,
        **kw,  # type: ignore[arg-type]
    )


OUT = ((0, "suspect"), (1, "quarantined"), (2, "draining"), (3, "awaiting_repair"))


@pytest.mark.parametrize(
    ("s", "outcome", "basis"),
    [
        (story((0, "suspect"), (1, "healthy"), reason="cleared before any action"), None, "no_action"),
        (
            story((0, "suspect"), (1, "blocked"), (2, "healthy"), reason="cleared while blocked"),
            None,
            "no_action",
        ),
        (story(*OUT, reason="failed validation Job after repair"), Outcome.CONFIRMED, "validation_failed"),
        (
            story(*OUT, (4, "repaired"), (5, "validating"), resolutions=("replaced",)),
            Outcome.CONFIRMED,
            "part_replaced",
        ),
        (story(*OUT, (4, "repaired"), resolutions=("fault_found",)), Outcome.CONFIRMED, "fault_found"),
        (story(*OUT, repeat_part=True), Outcome.CONFIRMED, "repeat_part"),
        (
            story(*OUT, (4, "repaired"), resolutions=("no_fault_found",)),
            Outcome.NOT_CONFIRMED,
            "no_fault_found",
        ),
        (
            story(*OUT, (4, "released"), reason="findings cleared after a human took over"),
            Outcome.NOT_CONFIRMED,
            "released_by_human",
        ),
        (story(*OUT, (4, "repaired"), (5, "validating"), resolutions=(None,)), Outcome.CONFIRMED, "repaired"),
        (
            story((1, "quarantined"), (3, "validating"), validation="succeeded"),
            Outcome.NOT_CONFIRMED,
            "validation_passed",
        ),
        (
            story((1, "quarantined"), (2, "awaiting_repair"), (3, "validating")),
            Outcome.NOT_CONFIRMED,
            "recovered",
        ),
        (story(*OUT, (4, "unknown"), reason="node deleted"), None, "undetermined"),
        # A replaced part outweighs a human's later release; a failed validation outweighs a
        # provider's "no fault found".
        (story(*OUT, (4, "released"), resolutions=("replaced",)), Outcome.CONFIRMED, "part_replaced"),
        (
            story(*OUT, reason="failed validation after repair", resolutions=("no_fault_found",)),
            Outcome.CONFIRMED,
            "validation_failed",
        ),
    ],
)
def test_an_incident_is_judged_from_what_happened(
    s: oc.IncidentStory, outcome: Outcome | None, basis: str
) -> None:
    assert oc.judge(s) == oc.Judgement(outcome, basis)


def test_out_of_service_hours_count_only_out_states_and_a_blocked_drain() -> None:
    steps = [
        oc.Step(h(0), "suspect"),
        oc.Step(h(1), "quarantined"),  # out from 1
        oc.Step(h(2), "blocked"),  # a blocked drain: still out
        oc.Step(h(4), "draining"),
        oc.Step(h(5), "healthy"),  # back at 5: 4 h out
        oc.Step(h(6), "suspect"),
        oc.Step(h(7), "blocked"),  # a refused quarantine: not out
        oc.Step(h(8), "quarantined"),  # out from 8 to the end (10): 2 h
    ]
    assert oc.out_of_service_seconds(steps, until=h(10)) == 6 * 3600


def test_a_rules_record_by_hand() -> None:
    judged = [
        # GpuHot in pool h100: 2 confirmed, 1 not; in pool a100: 1 not; 1 no-action (not counted)
        story(
            *OUT, (4, "repaired"), (5, "validating"), close=6, resolutions=("replaced",)
        ),  # out 1..6: 5 h x 8
        story(*OUT, close=4, reason="failed validation Job after repair"),  # out 1..4: 3 h x 8
        story(*OUT, (4, "repaired"), (5, "validating"), close=7, resolutions=("no_fault_found",)),  # 6 h x 8
        story((1, "quarantined"), (2, "validating"), close=3, pool="a100", gpus=4),  # 2 h x 4, recovered
        story((0, "suspect"), close=1, reason="cleared before any action"),
        story(*OUT, close=2, rule="IbDown", reason="node deleted"),  # undetermined: 1 h x 8
    ]
    rules, pools = oc.records(oc.Judged(s, (j := oc.judge(s)).outcome, j.basis) for s in judged)
    gpu_hot, ib = rules
    assert (gpu_hot.rule, gpu_hot.decided, gpu_hot.confirmed, gpu_hot.false_quarantines) == (
        "GpuHot",
        4,
        2,
        2,
    )
    assert gpu_hot.precision == 0.5
    assert gpu_hot.gpu_hours == pytest.approx(5 * 8 + 3 * 8 + 6 * 8 + 2 * 4)
    assert gpu_hot.node_hours == pytest.approx(5 + 3 + 6 + 2)
    # Returned to service: 5 h, 6 h and 2 h after leaving service (the failed validation did not return).
    assert gpu_hot.median_time_to_repair_seconds == 5 * 3600
    assert gpu_hot.bases == {"part_replaced": 1, "validation_failed": 1, "no_fault_found": 1, "recovered": 1}
    assert (ib.decided, ib.undetermined, ib.precision, ib.gpu_hours) == (0, 1, None, 8.0)
    by_pool = {(r.rule, r.pool): r for r in pools}
    assert (by_pool["GpuHot", "h100"].confirmed, by_pool["GpuHot", "h100"].decided) == (2, 3)
    assert by_pool["GpuHot", "a100"].precision == 0.0


def test_an_operators_outcome_is_counted_as_set() -> None:
    s = story(*OUT, (4, "repaired"), resolutions=("no_fault_found",))
    (rec,), _ = oc.records([oc.Judged(s, Outcome.CONFIRMED, "operator")])
    assert (rec.confirmed, rec.not_confirmed, rec.bases) == (1, 0, {"operator": 1})


def shadow(
    opened: float, closed: float | None, *, node: str = "n1", would: tuple[str, ...] = ("cordon", "ticket")
) -> oc.ShadowDecision:
    return oc.ShadowDecision(
        1, "XidShadow", node, "h100", h(opened), None if closed is None else h(closed), would, 8
    )


def test_a_shadow_decision_takes_the_outcome_of_what_happened_to_its_node() -> None:
    confirmed = oc.NodeIncident(7, h(1), h(5), Outcome.CONFIRMED, "part_replaced")
    not_confirmed = oc.NodeIncident(8, h(1), h(5), Outcome.NOT_CONFIRMED, "no_fault_found")
    open_one = oc.NodeIncident(9, h(1), None, None, None)
    earlier = oc.NodeIncident(6, h(-5), h(-4), Outcome.CONFIRMED, "part_replaced")
    now = h(10)
    assert oc.judge_shadow(shadow(0, 2), [confirmed], now=now) == oc.Judgement(
        Outcome.CONFIRMED, "incident 7: part_replaced"
    )
    assert oc.judge_shadow(shadow(0, 2), [not_confirmed], now=now).outcome == Outcome.NOT_CONFIRMED
    assert oc.judge_shadow(shadow(0, 2), [open_one], now=now) == oc.Judgement(None, "pending")
    # Nothing else happened to the node: its findings cleared with no repair.
    assert oc.judge_shadow(shadow(0, 2), [earlier], now=now) == oc.Judgement(
        Outcome.NOT_CONFIRMED, "recovered"
    )
    assert oc.judge_shadow(shadow(0, None), [], now=now) == oc.Judgement(None, "pending")


def test_what_a_shadow_rule_would_have_done_by_hand() -> None:
    since, now = h(0), h(10)
    judged = [
        (shadow(-2, 2), oc.Judgement(Outcome.CONFIRMED, "incident 7: part_replaced")),  # 2 h in window
        (shadow(4, None, node="n2"), oc.Judgement(None, "pending")),  # 6 h so far
        (shadow(5, 6, would=("cordon",)), oc.Judgement(Outcome.NOT_CONFIRMED, "recovered")),  # 1 h
    ]
    (rec,) = oc.shadow_records(judged, since=since, now=now)
    assert (rec.decisions, rec.nodes, rec.tickets) == (3, {"n1", "n2"}, 2)
    assert rec.gpu_hours == pytest.approx((2 + 6 + 1) * 8)
    assert (rec.confirmed, rec.not_confirmed, rec.pending, rec.precision) == (1, 1, 1, 0.5)


def test_a_ticket_misses_its_targets_from_its_delivery() -> None:
    from healer.tickets.targets import Miss, missed

    def check(status: str, *, acked: datetime | None, now: datetime) -> list[Miss]:
        return missed(
            status=status,
            sent_at=h(0),
            acknowledged_at=acked,
            ack_within_seconds=3600,
            repair_within_seconds=4 * 3600,
            now=now,
        )

    assert check("sent", acked=None, now=h(0.5)) == []
    assert check("sent", acked=None, now=h(1)) == [Miss("ack", 3600, h(1))]
    assert check("acknowledged", acked=h(0.5), now=h(3)) == []
    assert check("in_progress", acked=h(0.5), now=h(5)) == [Miss("repair", 4 * 3600, h(4))]
    # Resolved, closed, or not delivered yet: no target runs.
    assert check("resolved", acked=h(0.5), now=h(9)) == []
    assert (
        missed(
            status="pending",
            sent_at=None,
            acknowledged_at=None,
            ack_within_seconds=1,
            repair_within_seconds=1,
            now=h(9),
        )
        == []
    )
