"""Rule groups are evaluated at their own intervals: which groups are due at a tick."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from healer.controller import due_groups, tick_seconds
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
