"""Sticky gauges: the value seen at repair time is old evidence; a new value is a new fault."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from healer.engine import sticky
from healer.model.findings import Finding, TickFindings
from healer.model.states import FindingState

NOW = datetime(2025, 3, 4, 12, 0, tzinfo=UTC)
STICKY = frozenset({"GpuFatalXid"})


def xid(value: float, *, rule: str = "GpuFatalXid", gpu: str = "0") -> Finding:
    return Finding(
        rule=rule,
        series_key=f'{rule}{{Hostname="n1",gpu="{gpu}"}}',
        node="n1",
        gpu=gpu,
        state=FindingState.FIRING,
        severity="critical",
        value=value,
        unit="Xid code",
        fired_at=NOW,
    )


def test_the_old_value_is_discounted_a_new_one_is_not() -> None:
    baseline = sticky.at_repair([xid(79)], STICKY)
    assert sticky.discount([xid(79)], baseline, STICKY) == ()
    assert sticky.discount([xid(48)], baseline, STICKY) == (xid(48),)
    assert sticky.discount([xid(79, gpu="1")], baseline, STICKY) == (xid(79, gpu="1"),)


def test_rules_not_marked_sticky_always_count() -> None:
    """A windowed count (GpuFatalXidRecent) is not sticky: the same value still fires."""
    recent = xid(2, rule="GpuFatalXidRecent")
    baseline = sticky.at_repair([xid(79), recent], STICKY)
    assert recent.series_key not in baseline
    assert sticky.discount([recent], {recent.series_key: 2.0}, STICKY) == (recent,)


def test_baseline_forgotten_when_the_series_stops_but_not_when_unseen() -> None:
    baseline = {xid(79).series_key: 79.0}
    assert sticky.prune(baseline, [xid(79)], frozen_rules=frozenset(), unknown=False) == baseline
    assert sticky.prune(baseline, [], frozen_rules=frozenset(), unknown=False) == {}
    assert sticky.prune(baseline, [], frozen_rules=frozenset({"GpuFatalXid"}), unknown=False) == baseline
    assert sticky.prune(baseline, [], frozen_rules=frozenset(), unknown=True) == baseline


def test_discount_tick_for_the_breaker() -> None:
    tick = TickFindings(at=NOW, firing={"n1": [xid(79)], "n2": [replace(xid(79), node="n2")]})
    out = sticky.discount_tick(tick, {"n1": {xid(79).series_key: 79.0}}, STICKY)
    assert set(out.firing) == {"n2"}
