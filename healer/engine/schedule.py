"""When each rule group is evaluated: the tick period and the groups due at a tick.

Pure: shared by the controller's scheduler (:mod:`healer.controller.scheduler`) and the backtest
(:mod:`healer.backtesting`), so a replay evaluates each group at its own interval as the controller
does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from healer.ruleset.schema import RuleGroup


def due_groups(
    groups: Sequence[RuleGroup],
    last: Mapping[str, datetime],
    now: datetime,
    *,
    default_interval: float,
    tick_seconds: float,
) -> set[str]:
    """Names of the rule groups to evaluate at ``now``: never evaluated, or their ``interval``
    (seconds; ``default_interval`` when unset) has passed since ``last[name]``. Half a tick of
    slack keeps a group on its interval when ticks run a little early or late."""
    due = set()
    for group in groups:
        interval = group.interval or default_interval
        then = last.get(group.name)
        if then is None or (now - then).total_seconds() >= interval - tick_seconds / 2:
            due.add(group.name)
    return due


def tick_seconds(groups: Sequence[RuleGroup], default_interval: float) -> float:
    """The tick period: the shortest interval (seconds) of a group with alerting rules, so every
    group runs on time (recording rules are Prometheus's to evaluate)."""
    return min((g.interval or default_interval for g in groups if g.rules), default=default_interval)
