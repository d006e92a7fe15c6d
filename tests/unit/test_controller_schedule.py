"""Rule groups are evaluated at their own intervals: which groups are due at a tick."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from healer.controller import due_groups, scheduled_tick_time, tick_seconds
from healer.ruleset.schema import Rule, RuleGroup

T0 = datetime(2026, 5, 1, tzinfo=UTC)
RULE = Rule.model_validate({"name": "R", "expr": "up"})


def group(name: str, interval: float | None) -> RuleGroup:
    return RuleGroup(name=name, interval=interval, rules=[RULE.model_copy(update={"name": f"{name}-r"})])


FAST, SLOW, DEFAULT = group("fast", 10), group("slow", 60), group("default", None)
GROUPS = [FAST, SLOW, DEFAULT]


@pytest.mark.parametrize(
    ("last", "at", "expected"),
    [
        ({}, 0, {"fast", "slow", "default"}),
        ({"fast": 0, "slow": 0, "default": 0}, 10, {"fast"}),
        ({"fast": 10, "slow": 0, "default": 0}, 20, {"fast"}),
        ({"fast": 20, "slow": 0, "default": 0}, 30, {"fast", "default"}),
        ({"fast": 50, "slow": 0, "default": 30}, 60, {"fast", "default", "slow"}),
        # A tick a little early (scheduler jitter) still counts: half a tick of slack.
        ({"fast": 0, "slow": 0, "default": 0}, 9.2, {"fast"}),
        ({"fast": 0, "slow": 0, "default": 0}, 4.0, set()),
    ],
)
def test_due_groups(last: dict[str, float], at: float, expected: set[str]) -> None:
    last_at = {name: T0 + timedelta(seconds=s) for name, s in last.items()}
    now = T0 + timedelta(seconds=at)
    assert due_groups(GROUPS, last_at, now, default_interval=30, tick_seconds=10) == expected


def test_tick_is_the_shortest_interval() -> None:
    assert tick_seconds(GROUPS, 30) == 10
    assert tick_seconds([DEFAULT], 30) == 30
    assert tick_seconds([], 30) == 30
    # A group of recording rules only (a Prometheus rule file, alerts mode) is Prometheus's to run.
    records = RuleGroup.model_validate(
        {"name": "rec", "interval": 1, "records": [{"record": "a:b", "expr": "up"}], "rules": []}
    )
    assert tick_seconds([*GROUPS, records], 30) == 10


# --- the tick's evaluation time is its scheduled time ---------------------------------------------


@pytest.mark.parametrize(
    ("read", "expected"),
    [
        (0.0, 0.0),
        (0.0004, 0.0),  # the clock read a little after the schedule
        (29.9997, 30.0),  # ... or a little before it (a scheduler waking early)
        (30.0003, 30.0),
        (59.99999, 60.0),
        (75.0, 60.0),  # a late tick (a long previous tick): the period it runs in
        (-0.2, 0.0),  # before the first period: the origin
    ],
)
def test_scheduled_tick_time_is_on_the_period_grid(read: float, expected: float) -> None:
    assert scheduled_tick_time(T0, 30.0, T0 + timedelta(seconds=read)) == T0 + timedelta(seconds=expected)


def test_consecutive_scheduled_ticks_are_exactly_one_period_apart_despite_jitter() -> None:
    reads = [0.00041, 30.00002, 59.9999, 90.0008, 120.0]
    times = [scheduled_tick_time(T0, 30.0, T0 + timedelta(seconds=r)) for r in reads]
    assert [(b - a).total_seconds() for a, b in pairwise(times)] == [30.0] * 4
